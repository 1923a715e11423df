"""Program builds that cost time where they should not: the same source built again and again,
and builds inside a timed (repeated) region."""
from __future__ import annotations

from collections import Counter

import numpy as np

from ...timeline.spans import COMPILE
from ..text import fmt_ns
from .base import Context, Finding, instance, worst

REBUILDS = 2  # the same source, options and device built this many times
TIMED_REGION_RUNS = 2  # a region that ran this often is a measured one
TIMED_BUILD_NS = 1_000_000  # builds inside it worth reporting, in all


def _builds(ctx: Context) -> np.ndarray:
    """Top-level builds that did work (a program cache hit in memory is not a build)."""
    td = ctx.td
    idx = np.flatnonzero(td.builds)
    keep = []
    build_ids = set(td.id[idx].tolist())
    compile_cat = td.cats.index(COMPILE) if COMPILE in td.cats else -1
    for i in idx.tolist():
        if int(td.parent[i]) not in build_ids and not (td.cat[i] == compile_cat and td.attr(i, "cache") == "memory"):
            keep.append(i)
    return np.array(keep, np.int64)


def rebuilt_programs(ctx: Context) -> Finding | None:
    """The same program source built more than once (per options and device)."""
    td = ctx.td
    groups: dict[tuple, list[int]] = {}
    for i in _builds(ctx):
        h = td.attr(i, "source_hash")
        if h is not None:
            groups.setdefault((h, td.attr(i, "options", ""), td.attr(i, "device", "")), []).append(int(i))
    repeated = {k: v for k, v in groups.items() if len(v) >= REBUILDS}
    if not repeated:
        return None
    cost = 0
    rows = []
    for key, ids in sorted(repeated.items(), key=lambda kv: -len(kv[1])):
        durs = np.array([td.host_end[i] - td.host_begin[i] for i in ids])
        cost += int(durs.sum() - durs[0])
        rows.append({"program": td.names[td.name[ids[0]]], "source_hash": key[0][:16], "builds": len(ids),
                     "total_ns": int(durs.sum()), "mean_ns": float(durs.mean())})
    top = rows[0]
    ids = np.array(max(repeated.values(), key=len))
    inst = [instance(td, int(ids[k])) for k in worst(td.host_end[ids] - td.host_begin[ids])]
    return Finding(
        "rebuilt-program", "Same program source built more than once", cost,
        f"{top['program']} was built {top['builds']} times ({fmt_ns(top['total_ns'])} in all, "
        f"{fmt_ns(top['mean_ns'])} each)" + (f"; {len(rows) - 1} more program(s) rebuilt" if len(rows) > 1 else ""),
        "Build each program once and keep it (or its kernels) for the run: cltrace.compile() caches "
        "programs in memory and on disk; with pyopencl, create cl.Program outside the loop.",
        f"a source built >= {REBUILDS} times with the same options on the same device",
        {"programs": rows}, inst)


def compile_in_timed_region(ctx: Context) -> Finding | None:
    """Builds inside a region that runs repeatedly: that run's time includes compiling."""
    td = ctx.td
    regions = np.flatnonzero(td.regions)
    region_runs = Counter(td.path[regions].tolist())
    by_id = dict(zip(td.id[regions].tolist(), regions.tolist()))
    parent = td.parent
    hits = [i for i in _builds(ctx).tolist() if int(parent[i]) in by_id
            and region_runs[int(td.path[by_id[int(parent[i])]])] >= TIMED_REGION_RUNS]
    if not hits:
        return None
    durs = np.array([td.host_end[i] - td.host_begin[i] for i in hits])
    if durs.sum() < TIMED_BUILD_NS:
        return None
    paths = Counter("/".join(td.path_of(by_id[int(parent[i])])) for i in hits)
    where, n = paths.most_common(1)[0]
    return Finding(
        "compile-in-timed-region", "Program builds inside a timed region", int(durs.sum()),
        f"{len(hits)} build(s) ({fmt_ns(durs.sum())}) ran inside repeated regions, most in {where} ({n})",
        "Build (and warm up) programs before the timed loop, so its regions measure the work alone.",
        f"builds >= {fmt_ns(TIMED_BUILD_NS)} in all inside a region that ran >= {TIMED_REGION_RUNS} times",
        {"builds": len(hits), "total_ns": int(durs.sum()), "regions": dict(paths)},
        [instance(td, hits[k]) for k in worst(durs)])
