"""What a sweep found: one ``Trial`` per configuration (median, p10, p90 of its device times), the
``Confirmation`` rounds, and the ``AutotuneResult`` (ranking, verdict, table, plot)."""
from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from ..analyzers.report import format_ns
from ..export.base import create_output, partial_path, put_in_place
from .config import Config, fmt_dims
from .rounds import quantile

OK = "ok"
FAILED = "failed"


@dataclass(frozen=True)
class Trial:
    """One measured (or failed) configuration. Times are device ns (event END - START)."""

    config: Config
    status: str
    reason: str | None = None
    stage: str | None = None  # where a failed trial stopped: "limits", "build", "launch", "check"
    times_ns: tuple[int, ...] = ()
    mean_ns: float | None = None
    std_ns: float | None = None
    min_ns: int | None = None
    compile_ns: int | None = None
    from_cache: bool | None = None
    median_ns: float | None = None
    p10_ns: float | None = None
    p90_ns: float | None = None

    @classmethod
    def measured(cls, config: Config, times_ns: Sequence[int], **kw: Any) -> "Trial":
        """A successful trial; its figures are computed from ``times_ns`` (ranking uses the median)."""
        ts = tuple(int(t) for t in times_ns)
        mean = sum(ts) / len(ts)
        std = math.sqrt(sum((t - mean) ** 2 for t in ts) / (len(ts) - 1)) if len(ts) > 1 else 0.0
        srt = sorted(ts)
        return cls(config, OK, times_ns=ts, mean_ns=mean, std_ns=std, min_ns=srt[0], median_ns=quantile(srt, 0.5),
                   p10_ns=quantile(srt, 0.1), p90_ns=quantile(srt, 0.9), **kw)

    @classmethod
    def failed(cls, config: Config, stage: str, reason: str, **kw: Any) -> "Trial":
        return cls(config, FAILED, reason=reason, stage=stage, **kw)

    @property
    def ok(self) -> bool:
        return self.status == OK

    def gflops(self, flops: float | None, ns: float | None = None) -> float | None:
        """GFLOP/s at the median device time (or at ``ns``)."""
        ns = self.median_ns if ns is None else ns
        if not flops or not ns:
            return None
        return flops / ns

    def clearly_faster_than(self, other: "Trial", tolerance: float = 0.0) -> bool:
        """True when this trial beats ``other`` by more than the noise: its p90 is below the other's
        p10, and its median more than ``tolerance`` (a fraction) below the other's."""
        return (self.ok and other.ok and self.p90_ns is not None and other.p10_ns is not None
                and self.p90_ns < other.p10_ns and self.median_ns * (1 + tolerance) < other.median_ns)

    def as_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["config"] = self.config.as_dict()
        d["times_ns"] = list(self.times_ns)
        return d


def preferred(trials: Sequence[Trial], order: Mapping[Config, int] | None = None,
              tolerance: float = 0.0) -> list[Trial]:
    """Successful trials, most preferred first: those within noise of the fastest (not
    ``clearly_faster_than`` by it) in sweep ``order``, then the rest by median. Without ``order``:
    by median only. A noisy run reshuffles the medians of near-equal candidates, not their order."""
    ok = sorted((t for t in trials if t.ok), key=lambda t: t.median_ns)
    if not ok or order is None:
        return ok
    fastest = ok[0]
    tied = [t for t in ok if not fastest.clearly_faster_than(t, tolerance)]
    rest = [t for t in ok if fastest.clearly_faster_than(t, tolerance)]
    return sorted(tied, key=lambda t: (order.get(t.config, len(order)), t.median_ns)) + rest


@dataclass(frozen=True)
class Confirmation:
    """The interleaved re-measurement and its decision. Times are device ns (END - START).

    ``trials``: one per candidate, with every confirmation launch's time; ``wins``: the
    rounds in which each was fastest (by its median in that round); ``winner``: the
    configuration chosen (the default when there is no real win); ``real_win``: whether
    it beats the default by more than the noise (None: no default was measured).
    """

    trials: tuple[Trial, ...]
    wins: tuple[int, ...]
    rounds: int
    runs: int
    default: Config | None
    winner: Config | None
    real_win: bool | None
    verdict: str

    def trial(self, config: Config | None) -> Trial | None:
        for t in self.trials:
            if t.config == config:
                return t
        return None

    def speedup(self) -> float | None:
        """Default median / winner median in the confirmation rounds."""
        w, d = self.trial(self.winner), self.trial(self.default)
        if w is None or d is None or not w.ok or not d.ok:
            return None
        return d.median_ns / w.median_ns

    def as_dict(self) -> dict[str, Any]:
        return {
            "rounds": self.rounds, "runs": self.runs, "wins": list(self.wins), "verdict": self.verdict,
            "real_win": self.real_win,
            "default": self.default.as_dict() if self.default is not None else None,
            "winner": self.winner.as_dict() if self.winner is not None else None,
            "trials": [t.as_dict() for t in self.trials],
        }



@dataclass(frozen=True)
class AutotuneResult:
    """What a sweep found: every trial in the order run (``measurements``), the confirmation
    rounds, and the configuration to use (``best_config``).

    ``best_config`` is the confirmed winner when it beats the untuned default by more than
    the noise (``real_win``), else the default (``real_win`` False); with no default to
    compare with, the confirmed fastest (``real_win`` None). ``verdict`` says which and why.
    """

    best_config: Config | None
    measurements: tuple[Trial, ...]
    kernel: str
    device: str
    shape_key: tuple | None = None
    flops: float | None = None
    baseline: Config | None = None
    strategy: str = "grid"
    persisted: str | None = None
    confirmation: Confirmation | None = None
    real_win: bool | None = None
    verdict: str = ""
    device_name: str | None = None
    evicted: str | None = None
    tolerance: float = 0.05  # the fraction by which medians had to differ to count (``Autotuner(tolerance=)``)

    @property
    def best(self) -> Trial | None:
        """The sweep trial of ``best_config``."""
        return self.trial(self.best_config) if self.best_config is not None else None

    @property
    def baseline_trial(self) -> Trial | None:
        return self.trial(self.baseline) if self.baseline is not None else None

    def trial(self, config: Config) -> Trial | None:
        for t in self.measurements:
            if t.config == config:
                return t
        return None

    def figures(self, config: Config | None) -> Trial | None:
        """The best-founded figures of ``config``: its confirmation trial, else its sweep trial."""
        if config is None:
            return None
        t = self.confirmation.trial(config) if self.confirmation is not None else None
        return t if t is not None and t.ok else self.trial(config)

    def ranked(self) -> list[Trial]:
        """Successful sweep trials, fastest (lowest median) first."""
        return sorted((t for t in self.measurements if t.ok), key=lambda t: t.median_ns)

    def failures(self) -> list[Trial]:
        return [t for t in self.measurements if not t.ok]

    def speedup(self) -> float | None:
        """Default median / chosen median (confirmation figures when there are), when both ran."""
        default = self.confirmation.default if self.confirmation is not None else self.baseline
        b, w = self.figures(default), self.figures(self.best_config)
        if b is None or w is None or not b.ok or not w.ok:
            return None
        return b.median_ns / w.median_ns

    def _title(self) -> str:
        shape = f" {fmt_dims(self.shape_key, '-')}" if self.shape_key and all(
            isinstance(v, int) for v in self.shape_key) else ""
        return f"autotune {self.kernel}{shape} on {self.device_name or self.device}"

    def table(self, top: int | None = None) -> str:
        """Ranked text table of the sweep (lowest median first), the failed trials with reasons,
        then the confirmation rounds and the verdict."""
        ranked = self.ranked()
        fails = self.failures()
        shape = f" shape={fmt_dims(self.shape_key, '-')}" if self.shape_key and all(
            isinstance(v, int) for v in self.shape_key) else ""
        lines = [f"autotune {self.kernel} on {self.device_name or self.device}{shape} ({self.strategy}): "
                 f"{len(ranked)} ok, {len(fails)} failed"]
        base = self.baseline_trial
        vs = base is not None and base.ok
        head = _head(self.flops, vs, "runs")
        lines += [head, "-" * len(head)]
        for i, t in enumerate(ranked[:top] if top else ranked, 1):
            lines.append(_row(f"{i:>3}", t, self.flops, base if vs else None, len(t.times_ns),
                              self._marks(t.config)))
        if top and len(ranked) > top:
            lines.append(f"     ... {len(ranked) - top} more")
        if fails:
            lines.append("failed:")
            for t in fails:
                lines.append(f"     {t.config.label():<34} [{t.stage}] {t.reason}")
        conf = self.confirmation
        if conf is not None:
            lines.append(f"confirmation: {conf.rounds} interleaved rounds x {conf.runs} launches "
                         f"(device time, median and p10-p90 over all {conf.rounds * conf.runs})")
            cbase = conf.trial(conf.default)
            cvs = cbase is not None and cbase.ok
            head = _head(self.flops, cvs, "wins")
            lines += [head, "-" * len(head)]
            for t, w in sorted(zip(conf.trials, conf.wins), key=lambda tw: (not tw[0].ok, tw[0].median_ns or 0)):
                if t.ok:
                    lines.append(_row("   ", t, self.flops, cbase if cvs else None, w, self._marks(t.config)))
                else:
                    lines.append(f"     {t.config.label():<34} [{t.stage}] {t.reason}")
        if self.verdict:
            lines.append(("winner: " if self.real_win else "") + self.verdict)
        return "\n".join(lines)

    @property
    def default(self) -> Config | None:
        """The untuned configuration the winner was compared with (the baseline when no confirmation ran)."""
        return self.confirmation.default if self.confirmation is not None else self.baseline

    @property
    def winner(self) -> Config | None:
        """``best_config`` when it is a winner (a real win, or nothing to compare with); None when the default is kept."""
        return self.best_config if self.real_win is not False else None

    def _marks(self, config: Config) -> str:
        marks = (["winner"] if config == self.winner else []) + (["default"] if config == self.default else [])
        return ("  <- " + ", ".join(marks)) if marks else ""

    def figure(self, top: int = 15) -> Any:
        """A matplotlib figure that shows how the winner was chosen (``chart.figure``): the winner first,
        each trial's sweep and confirmation-round spread, the noise band, a note per trial, a caption;
        the ``top`` fastest of the trials that were not re-measured."""
        from .chart import figure

        return figure(self, top)

    def plot(self, path: str) -> str:
        """Save ``figure()`` to ``path`` (the format from its extension); returns the path. Drawn into
        ``path.partial`` and renamed: a chart that fails to draw leaves an earlier one as it was."""
        from .chart import close

        fig = self.figure()
        try:
            with create_output(partial_path(path)) as fh:
                fig.savefig(fh, format=os.path.splitext(path)[1][1:].lower() or None)
        finally:
            close(fig)
        put_in_place(path)
        return path

    def as_dict(self) -> dict[str, Any]:
        return {
            "kernel": self.kernel, "device": self.device, "device_name": self.device_name,
            "strategy": self.strategy,
            "shape_key": list(self.shape_key) if self.shape_key is not None else None,
            "flops": self.flops, "persisted": self.persisted, "evicted": self.evicted,
            "best_config": self.best_config.as_dict() if self.best_config is not None else None,
            "baseline": self.baseline.as_dict() if self.baseline is not None else None,
            "real_win": self.real_win, "verdict": self.verdict, "tolerance": self.tolerance,
            "measurements": [t.as_dict() for t in self.measurements],
            "confirmation": self.confirmation.as_dict() if self.confirmation is not None else None,
        }


def _head(flops: float | None, vs: bool, count: str) -> str:
    head = (f"{'#':>3}  {'workgroup':<10} {'tile':<7} {'unroll':>6} {'median':>11} {'p10':>11} {'p90':>11} "
            f"{count:>5}")
    if flops:
        head += f" {'GFLOP/s':>9}"
    if vs:
        head += f" {'vs base':>8}"
    return head


def _row(num: str, t: Trial, flops: float | None, base: Trial | None, count: int, marks: str) -> str:
    c = t.config
    row = (f"{num}  {fmt_dims(c.workgroup, 'auto'):<10} {fmt_dims(c.tile, '-'):<7} "
           f"{'-' if c.unroll is None else c.unroll:>6} {format_ns(t.median_ns):>11} "
           f"{format_ns(t.p10_ns):>11} {format_ns(t.p90_ns):>11} {count:>5}")
    if flops:
        row += f" {t.gflops(flops):>9.2f}"
    if base is not None:
        row += f" {base.median_ns / t.median_ns:>7.2f}x"
    return row + marks
