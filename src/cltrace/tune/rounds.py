"""Figures over device times: the interpolated quantile a ``Trial`` ranks by, and the per-round medians
of confirmation trials (their times are in round order) that the decision and the chart both use."""
from __future__ import annotations

import math
from typing import Sequence


def quantile(sorted_values: Sequence[float], q: float) -> float:
    """The ``q`` quantile of sorted values, interpolated linearly (numpy's default method)."""
    if not sorted_values:
        raise ValueError("quantile of no values")
    pos = (len(sorted_values) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def round_medians(ts: Sequence[int], runs: int) -> list[float]:
    """The median of each confirmation round's ``runs`` launches (a confirmation trial's times are in round order)."""
    return [quantile(sorted(ts[i:i + runs]), 0.5) for i in range(0, len(ts) - runs + 1, runs)]


def rounds_won(times_ns: Sequence[int], base_ns: Sequence[int], tolerance: float, runs: int) -> int:
    """Rounds in which a trial's median (``times_ns``) was more than ``tolerance`` below the default's (``base_ns``)."""
    return sum(m * (1 + tolerance) < b for m, b in zip(round_medians(times_ns, runs), round_medians(base_ns, runs)))
