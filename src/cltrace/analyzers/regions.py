"""Region/kernel statistics per region path, exact, computed over columns (the analysis's tree).

Gives the same tree as ``Stats.as_dict()`` (which keeps a running reservoir for live
recorders), with exact percentiles, so the region report renders either.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from .kernels import percentiles, sort_within
from .model import TraceData, dense


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


def path_groups(td: TraceData) -> tuple[list[tuple[str, ...]], np.ndarray]:
    """(distinct region paths, each row's index among them); a span without a path is its name alone."""
    vals = td.path_values
    labels = list(vals) + [(nm,) for nm in td.names]
    code = td.path.astype(np.int64)
    empty = [k for k, v in enumerate(vals) if not v]
    if empty:
        code = np.where(np.isin(code, empty), len(vals) + td.name.astype(np.int64), code)
    present, group = dense(code)
    canon: dict[tuple[str, ...], int] = {}
    lut = np.array([canon.setdefault(labels[c], len(canon)) for c in present.tolist()], np.int64)
    return list(canon), lut[group] if len(group) else group


def region_tree(td: TraceData) -> dict[str, Any]:
    """``{"a/b": {"name", "cat", "depth", "host", "device", "errors"}}`` over every span's path."""
    paths, group = path_groups(td)
    ng = len(paths)
    if not ng:
        return {}
    n = len(group)
    host = (td.host_end - td.host_begin).astype(np.float64)
    hcount = np.bincount(group, minlength=ng)
    hs = _series(hcount, host, group, ng)
    dev = td.on_device
    dg = group[dev]
    ds = _series(np.bincount(dg, minlength=ng), (td.dev_end[dev] - td.dev_start[dev]).astype(np.float64), dg, ng)
    errors = np.bincount(group, td.error.astype(np.float64), ng)
    first = np.full(ng, np.iinfo(np.int64).max)
    np.minimum.at(first, group, td.host_begin)
    first_idx = np.full(ng, n)
    np.minimum.at(first_idx, group, np.arange(n))
    out: dict[str, Any] = {}
    for k in sorted(range(ng), key=lambda k: (len(paths[k]), first[k], first_idx[k])):
        path = paths[k]
        out["/".join(path)] = {"name": path[-1], "cat": td.cats[td.cat[first_idx[k]]], "depth": len(path) - 1,
                               "host": hs[k], "device": ds[k], "errors": int(errors[k])}
    return out
