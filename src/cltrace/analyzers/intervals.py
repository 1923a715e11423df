"""Vectorised interval arithmetic on int64 nanosecond arrays: unions, coverage, gaps."""
from __future__ import annotations

import numpy as np


def union(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Disjoint sorted intervals covering the input, and for each the index (into the input)
    of the interval that opens it."""
    if not len(starts):
        e = np.empty(0, np.int64)
        return e, e, e
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], ends[order]
    reach = np.maximum.accumulate(e)
    new = np.ones(len(s), bool)
    new[1:] = s[1:] > reach[:-1]
    first = np.flatnonzero(new)
    last = np.r_[first[1:] - 1, len(s) - 1]
    return s[first], reach[last], order[first]


class Coverage:
    """How much of a set of disjoint sorted intervals lies before time t, for many t at once."""

    def __init__(self, starts: np.ndarray, ends: np.ndarray) -> None:
        self.s, self.e = starts, ends
        self.before = np.r_[0, np.cumsum(ends - starts)]  # covered length before interval i

    def upto(self, t: np.ndarray) -> np.ndarray:
        t = np.asarray(t, np.int64)
        if not len(self.s):
            return np.zeros(t.shape, np.int64)
        i = np.searchsorted(self.s, t, side="right")  # intervals starting at or before t
        prev = np.maximum(i - 1, 0)
        inside = np.clip(t - self.s[prev], 0, self.e[prev] - self.s[prev])
        return np.where(i > 0, self.before[prev] + inside, 0)

    def within(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Covered length inside each [a, b]."""
        return self.upto(b) - self.upto(a)


def intersect(a_s: np.ndarray, a_e: np.ndarray, b_s: np.ndarray, b_e: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The intersection of two sets of disjoint sorted intervals, as disjoint sorted intervals."""
    lo = np.searchsorted(b_e, a_s, side="right")  # the first b ending after each a starts
    hi = np.searchsorted(b_s, a_e, side="left")  # past the last b starting before each a ends
    counts = np.maximum(hi - lo, 0)
    n = int(counts.sum())
    if not n:
        e = np.empty(0, np.int64)
        return e, e
    ai = np.repeat(np.arange(len(a_s)), counts)
    bi = np.arange(n) - np.repeat(np.cumsum(counts) - counts, counts) + np.repeat(lo, counts)
    s, e = np.maximum(a_s[ai], b_s[bi]), np.minimum(a_e[ai], b_e[bi])
    keep = e > s
    return s[keep], e[keep]


def subtract(a_s: np.ndarray, a_e: np.ndarray, b_s: np.ndarray, b_e: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The parts of the disjoint sorted intervals ``a`` outside the disjoint sorted intervals ``b``."""
    lo, hi = np.iinfo(np.int64).min, np.iinfo(np.int64).max
    return intersect(a_s, a_e, np.r_[lo, b_e].astype(np.int64), np.r_[b_s, hi].astype(np.int64))


def holder(starts: np.ndarray, ends: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Each time's interval among the disjoint intervals ``[start, end)`` (sorted by start), -1 where none holds it."""
    if not len(starts):
        return np.full(len(t), -1, np.int64)
    at = np.searchsorted(starts, t, side="right") - 1
    return np.where((at >= 0) & (t < ends[np.maximum(at, 0)]), at, -1)


def holding(starts: np.ndarray, ends: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Whether each time lies in one of the disjoint sorted intervals ``[start, end)``."""
    return holder(starts, ends, t) >= 0
