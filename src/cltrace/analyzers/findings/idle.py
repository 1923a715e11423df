"""A device left idle: long gaps between commands, and regions whose device time is mostly idle."""
from __future__ import annotations

from collections import defaultdict

import numpy as np

from ..intervals import Coverage, intersect, union
from ..text import fmt_ns
from ...timeline.arrays import sorted_distinct as distinct
from ...timeline.spans import STEP
from ..model import TraceData
from .base import WORST, Context, Finding, instance

# A gap this long at least (Nsight Systems' gpu_gaps rule uses 500 ms; shorter here, but well above
# what a descheduled host thread on a loaded machine leaves), and this many times the queue's
# median command, long gaps adding up to this share of the run.
GAP_MIN_NS = 50_000_000
GAP_MEDIAN_FACTOR = 50
GAP_WALL_SHARE = 0.20
REGION_BUSY_SHARE = 0.30  # a region whose device bracket is busy less than this
REGION_RUNS = 3  # that ran at least this often
REGION_WALL_SHARE = 0.10  # and covers this share of the run


def untraced(td: TraceData) -> Coverage:
    """Where a scheduled session did not trace: from the end of a step to the start of the next traced
    one when steps between them were not traced (waited, warm-up, or the cycle's closing flush)."""
    steps = sorted((n, int(td.host_begin[i]), int(td.host_end[i])) for i in np.flatnonzero(td.cat_mask(STEP)).tolist()
                   if isinstance(n := td.attr(i, "step"), int))
    cut = [(a[2], b[1]) for a, b in zip(steps, steps[1:]) if b[0] > a[0] + 1 and b[1] > a[2]]
    return Coverage(np.array([c[0] for c in cut], np.int64), np.array([c[1] for c in cut], np.int64))


def long_idle_gaps(ctx: Context) -> Finding | None:
    td = ctx.td
    span = Coverage(*td.intervals)  # a gap counts inside the time analysed only (a window may have gaps)
    cut = untraced(td)
    off = Coverage(*intersect(cut.s, cut.e, *td.intervals))
    rows = []
    for q in ctx.queues:
        on = td.work & (td.track == q.track)
        median = float(np.median(td.dev_end[on] - td.dev_start[on])) if on.any() else 0.0
        length = span.within(q.gap_start, q.gap_end) - off.within(q.gap_start, q.gap_end)
        long_ = length >= max(GAP_MIN_NS, GAP_MEDIAN_FACTOR * median)
        for d, s in zip(length[long_].tolist(), q.gap_start[long_].tolist()):
            rows.append((d, s, q.name))
    total = sum(r[0] for r in rows)
    traced_ns = td.wall_ns - int(off.within(np.array([td.t0]), np.array([td.t1]))[0])
    if not rows or total < GAP_WALL_SHARE * traced_ns:
        return None
    rows.sort(key=lambda r: -r[0])
    inst = [{"name": f"idle {name}", "path": "", "at_s": round(td.at(s), 6), "ts_ns": s, "dur_ns": d}
            for d, s, name in rows[:WORST]]
    return Finding(
        "long-idle-gaps", "Long device idle gaps", total,
        f"{len(rows)} gaps of {fmt_ns(min(r[0] for r in rows))} or more between commands, "
        f"{fmt_ns(total)} in all ({100 * total / traced_ns:.0f}% of the traced run); the longest {fmt_ns(rows[0][0])}",
        "Find what the host did in each gap (the host track above it in Perfetto): move that work "
        "off the critical path, overlap it with device work, or enqueue the next work before it.",
        f"gaps >= max({fmt_ns(GAP_MIN_NS)}, {GAP_MEDIAN_FACTOR}x the queue's median command), "
        f">= {GAP_WALL_SHARE:.0%} of the run in all (a schedule's untraced steps not counted)",
        {"gaps": len(rows), "total_ns": total, "longest_ns": rows[0][0]}, inst)


def device_bracket(s: np.ndarray, e: np.ndarray, start: np.ndarray, end: np.ndarray, host_begin: np.ndarray,
                   host_end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The device time regions answer for, as two markers at their host entry and exit would have
    bracketed it: from where the queue could have started their work (their host entry, or the end of
    the queue's work before, whichever is later) to where it could have gone on after them (their host
    exit, or the start of the queue's next work, whichever is sooner), never narrower than their span.
    A projected region (from its first command to its last) thus shows the device waiting on the host
    inside it, as a marker-bracketed one does; on a queue the host runs ahead of, both are its span.
    ``s``/``e``: the queue's busy intervals, sorted and disjoint."""
    i = np.searchsorted(e, start, "right") - 1
    before = np.where(i >= 0, e[np.maximum(i, 0)] if len(e) else 0, np.iinfo(np.int64).min)
    j = np.searchsorted(s, end, "left")
    after = np.where(j < len(s), s[np.minimum(j, len(s) - 1)] if len(s) else 0, np.iinfo(np.int64).max)
    lo = np.minimum(start, np.maximum(host_begin, before))
    hi = np.maximum(end, np.minimum(host_end, after))
    return lo, hi


def idle_regions(ctx: Context) -> Finding | None:
    td = ctx.td
    reg = np.flatnonzero(td.regions & td.on_device)
    if not len(reg):
        return None
    busy = np.zeros(len(reg), np.int64)
    lo, hi = td.dev_start[reg].copy(), td.dev_end[reg].copy()
    work = td.work
    for t in distinct(td.track[reg]).tolist():
        on = work & (td.track == t)
        s, e, _ = union(td.dev_start[on], td.dev_end[on])
        m = np.flatnonzero(td.track[reg] == t)
        lo[m], hi[m] = device_bracket(s, e, td.dev_start[reg[m]], td.dev_end[reg[m]],
                                      td.host_begin[reg[m]], td.host_end[reg[m]])
        busy[m] = Coverage(s, e).within(lo[m], hi[m])
    bracket = hi - lo
    by_path: dict[tuple, list[int]] = defaultdict(list)
    for k, i in enumerate(reg.tolist()):
        by_path[td.path_of(i)].append(k)
    rows = []
    for path, ks in by_path.items():
        b, u = int(bracket[ks].sum()), int(busy[ks].sum())
        if len(ks) >= REGION_RUNS and b and u < REGION_BUSY_SHARE * b and b >= REGION_WALL_SHARE * td.wall_ns:
            rows.append({"path": "/".join(path), "runs": len(ks), "device_ns": b, "busy_ns": u,
                         "busy_pct": round(100 * u / b, 2), "idle_ns": b - u, "_ks": ks})
    if not rows:
        return None
    rows.sort(key=lambda r: -r["idle_ns"])
    top = rows[0]
    ks = np.array(top.pop("_ks"))
    for r in rows:
        r.pop("_ks", None)
    idle = bracket[ks] - busy[ks]
    inst = [instance(td, int(reg[ks[k]]), dur_ns=int(bracket[ks[k]]), busy_ns=int(busy[ks[k]]))
            for k in np.argsort(-idle, kind="stable")[:WORST]]
    return Finding(
        "idle-regions", "Regions whose device time is mostly idle", top["idle_ns"],
        f"{top['path']}: the device was busy {top['busy_pct']:.0f}% of its {fmt_ns(top['device_ns'])} "
        f"over {top['runs']} runs" + (f"; {len(rows) - 1} more region(s) alike" if len(rows) > 1 else ""),
        "The device waits on the host inside these regions: see the launch-bound and blocking findings, "
        "enqueue fewer, larger kernels, and keep host work out of the region.",
        f"busy < {REGION_BUSY_SHARE:.0%} of the region's device time, >= {REGION_RUNS} runs, "
        f">= {REGION_WALL_SHARE:.0%} of the run",
        {"regions": rows}, inst)
