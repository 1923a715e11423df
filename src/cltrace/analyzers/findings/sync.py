"""Blocking calls on the hot loop: the host waits for the device again and again."""
from __future__ import annotations

import numpy as np

from ..text import fmt_ns, plural
from .base import Context, Finding, instance, worst

HOT_CALLS = 5  # the same blocking call from the same place this many times is a loop
WAIT_RATIO = 10.0  # host time at least this many times the call's own device time
WALL_SHARE = 0.05  # and the waits add up to this share of the run


def blocking_in_loop(ctx: Context) -> Finding | None:
    """Blocking transfers, finish and waits repeated in a loop, where the host mostly waits."""
    td = ctx.td
    idx = np.flatnonzero(td.blocking())
    if not len(idx):
        return None
    host = (td.host_end[idx] - td.host_begin[idx]).astype(np.int64)
    dev = np.where(td.on_device[idx], td.dev_end[idx] - td.dev_start[idx], 0)
    groups: dict[tuple, list[int]] = {}
    for k, i in enumerate(idx.tolist()):
        groups.setdefault((td.path_of(i)[:-1], td.names[td.name[i]]), []).append(k)
    hot = []
    for (where, name), ks in groups.items():
        h, d = host[ks].sum(), dev[ks].sum()
        if len(ks) >= HOT_CALLS and h >= WAIT_RATIO * d:
            hot.append((int(h - d), where, name, ks))
    wait = sum(h[0] for h in hot)
    if not hot or wait < WALL_SHARE * td.wall_ns:
        return None
    hot.sort(key=lambda x: -x[0])
    cost, where, name, ks = hot[0]
    ks = np.array(ks)
    inst = [instance(td, int(idx[ks[k]]), device_ns=int(dev[ks[k]])) for k in worst(host[ks] - dev[ks])]
    return Finding(
        "blocking-in-loop", "Blocking calls in the hot loop", wait,
        f"{name!r} in {'/'.join(where) or '(top level)'} blocked the host {plural(len(ks), 'time')}, "
        f"{fmt_ns(cost)} waiting ({100 * wait / td.wall_ns:.0f}% of the run) for "
        f"{fmt_ns(dev[ks].sum())} of its own device work",
        "Let the host run ahead: enqueue copies with is_blocking=False and wait on their events "
        "(or finish) once per several steps, only where the result is needed.",
        f"the same call >= {HOT_CALLS} times, host time >= {WAIT_RATIO:g}x its device time, "
        f"waits >= {WALL_SHARE:.0%} of the run",
        {"calls": [{"name": n, "path": "/".join(w), "count": len(k), "wait_ns": c} for c, w, n, k in hot]}, inst)
