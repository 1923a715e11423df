"""What a sweep found: one ``Trial`` per configuration, and the ``AutotuneResult`` (ranking, table, plot)."""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Sequence

from ..analyze.report import format_ns
from .config import Config, fmt_dims

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

    @classmethod
    def measured(cls, config: Config, times_ns: Sequence[int], **kw: Any) -> "Trial":
        ts = tuple(int(t) for t in times_ns)
        mean = sum(ts) / len(ts)
        std = math.sqrt(sum((t - mean) ** 2 for t in ts) / (len(ts) - 1)) if len(ts) > 1 else 0.0
        return cls(config, OK, times_ns=ts, mean_ns=mean, std_ns=std, min_ns=min(ts), **kw)

    @classmethod
    def failed(cls, config: Config, stage: str, reason: str, **kw: Any) -> "Trial":
        return cls(config, FAILED, reason=reason, stage=stage, **kw)

    @property
    def ok(self) -> bool:
        return self.status == OK

    def gflops(self, flops: float | None) -> float | None:
        if not flops or not self.mean_ns:
            return None
        return flops / self.mean_ns

    def as_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["config"] = self.config.as_dict()
        d["times_ns"] = list(self.times_ns)
        return d


@dataclass(frozen=True)
class AutotuneResult:
    """The winner (``best_config``) and every trial in the order run (``measurements``)."""

    best_config: Config | None
    measurements: tuple[Trial, ...]
    kernel: str
    device: str
    shape_key: tuple | None = None
    flops: float | None = None
    baseline: Config | None = None
    strategy: str = "grid"
    persisted: str | None = None

    @property
    def best(self) -> Trial | None:
        return self.trial(self.best_config) if self.best_config is not None else None

    @property
    def baseline_trial(self) -> Trial | None:
        return self.trial(self.baseline) if self.baseline is not None else None

    def trial(self, config: Config) -> Trial | None:
        for t in self.measurements:
            if t.config == config:
                return t
        return None

    def ranked(self) -> list[Trial]:
        """Successful trials, fastest (lowest mean) first."""
        return sorted((t for t in self.measurements if t.ok), key=lambda t: t.mean_ns)

    def failures(self) -> list[Trial]:
        return [t for t in self.measurements if not t.ok]

    def speedup(self) -> float | None:
        """Baseline mean / best mean, when both ran."""
        b, w = self.baseline_trial, self.best
        if b is None or w is None or not b.ok or not w.ok:
            return None
        return b.mean_ns / w.mean_ns

    def table(self, top: int | None = None) -> str:
        """Ranked text table of the trials (fastest first), then the failed ones with reasons."""
        ranked = self.ranked()
        fails = self.failures()
        shape = f" shape={fmt_dims(self.shape_key, '-')}" if self.shape_key and all(
            isinstance(v, int) for v in self.shape_key) else ""
        lines = [f"autotune {self.kernel} on {self.device}{shape} ({self.strategy}): "
                 f"{len(ranked)} ok, {len(fails)} failed"]
        base = self.baseline_trial
        head = (f"{'#':>3}  {'workgroup':<10} {'tile':<7} {'unroll':>6} {'mean':>11} {'std':>10} "
                f"{'min':>11} {'runs':>5}")
        if self.flops:
            head += f" {'GFLOP/s':>9}"
        if base is not None and base.ok:
            head += f" {'vs base':>8}"
        lines += [head, "-" * len(head)]
        for i, t in enumerate(ranked[:top] if top else ranked, 1):
            c = t.config
            row = (f"{i:>3}  {fmt_dims(c.workgroup, 'auto'):<10} {fmt_dims(c.tile, '-'):<7} "
                   f"{'-' if c.unroll is None else c.unroll:>6} {format_ns(t.mean_ns):>11} "
                   f"{format_ns(t.std_ns):>10} {format_ns(t.min_ns):>11} {len(t.times_ns):>5}")
            if self.flops:
                row += f" {t.gflops(self.flops):>9.2f}"
            if base is not None and base.ok:
                row += f" {base.mean_ns / t.mean_ns:>7.2f}x"
            marks = (["best"] if c == self.best_config else []) + (["baseline"] if c == self.baseline else [])
            if marks:
                row += "  <- " + ", ".join(marks)
            lines.append(row)
        if top and len(ranked) > top:
            lines.append(f"     ... {len(ranked) - top} more")
        if fails:
            lines.append("failed:")
            for t in fails:
                lines.append(f"     {t.config.label():<34} [{t.stage}] {t.reason}")
        return "\n".join(lines)

    def plot(self, path: str) -> str:
        """Save a bar chart of the sweep (mean ± std per trial, fastest first) to ``path``."""
        try:
            import matplotlib

            matplotlib.use("Agg", force=False)
            import matplotlib.pyplot as plt
        except ImportError:
            raise ImportError("AutotuneResult.plot needs matplotlib: pip install 'cltrace[plot]'") from None
        ranked = self.ranked()
        if not ranked:
            raise ValueError("AutotuneResult.plot: no successful trial to plot")
        use_gflops = bool(self.flops)
        vals = [t.gflops(self.flops) if use_gflops else t.mean_ns / 1e6 for t in ranked]
        errs = [(t.std_ns / t.mean_ns) * v for t, v in zip(ranked, vals)]
        colors = ["tab:green" if t.config == self.best_config else
                  "tab:orange" if t.config == self.baseline else "tab:blue" for t in ranked]
        fig, ax = plt.subplots(figsize=(8, max(2.5, 0.28 * len(ranked) + 1.2)))
        ys = list(range(len(ranked)))
        ax.barh(ys, vals, xerr=errs, color=colors)
        ax.set_yticks(ys, [t.config.label() for t in ranked], fontsize=7)
        ax.invert_yaxis()
        ax.set_xlabel("GFLOP/s (device time)" if use_gflops else "mean device time per launch (ms)")
        from matplotlib.patches import Patch

        ax.legend(handles=[Patch(color="tab:green", label="best"), Patch(color="tab:orange", label="baseline"),
                           Patch(color="tab:blue", label="trial")], loc="lower right", fontsize=7)
        fails = len(self.failures())
        ax.set_title(f"autotune {self.kernel} on {self.device}: {len(ranked)} ok, {fails} failed", fontsize=9)
        fig.tight_layout()
        fig.savefig(path)
        plt.close(fig)
        return path

    def as_dict(self) -> dict[str, Any]:
        return {
            "kernel": self.kernel, "device": self.device, "strategy": self.strategy,
            "shape_key": list(self.shape_key) if self.shape_key is not None else None,
            "flops": self.flops, "persisted": self.persisted,
            "best_config": self.best_config.as_dict() if self.best_config is not None else None,
            "baseline": self.baseline.as_dict() if self.baseline is not None else None,
            "measurements": [t.as_dict() for t in self.measurements],
        }

