"""The kernel table: which kernels take the device's time, from device stamps only.

Per device and kernel name (and, on request, launch shape or the user's call site that launched it):
count and total device time; ``self``, the kernel's share of its device's busy time when commands
overlap (equal to total on an in-order queue), so ``% device`` adds up to 100 over all commands of each
device; the first launch (driver JIT, cold caches) apart from the steady-state mean, p50 and p99 of the
launches after it.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from ..timeline.spans import KERNEL
from ..timeline.arrays import sorted_distinct as distinct
from .model import TraceData, dense

SORT_KEYS = ("total", "mean", "count", "p99")
GROUPS = ("name", "shape", "callsite")  # what the table's rows are: per name, name and shape, name and call site


@dataclass
class KernelRow:
    name: str
    shape: str | None  # "global [512, 64] local -" when grouped by launch shape
    count: int
    total_ns: int
    self_ns: int
    device_pct: float  # self time as a share of its device's busy time
    first_ns: int  # the first launch
    mean_ns: float  # steady state: launches after the first (the only one when count == 1)
    p50_ns: float
    p99_ns: float
    first_at_s: float  # where the first launch was enqueued: seconds since the trace's first span
    device: str = ""  # the device it ran on (its queue's device)
    site: str | None = None  # "file:line (function)" when grouped by call site ("-": none recorded)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def device_codes(td: TraceData, rows: np.ndarray) -> tuple[list[str], np.ndarray]:
    """(device names, each row's index among them) of rows on a queue, devices in name order."""
    names = sorted({q.device for q in td.queues.values()})
    tracks = np.array(sorted(td.queues), np.int64)
    code = np.array([names.index(td.queues[t].device) for t in tracks.tolist()] or [0], np.int64)
    at = np.minimum(np.searchsorted(tracks, td.track[rows]), max(len(tracks) - 1, 0))
    known = tracks[at] == td.track[rows] if len(tracks) else np.zeros(len(rows), bool)
    if not known.all():  # a track without a name: a device of its own
        names = names + ["?"]
        return names, np.where(known, code[at], len(names) - 1)
    return names, code[at]


def self_time(td: TraceData) -> np.ndarray:
    """Per span: its share of device busy time, dividing overlapped time among the commands
    running together on a device. Zero for spans not on a queue."""
    out = np.zeros(len(td.cat), np.float64)
    work = td.work
    devices: dict[str, list[int]] = {}
    for t, q in td.queues.items():
        devices.setdefault(q.device, []).append(t)
    for tracks in devices.values():
        idx = np.flatnonzero(work & np.isin(td.track, tracks))
        if not len(idx):
            continue
        s, e = td.dev_start[idx], td.dev_end[idx]
        b = distinct(np.r_[s, e])
        delta = np.bincount(np.searchsorted(b, s), minlength=len(b)) - np.bincount(np.searchsorted(b, e),
                                                                                   minlength=len(b))
        active = np.cumsum(delta)[:-1]
        w = np.where(active > 0, np.diff(b) / np.maximum(active, 1), 0.0)
        f = np.r_[0.0, np.cumsum(w)]
        out[idx] = f[np.searchsorted(b, e)] - f[np.searchsorted(b, s)]
    return out


def _shape(td: TraceData, i: int) -> str:
    g, loc = td.attr(i, "global_size"), td.attr(i, "local_size")
    fmt = (lambda v: "-" if v is None else "x".join(str(x) for x in v) if isinstance(v, (list, tuple)) else str(v))
    return f"global {fmt(g)} local {fmt(loc)}"


def _site(td: TraceData, i: int) -> str:
    site = td.span(i).site
    return "-" if site is None else str(site)


def _shape_groups(td: TraceData, idx: np.ndarray) -> tuple[np.ndarray, list[tuple[int, str | None]]]:
    """Each row's (name, launch shape) group and the groups' labels; a shape is worked out once per
    distinct attrs dict (launches of one configuration share theirs)."""
    attrs = td.attrs
    ident = np.fromiter((id(attrs[i]) for i in idx.tolist()), np.int64, len(idx))
    pairs, inverse = np.unique(np.stack([td.name[idx].astype(np.int64), ident]), axis=1, return_inverse=True)
    first = np.full(pairs.shape[1], len(idx))
    np.minimum.at(first, inverse.ravel(), np.arange(len(idx)))
    keys: dict[tuple[int, str], int] = {}
    code = np.array([keys.setdefault((int(td.name[idx[k]]), _shape(td, int(idx[k]))), len(keys))
                     for k in np.sort(first).tolist()], np.int64)
    # groups numbered in order of first launch, as the rows are met
    at = np.empty(pairs.shape[1], np.int64)
    at[np.argsort(first, kind="stable")] = np.arange(pairs.shape[1])
    return code[at[inverse.ravel()]], list(keys)


def sort_within(values: np.ndarray, group: np.ndarray) -> np.ndarray:
    """The order that sorts by group, then value: one argsort of a packed int64 key where the
    values are non-negative integers below 2**40 (18 minutes in ns), else a lexsort."""
    if len(values) and values.min() >= 0 and values.max() < 2**40 and group.max() < 2**22 \
            and np.array_equal(values, np.floor(values)):
        return np.argsort((group.astype(np.int64) << 40) | values.astype(np.int64), kind="stable")
    return np.lexsort((values, group))


def percentiles(values: np.ndarray, group: np.ndarray, ngroups: int, qs: tuple[float, ...]) -> list[np.ndarray]:
    order = sort_within(values, group)
    v = values[order]
    counts = np.bincount(group, minlength=ngroups)
    starts = np.r_[0, np.cumsum(counts)[:-1]]
    out = []
    for q in qs:
        k = (np.maximum(counts, 1) - 1) * q
        f = np.floor(k).astype(np.int64)
        c = np.minimum(f + 1, np.maximum(counts - 1, 0))
        lo = v[np.minimum(starts + f, len(v) - 1)] if len(v) else np.zeros(ngroups)
        hi = v[np.minimum(starts + c, len(v) - 1)] if len(v) else np.zeros(ngroups)
        out.append(np.where(counts > 0, lo + (hi - lo) * (k - f), np.nan))
    return out


def kernel_table(td: TraceData, self_ns: np.ndarray | None = None, by_shape: bool = False,
                 sort: str = "total", top: int | None = None, by: str | None = None) -> list[KernelRow]:
    """Rows of the kernel table, sorted by ``sort`` (one of ``SORT_KEYS``), the first ``top``; one row
    per kernel name, or per name and ``by`` (one of ``GROUPS``; ``by_shape`` is ``by="shape"``)."""
    if sort not in SORT_KEYS:
        raise ValueError(f"sort must be one of {', '.join(SORT_KEYS)}, not {sort!r}")
    by = by or ("shape" if by_shape else "name")
    if by not in GROUPS:
        raise ValueError(f"by must be one of {', '.join(GROUPS)}, not {by!r}")
    idx = np.flatnonzero(td.cat_mask(KERNEL) & td.on_device)
    if not len(idx):
        return []
    if self_ns is None:
        self_ns = self_time(td)
    work = np.flatnonzero(td.work)
    devices, work_dev = device_codes(td, work)
    busy = np.bincount(work_dev, weights=self_ns[work], minlength=len(devices))
    _, dev = device_codes(td, idx)
    if by == "shape":
        group, labels = _shape_groups(td, idx)
    elif by == "callsite":
        keys: dict[tuple[int, str], int] = {}
        group = np.fromiter((keys.setdefault((int(td.name[i]), _site(td, i)), len(keys)) for i in idx.tolist()),
                            np.int64, len(idx))
        labels = list(keys)
    else:
        codes, group = dense(td.name[idx])
        labels = [(int(c), None) for c in codes]
    # groups per (device, name[, shape])
    pair, group = dense(group * len(devices) + dev)
    ng = len(pair)
    gdev = pair % len(devices)
    labels = [labels[int(k)] for k in (pair // len(devices)).tolist()]
    dur = (td.dev_end[idx] - td.dev_start[idx]).astype(np.int64)
    start = td.dev_start[idx]
    counts = np.bincount(group, minlength=ng)
    total = np.bincount(group, weights=dur, minlength=ng)
    selfs = np.bincount(group, weights=self_ns[idx], minlength=ng)
    order = np.lexsort((start, group))
    first_pos = order[np.r_[0, np.cumsum(counts)[:-1]]]
    is_first = np.zeros(len(idx), bool)
    is_first[first_pos] = True
    steady = ~is_first | (counts[group] == 1)
    sg, sd = group[steady], dur[steady]
    mean = np.bincount(sg, weights=sd, minlength=ng) / np.maximum(np.bincount(sg, minlength=ng), 1)
    p50, p99 = percentiles(sd.astype(np.float64), sg, ng, (0.5, 0.99))
    shape = by == "shape"
    rows = [KernelRow(td.names[labels[k][0]], labels[k][1] if shape else None, int(counts[k]), int(total[k]),
                      int(round(selfs[k])),
                      round(float(100.0 * selfs[k] / busy[gdev[k]]), 3) if busy[gdev[k]] else 0.0,
                      int(dur[first_pos[k]]), float(mean[k]), float(p50[k]), float(p99[k]),
                      round(td.at(int(td.host_begin[idx[first_pos[k]]])), 6), devices[gdev[k]],
                      labels[k][1] if by == "callsite" else None)
            for k in range(ng)]
    key = {"total": lambda r: r.total_ns, "mean": lambda r: r.mean_ns, "count": lambda r: r.count,
           "p99": lambda r: r.p99_ns}[sort]
    rows.sort(key=lambda r: (-key(r), r.name, r.device))
    return rows[:top] if top else rows
