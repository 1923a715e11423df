"""The regression gate of ``cltrace diff``: whether one row of two runs got slower, and why.

A row is judged on what it costs, not on one launch: an outlier moves a mean, not a median.

A sample is a kernel's device time in one step where the runs mark steps, else one launch (the
first apart); a region's one occurrence; the run's device time in one step (``samples``).

- **In both runs, with at least ``MIN_SAMPLES`` samples each**: a regression when its median
  (p50) AND its mean (the time it takes per sample) both grew by more than the threshold, AND the
  change is beyond the runs' own spread: B's median above A's p75 and A's median below B's p25
  (each median outside the other run's middle half), AND the time it adds, ``(mean B - mean A) x
  A's samples``, is at least ``MIN_SHARE`` of A's time of that kind (a small kernel 15 % slower
  between two identical runs is the machine, not the program; the run's own total is a row too).
  ``faster`` is the same the other way.
- **Fewer samples** (a region run once, a kernel launched a few times): the spread cannot be
  told. Host time (a one-off set-up, its builds) is listed, not gated: one occurrence on a busy
  host is no measurement. Device time is judged by the time it adds, ``(mean B - mean A) x A's
  samples``, against the threshold's share of A's device time (that of all A's commands).
- **New in B**: a regression when its time exceeds the threshold's share of A's device time, and
  the new kernels' time less the removed ones' does too (a kernel renamed or fused at no extra
  cost is not a regression). Its time is typical: the median sample times the samples (an
  outlier step does not count), at A's number of steps where both runs mark steps. **Removed**:
  never one (that work is no longer spent).
- Rows holding less than ``MIN_SHARE`` of their run's time are listed, not gated (``small``).
"""
from __future__ import annotations

from dataclasses import dataclass

from .samples import RowSamples
from .text import fmt_ns

MIN_SHARE = 0.01  # of the run's time of the row's kind: a row smaller, or a change adding less, is no regression
MIN_SAMPLES = 5  # per run, to read a spread from its quartiles

REGRESSION, FASTER, OK, NEW, REMOVED = "regression", "faster", "ok", "new", "removed"
SMALL, LISTED = "small", "listed"  # not gated: too small a share; host time without a spread


@dataclass
class Verdict:
    verdict: str  # REGRESSION, FASTER, OK, NEW (new, no regression), REMOVED; not gated: SMALL, LISTED
    reason: str  # one line: the figures and the rule that decided

    @property
    def regressed(self) -> bool:
        return self.verdict == REGRESSION

    @property
    def gated(self) -> bool:
        return self.verdict not in (SMALL, LISTED)


def _pct(new: float, old: float) -> float | None:
    return 100.0 * (new / old - 1.0) if old else None


def _sgn(v: float | None) -> str:
    return "-" if v is None else f"{v:+.1f}%"


def matched(x: RowSamples, y: RowSamples, pct: float, base_ns: int, kind: str) -> Verdict:
    """A row present in both runs; ``base_ns``: A's time of the row's kind (device or wall)."""
    share = max(x.total_ns, y.total_ns) / base_ns if base_ns else 1.0
    if share < MIN_SHARE:
        return Verdict(SMALL, f"{100 * share:.2f}% of the run's {kind} time (< {100 * MIN_SHARE:g}%): listed, not gated")
    if (len(x.values) < MIN_SAMPLES or len(y.values) < MIN_SAMPLES) and kind != "device":
        return Verdict(LISTED, f"{min(len(x.values), len(y.values))} sample(s) of host time (< {MIN_SAMPLES}): "
                           "no spread to read, listed, not gated")
    if len(x.values) < MIN_SAMPLES or len(y.values) < MIN_SAMPLES:
        added = (y.mean_ns - x.mean_ns) * len(x.values)
        at = 100.0 * added / base_ns if base_ns else 0.0
        n = min(len(x.values), len(y.values))
        head = f"{n} sample{'s' if n != 1 else ''} (< {MIN_SAMPLES}: no spread to read): adds {fmt_ns(added)}, " \
               f"{at:+.1f}% of A's {kind} time"
        if at > pct:
            return Verdict(REGRESSION, f"{head} (> {pct:g}%)")
        if at < -pct:
            return Verdict(FASTER, f"{head} (< -{pct:g}%)")
        return Verdict(OK, f"{head} (within {pct:g}%)")
    a25, a50, a75 = x.quartiles()
    b25, b50, b75 = y.quartiles()
    med, mean = _pct(b50, a50), _pct(y.mean_ns, x.mean_ns)
    figures = f"p50 {_sgn(med)}, mean {_sgn(mean)}"
    if med is None or mean is None:
        return Verdict(OK, f"{figures}: A's p50 is 0")
    if med > pct and mean > pct:
        if not (b50 > a75 and a50 < b25):
            return Verdict(OK, f"{figures} (> {pct:g}%) but within the runs' p25-p75 spread")
        added = 100.0 * (y.mean_ns - x.mean_ns) * len(x.values) / base_ns if base_ns else 100.0
        if added < 100 * MIN_SHARE:
            return Verdict(OK, f"{figures} (> {pct:g}%), beyond both runs' p25-p75, but adds {added:.2f}% "
                               f"of A's {kind} time (< {100 * MIN_SHARE:g}%)")
        return Verdict(REGRESSION, f"{figures} (> {pct:g}%), beyond both runs' p25-p75")
    if med < -pct and mean < -pct:
        if b50 < a25 and a50 > b75:
            return Verdict(FASTER, f"{figures} (< -{pct:g}%), beyond both runs' p25-p75")
        return Verdict(OK, f"{figures} (< -{pct:g}%) but within the runs' p25-p75 spread")
    if med > pct:
        return Verdict(OK, f"{figures}: the typical call is slower, the time per call not above {pct:g}%")
    if mean > pct:
        return Verdict(OK, f"{figures}: outliers; the typical call not above {pct:g}%")
    return Verdict(OK, f"{figures}: neither up more than {pct:g}%")


def new(y: RowSamples, scale: float, pct: float, base_ns: int, net_ns: float, kind: str) -> Verdict:
    """A row only B has: ``scale`` brings B's time to A's number of steps; ``net_ns``: the typical
    time of every new kernel less every removed one's (for a region, its own), at the same scale."""
    t = y.typical_ns * scale
    at = 100.0 * t / base_ns if base_ns else float("inf")
    head = f"new in B: {fmt_ns(t)}, {at:.1f}% of A's {kind} time"
    if at <= pct:
        return Verdict(NEW, f"{head} (<= {pct:g}%)")
    net = 100.0 * net_ns / base_ns if base_ns else float("inf")
    if net <= pct:
        return Verdict(NEW, f"{head}, but new less removed rows {net:+.1f}% (<= {pct:g}%)")
    return Verdict(REGRESSION, f"{head} (> {pct:g}%)")


def removed(x: RowSamples, base_ns: int, kind: str) -> Verdict:
    at = 100.0 * x.total_ns / base_ns if base_ns else 0.0
    return Verdict(REMOVED, f"not in B: {fmt_ns(x.total_ns)}, {at:.1f}% of A's {kind} time, no longer spent")


__all__ = ["MIN_SAMPLES", "MIN_SHARE", "Verdict", "matched", "new", "removed"]
