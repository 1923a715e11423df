"""The resolver's passes over whole columns: grouping rows, out-of-order lanes, nesting regions.

Each runs once per batch over arrays (no Python work per span): in the C extension ``_resolve``
with the GIL released, so the worker's resolution leaves the traced program's threads running; or,
where it is not built (no compiler) or ``CLTRACE_NATIVE=0``, in the pure-Python fallback below,
which gives the same results (``PATH`` says which runs).

- ``group(keys)``: rows grouped by their keys, groups in order of first appearance.
- ``first_fit(starts, ends, lane_ends)``: commands in start order, each on the first lane free at
  its start (an out-of-order queue's lanes).
- ``Extents().nest(...)``: regions widened to their children's device extents, kept per (parent,
  device track) from batch to batch until the parent is resolved.
- ``tail``: the native module's whole-batch tail (``Resolver._native_columns``; None in the fallback, whose
  reference is ``Resolver._columns``).
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple

import numpy as np

from .._native import choose, extension

LEAF, REGION, REGION_UNPLACED = 1, 2, 3  # ``nest``'s row kinds (0: neither)


class Impl(NamedTuple):
    """One implementation of the interface above."""
    group: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]
    first_fit: Callable[[np.ndarray, np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]
    Extents: Callable[[], Any]
    tail: Any = None


def _i64(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, np.int64)


# --- pure Python (numpy) -----------------------------------------------------------------------

def _python_group(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    keys = np.asarray(keys, np.int64)
    if keys.ndim == 1:
        keys = keys[None]
    n = keys.shape[1]
    if not n:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    code = np.zeros(n, np.int64)
    for row in keys:  # one code per distinct tuple: mixed radix over each key's distinct values
        u, inv = np.unique(row, return_inverse=True)
        code = code * len(u) + inv.reshape(-1)
    _, first, inv = np.unique(code, return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")
    rank = np.empty(len(order), np.int64)
    rank[order] = np.arange(len(order))
    return first[order].astype(np.int64), rank[inv.reshape(-1)]


def _python_first_fit(starts: np.ndarray, ends: np.ndarray, lane_ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    lanes = np.empty(len(starts), np.int64)
    last = lane_ends.tolist()
    for i, (s, e) in enumerate(zip(starts.tolist(), ends.tolist())):
        for j, end in enumerate(last):
            if end <= s:
                break
        else:
            j = len(last)
            last.append(0)
        last[j] = e
        lanes[i] = j
    return lanes, np.array(last, np.int64)


class PythonExtents:
    """parent id -> {device track: [min START, max END] of its resolved children, device time}."""

    def __init__(self) -> None:
        self._ext: dict[int, dict[int, list[int]]] = {}

    def __len__(self) -> int:
        return sum(map(len, self._ext.values()))

    def _merge(self, parent: int, track: int, lo: int, hi: int) -> None:
        cur = self._ext.setdefault(parent, {}).get(track)
        if cur is None:
            self._ext[parent][track] = [lo, hi]
        else:
            if lo < cur[0]:
                cur[0] = lo
            if hi > cur[1]:
                cur[1] = hi

    def nest(self, kind: np.ndarray, ids: np.ndarray, parent: np.ndarray, track: np.ndarray, off: np.ndarray,
             off_end: np.ndarray, raw_start: np.ndarray, raw_end: np.ndarray) -> None:
        """Widen the regions' ``raw_start``/``raw_end`` (in place) to their children's device extents."""
        rows = np.flatnonzero(kind == LEAF)
        if len(rows):  # leaves: one extent per (parent, track), gathered in one sorted pass
            p, tr = parent[rows], track[rows]
            ds, de = raw_start[rows] - off[rows], raw_end[rows] - off_end[rows]
            order = np.lexsort((tr, p))
            p, tr, ds, de = p[order], tr[order], ds[order], de[order]
            first = np.flatnonzero(np.r_[True, (p[1:] != p[:-1]) | (tr[1:] != tr[:-1])])
            lo, hi = np.minimum.reduceat(ds, first), np.maximum.reduceat(de, first)
            for args in zip(p[first].tolist(), tr[first].tolist(), lo.tolist(), hi.tolist()):
                self._merge(*args)
        regs = np.flatnonzero((kind == REGION) | (kind == REGION_UNPLACED))
        if not len(regs):
            return
        # Regions in record order (an inner region is recorded before the region around it).
        rs, re_ = raw_start[regs].tolist(), raw_end[regs].tolist()
        pop = self._ext.pop
        for j, (sid, k, t, o, oe, pp) in enumerate(zip(ids[regs].tolist(), kind[regs].tolist(), track[regs].tolist(),
                                                        off[regs].tolist(), off_end[regs].tolist(),
                                                        parent[regs].tolist())):
            mine = pop(sid, None)
            if pp and mine:  # its descendants on other tracks (on all, without a device span) count for its parent
                for t2, (lo, hi) in mine.items():
                    if k != REGION or t2 != t:
                        self._merge(pp, t2, lo, hi)
            if k != REGION:
                continue
            e = mine.get(t) if mine else None
            if e is not None:
                if e[0] + o < rs[j]:
                    rs[j] = e[0] + o
                if e[1] + oe > re_[j]:
                    re_[j] = e[1] + oe
            if pp:
                self._merge(pp, t, rs[j] - o, re_[j] - oe)
        raw_start[regs] = rs
        raw_end[regs] = re_


PYTHON = Impl(_python_group, _python_first_fit, PythonExtents)


# --- native: the C extension -------------------------------------------------------------------

def _load_native() -> Impl:
    _resolve = extension("resolve")

    def group(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        keys = _i64(keys)
        n = keys.shape[-1]
        first, inverse = np.empty(n, np.int64), np.empty(n, np.int64)
        m = _resolve.group(keys, 1 if keys.ndim == 1 else keys.shape[0], first, inverse)
        return first[:m], inverse

    def first_fit(starts: np.ndarray, ends: np.ndarray, lane_ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        n, used = len(starts), len(lane_ends)
        room = np.empty(used + n, np.int64)
        room[:used] = lane_ends
        lanes = np.empty(n, np.int64)
        used = _resolve.first_fit(_i64(starts), _i64(ends), room, used, lanes)
        return lanes, room[:used]

    class NativeExtents:
        """The C table, taking numpy columns as they come."""
        __slots__ = ("_x",)

        def __init__(self) -> None:
            self._x = _resolve.Extents()

        def __len__(self) -> int:
            return len(self._x)

        @property
        def table(self) -> Any:
            """The C table itself, which ``_resolve.finish`` reads and updates (``Resolver._native_columns``)."""
            return self._x

        def nest(self, kind: np.ndarray, ids: np.ndarray, parent: np.ndarray, track: np.ndarray, off: np.ndarray,
                 off_end: np.ndarray, raw_start: np.ndarray, raw_end: np.ndarray) -> None:
            if raw_start.dtype != np.int64 or raw_end.dtype != np.int64 or not (
                    raw_start.flags.c_contiguous and raw_end.flags.c_contiguous):
                raise TypeError("nest: raw_start and raw_end must be contiguous int64 arrays (updated in place)")
            self._x.nest(_i64(kind), _i64(ids), _i64(parent), _i64(track), _i64(off), _i64(off_end),
                         raw_start, raw_end)

    return Impl(group, first_fit, NativeExtents, _resolve)


_CHOICE = choose("the resolver's passes", _load_native)
NATIVE: Impl | None = _CHOICE.native
PATH: str = _CHOICE.path
DETAIL: str = _CHOICE.detail
ACTIVE: Impl = NATIVE or PYTHON

__all__ = ["Impl", "PYTHON", "NATIVE", "ACTIVE", "PATH", "DETAIL", "LEAF", "REGION", "REGION_UNPLACED"]
