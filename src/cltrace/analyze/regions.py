"""Region/kernel statistics per region path, exact, computed over columns (the analysis's tree).

Gives the same tree as ``Stats.as_dict()`` (which keeps a running reservoir for live
recorders), with exact percentiles, so the region report renders either.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from .kernels import percentiles, sort_within
from .model import TraceData


def _series(count: np.ndarray, vals: np.ndarray, group: np.ndarray, ng: int) -> list[dict[str, Any] | None]:
    total = np.bincount(group, vals, ng)
    v = vals[sort_within(vals, group)]
    starts = np.r_[0, np.cumsum(count)[:-1]]
    p50, p99 = percentiles(vals, group, ng, (0.5, 0.99))
    out: list[dict[str, Any] | None] = []
    for k in range(ng):
        n = int(count[k])
        if not n:
            out.append(None)
            continue
        out.append({"count": n, "total_ns": int(total[k]), "mean_ns": float(total[k] / n),
                    "min_ns": int(v[starts[k]]), "max_ns": int(v[starts[k] + n - 1]),
                    "p50_ns": float(p50[k]), "p99_ns": float(p99[k])})
    return out


def region_tree(td: TraceData) -> dict[str, Any]:
    """``{"a/b": {"name", "cat", "depth", "host", "device", "errors"}}`` over every span's path."""
    paths: dict[tuple[str, ...], int] = {}
    sp = td.spans
    group = np.fromiter((paths.setdefault(s.path or (s.name,), len(paths)) for s in sp), np.int64, len(sp))
    ng = len(paths)
    if not ng:
        return {}
    host = (td.host_end - td.host_begin).astype(np.float64)
    hcount = np.bincount(group, minlength=ng)
    hs = _series(hcount, host, group, ng)
    dev = td.on_device
    dg = group[dev]
    ds = _series(np.bincount(dg, minlength=ng), (td.dev_end[dev] - td.dev_start[dev]).astype(np.float64), dg, ng)
    errors = np.bincount(group, td.error.astype(np.float64), ng)
    first = np.full(ng, np.iinfo(np.int64).max)
    np.minimum.at(first, group, td.host_begin)
    first_idx = np.full(ng, len(sp))
    np.minimum.at(first_idx, group, np.arange(len(sp)))
    out: dict[str, Any] = {}
    for path, k in sorted(paths.items(), key=lambda kv: (len(kv[0]), first[kv[1]])):
        out["/".join(path)] = {"name": path[-1], "cat": sp[first_idx[k]].cat, "depth": len(path) - 1,
                               "host": hs[k], "device": ds[k], "errors": int(errors[k])}
    return out
