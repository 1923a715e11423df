"""Launch-bound kernels: the host takes longer to enqueue them than the device to run them."""
from __future__ import annotations

import numpy as np

from ...timeline.spans import KERNEL
from ..text import fmt_ns
from .base import Context, Finding, instance, worst

MIN_LAUNCHES = 20
SHARE = 0.5  # launch-bound launches, of all launches
DEVICE_BUSY = 0.5  # while the device is busy less than this share of the time kernels span


def launch_bound(ctx: Context) -> Finding | None:
    td, la = ctx.td, ctx.launches
    if la.count < MIN_LAUNCHES or la.launch_bound < SHARE * la.count:
        return None
    idx = np.flatnonzero(td.cat_mask(KERNEL) & td.on_device)
    window = int(td.dev_end[idx].max() - td.host_begin[idx].min())
    busy = int(ctx.self_ns[idx].sum())
    if window and busy >= DEVICE_BUSY * window:
        return None
    enq = (td.host_end[idx] - td.host_begin[idx]).astype(np.int64)
    dev = (td.dev_end[idx] - td.dev_start[idx]).astype(np.int64)
    over = np.maximum(enq - dev, 0)
    rows = [r.as_dict() for r in la.rows if r.launch_bound]
    return Finding(
        "launch-bound", "Launch-bound kernels", int(over.sum()),
        f"{la.launch_bound} of {la.count} launches ({la.launch_bound_pct:.0f}%) ran shorter on the device than "
        f"their host enqueue (enqueue {fmt_ns(la.enqueue_ns / la.count)}, device {fmt_ns(la.device_ns / la.count)} "
        f"on average); kernels kept the device busy {100 * busy / window:.0f}% of the time they span",
        "Give each launch more work: fuse small kernels, batch steps, or launch fewer, larger ranges; "
        "keep Python work between launches small (reuse kernels and argument objects).",
        f">= {MIN_LAUNCHES} launches, >= {SHARE:.0%} launch-bound, device busy < {DEVICE_BUSY:.0%}",
        {"launches": la.count, "launch_bound": la.launch_bound, "device_busy_pct": round(100 * busy / window, 2),
         "kernels": rows[:10]},
        [instance(td, int(idx[k]), enqueue_ns=int(enq[k]), device_ns=int(dev[k])) for k in worst(over)])
