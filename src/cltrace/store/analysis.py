"""``StoreAnalysis``: the store's answers for one scope (run, rank, service), each from its question
module, brought back as aggregates only; ``render`` is the terminal text, ``as_dict`` the JSON."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from .questions.common import Scope
from .questions.findings import RunFinding, run_findings
from .questions.kernels import KernelPace, kernel_pace
from .questions.ranks import RankRow, rank_table
from .questions.regions import RegionRow, region_table
from .questions.stragglers import SlowRank, Straggler, stragglers

SCHEMA = "cltrace.store-analysis/1"


@dataclass
class StoreAnalysis:
    scope: Scope
    ranks: list[RankRow] = field(default_factory=list)
    kernels: list[KernelPace] = field(default_factory=list)
    regions: list[RegionRow] = field(default_factory=list)
    slow_ranks: list[SlowRank] = field(default_factory=list)  # the ranks that straggled, slowest first
    stragglers: list[Straggler] = field(default_factory=list)  # the worst straggling steps
    findings: list[RunFinding] = field(default_factory=list)  # the file analysis's rules, with the ranks they hit

    def slowest_ranks(self) -> list[dict[str, Any]]:
        return [r.as_dict() for r in self.slow_ranks]

    def as_dict(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "scope": vars(self.scope), "ranks": [r.as_dict() for r in self.ranks],
                "slowest_ranks": self.slowest_ranks(), "stragglers": [s.as_dict() for s in self.stragglers],
                "kernels": [k.as_dict() for k in self.kernels], "regions": [r.as_dict() for r in self.regions],
                "findings": [f.as_dict() for f in self.findings]}

    def run_samples(self) -> Any:
        """The run as ``cltrace diff``'s gate reads it (``analyzers.samples.RunSamples``), so a diff of two
        runs in a store is judged by the same rules as a diff of two files. The store's tables are totals:
        each row is one sample of the whole run (the gate then judges the time a row adds against the
        run's device time, or its wall time for a region's host time), kernels by device time, regions
        by host time, and the run's device time its kernels'."""
        import numpy as np

        from ..analyzers.samples import TOTAL, RowSamples, RunSamples

        def one(count: int, total: int) -> RowSamples:
            return RowSamples(count, total, total, np.array([float(total)]), "run", float(total))

        rows = {("kernel", k.name, "device"): one(k.count, k.total_ns) for k in self.kernels}
        rows.update({("region", r.path, "host"): one(r.count, r.total_ns) for r in self.regions})
        device = sum(k.total_ns for k in self.kernels)
        if device:
            rows[("total", TOTAL, "device")] = one(1, device)
        wall = sum(r.total_ns for r in self.regions if "/" not in r.path)  # the outermost regions' host time
        return RunSamples(rows, 0, device, wall)

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.as_dict(), indent=indent, default=str)


def totals(query: Any, scope: Scope) -> StoreAnalysis:
    """Only the kernel and region tables of ``scope`` (what a diff reads), every row of them."""
    return StoreAnalysis(scope, kernels=kernel_pace(query, scope), regions=region_table(query, scope))


def analyse(query: Any, scope: Scope, step_name: str = "step", threshold_pct: float = 10.0,
            top: int = 10) -> StoreAnalysis:
    """Every question for ``scope``; ``query(sql, params)`` runs SQL with ``{spans}`` for the table."""
    ranks = rank_table(query, scope)
    # a step straggles against the median of two ranks or more: with one, none can (and one rank's steps
    # are the most a single large file holds)
    slow, steps = stragglers(query, scope, step_name, threshold_pct, top) if len(ranks) > 1 else ([], [])
    return StoreAnalysis(scope, ranks, kernel_pace(query, scope, top), region_table(query, scope, top), slow, steps,
                         run_findings(query, scope))


def _ms(ns: float) -> str:
    return f"{ns / 1e6:.3f}"


def _ranks(f: RunFinding) -> str:
    """The ranks a finding hits, runs of consecutive numbers as ``a-b``."""
    names = sorted({h.rank for h in f.ranks}, key=lambda r: (not r.isdigit(), int(r) if r.isdigit() else 0, r))
    out: list[str] = []
    for r in names:
        if out and r.isdigit() and out[-1].split("-")[-1].isdigit() and int(out[-1].split("-")[-1]) + 1 == int(r):
            out[-1] = out[-1].split("-")[0] + "-" + r
        else:
            out.append(r)
    return ",".join(out) + f" ({len(names)})"


def render(a: StoreAnalysis, top: int = 10, title: str | None = None) -> str:
    """The analysis as text tables; ``title`` heads them (default: the store and scope)."""
    out = []
    sc = ", ".join(f"{k} {v}" for k, v in vars(a.scope).items() if v is not None) or "every run"
    out.append(f"{title or f'cltrace analyze --store ({sc})'}: {len(a.ranks)} rank(s)")
    out.append("")
    out.append("ranks                      wall ms   busy %    idle ms  kernels ms  transfers ms   waits ms   spans")
    for r in a.ranks:
        label = f"{r.run or '-'}/{r.rank}"
        out.append(f"  {label:<22} {_ms(r.wall_ns):>9} {r.busy_pct:>8.1f} {_ms(r.idle_ns):>10} {_ms(r.kernel_ns):>11} "
                   f"{_ms(r.transfer_ns):>13} {_ms(r.wait_ns):>10} {r.spans:>7}")
    out.append("")
    if not a.slow_ranks:
        out.append("stragglers: none (no rank's step took over the threshold beyond the median)")
    else:
        out.append("slowest ranks (steps over the median of all ranks)")
        for s in a.slow_ranks[:top] if top else a.slow_ranks:
            out.append(f"  rank {s.rank} of run {s.run or '-'}: {s.steps} step(s), "
                       f"{_ms(s.excess_ns)} ms over the median in all; cause: {s.cause} (worst: step {s.worst_step})")
        out.append("")
        out.append("stragglers                       step    step ms  median ms  excess   cause      "
                   "kernels+ms transfers+ms host+ms waits+ms  where (rank's timeline)")
        for s in a.stragglers[:top] if top else a.stragglers:
            x = s.excess_by_part
            out.append(f"  {(s.run or '-') + '/' + s.rank:<30} {s.step:>5} {_ms(s.step_ns):>10} {_ms(s.median_ns):>10} "
                       f"{s.excess_pct:>6.1f}%  {s.cause:<10} {_ms(x['kernels']):>10} {_ms(x['transfers']):>12} "
                       f"{_ms(x['host']):>7} {_ms(x['waiting']):>8}  t={s.at_s:.6f} s, span {s.span_id}")
    out.append("")
    if a.findings:
        out.append("findings (rules of cltrace analyze FILE, per rank)  ranks hit            ms at stake  most at stake")
        for f in a.findings:
            worst = f.ranks[0]
            out.append(f"  {f.rule:<49} {_ranks(f):<20} {_ms(f.cost_ns):>11}  rank {worst.rank} of run "
                       f"{worst.run or '-'}: {_ms(worst.cost_ns)} ms, {worst.detail}")
    else:
        out.append("findings: none of the rules the store computes fired on any rank")
    return "\n".join(out + [""] + kernel_lines(a.kernels) + [""] + region_lines(a.regions))


def kernel_lines(kernels: list[KernelPace]) -> list[str]:
    """The kernel table: launches, device time, steady-state mean, p99 and the pace across ranks."""
    out = ["kernels                         launches   total ms    mean us  p99 us  ranks  rank means us "
           "(min/median/max)  slowest  spread"]
    for k in kernels:
        out.append(f"  {k.name[:30]:<30} {k.count:>8} {_ms(k.total_ns):>10} {k.mean_ns / 1e3:>10.1f} {k.p99_ns / 1e3:>7.1f} "
                   f"{k.ranks:>6}  {k.rank_mean_min_ns / 1e3:.1f}/{k.rank_mean_median_ns / 1e3:.1f}/"
                   f"{k.rank_mean_max_ns / 1e3:.1f}  {k.slowest_rank:>7}  {k.spread_pct:.1f}%")
    return out


def region_lines(regions: list[RegionRow]) -> list[str]:
    """The region table: calls and host time per region path, and the rank with the most of it."""
    out = ["regions                         calls   total ms    mean ms  ranks  slowest rank"]
    for r in regions:
        out.append(f"  {r.path[:30]:<30} {r.count:>6} {_ms(r.total_ns):>10} {_ms(r.mean_ns):>10} {r.ranks:>6}  "
                   f"{r.slowest_rank}")
    return out
