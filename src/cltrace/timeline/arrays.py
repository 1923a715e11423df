"""Small numpy helpers on integer id columns, shared by the writers and the analyses (the bottom layer:
both import it). Each replaces a numpy call that is slow on id columns or costly on first use:
``np.unique`` builds a hash table (slow on int64; numpy >= 2.3 imports ``numpy.ma`` on its first call,
~15 ms and ~1700 objects for the cyclic GC inside the first trace of a process) and ``np.isin`` costs
~100 us a call."""
from __future__ import annotations

import numpy as np

_DENSE = 4096  # a range this much wider than the column still takes the lookup table


def _dense(col: np.ndarray) -> tuple[int, int] | None:
    """(min, max) of a non-empty column whose range is small enough for a lookup table, else None."""
    lo, hi = int(col.min()), int(col.max())
    return (lo, hi) if hi - lo <= 4 * len(col) + _DENSE else None


def values(col: np.ndarray) -> np.ndarray:
    """The distinct values of an integer column, ascending (``np.unique(col)``)."""
    if not len(col):
        return col[:0]
    span = _dense(col)
    if span is None:
        v = np.sort(col)
        keep = np.empty(len(v), bool)
        keep[0] = True
        np.not_equal(v[1:], v[:-1], out=keep[1:])
        return v[keep]
    lo, hi = span
    if lo == hi:
        return col[:1].copy()
    return np.flatnonzero(np.bincount(col - lo, minlength=hi - lo + 1)) + lo


def distinct(col: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct values of an integer column (ascending) and each row's index among them (int32)."""
    if len(col):
        span = _dense(col)
        if span is not None:
            lo, hi = span
            if lo == hi:
                return col[:1].astype(np.int64), np.zeros(len(col), np.int32)
            at = col - lo
            present = np.zeros(hi - lo + 1, np.int32)
            present[at] = 1
            code = np.cumsum(present, dtype=np.int32)
            code -= 1
            return np.flatnonzero(present) + lo, code[at]
    heads = np.flatnonzero(col[1:] != col[:-1]) + 1
    if 4 * len(heads) < len(col):  # long runs of one value (rows of one launcher): sort the runs only
        runs = np.concatenate(([0], heads))
        vals, _, inverse = unique(col[runs])
        return vals, np.repeat(inverse.astype(np.int32), np.diff(np.append(runs, len(col))))
    vals, _, inverse = unique(col)
    return vals, inverse.astype(np.int32)


def unique(col: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``np.unique(col, return_index=True, return_inverse=True)`` by one stable sort: numpy's own
    (2.x) is slow on a column of few distinct values, measured 64-650 us on 4096 rows (with and
    without ``return_index``) against ~40 for this."""
    order = np.argsort(col, kind="stable")
    ordered = col[order]
    starts = np.empty(len(col), bool)
    starts[:1] = True
    np.not_equal(ordered[1:], ordered[:-1], out=starts[1:])
    inverse = np.empty(len(col), np.int64)
    inverse[order] = np.cumsum(starts) - 1
    return ordered[starts], order[starts], inverse


def first_rows(inverse: np.ndarray, k: int) -> np.ndarray:
    """For each of k distinct values, the first row that has it."""
    first = np.full(k, len(inverse), np.int64)
    np.minimum.at(first, inverse, np.arange(len(inverse)))
    return first


def member(col: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """``np.isin(col, keys)`` for a few keys, by binary search (numpy's own costs ~100 us a call)."""
    if not len(keys) or not len(col):
        return np.zeros(len(col), bool)
    keys = np.sort(keys)
    at = np.minimum(np.searchsorted(keys, col), len(keys) - 1)
    return keys[at] == col


def sorted_distinct(values: np.ndarray) -> np.ndarray:
    """Sorted distinct values of any sortable column (``np.unique(values)`` by one sort, without its
    hash table or its first-call import)."""
    v = np.sort(values)
    return v[np.r_[True, v[1:] != v[:-1]]] if len(v) else v
