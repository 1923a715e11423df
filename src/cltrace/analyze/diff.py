"""``cltrace diff A B``: what got slower or faster between two runs, per region and per kernel.

Rows are matched by region path (device time where the region has it, host time otherwise) and
by kernel name. Rows are ordered by the change of their self time (a region that got slower
only because a kernel in it did ranks below that kernel), ``change_ns`` is the change in total
time, and ``change_pct`` is
the change of the mean per call, so a run with more steps is not a regression by itself. A row
regresses when ``change_pct`` exceeds the threshold and it holds at least ``MIN_SHARE`` of its
run's time (smaller rows are listed, not gated: their noise is not a regression).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from ..timeline.spans import REGION_CATS
from .analysis import Analysis
from .text import Column, table, terminal_width

MIN_SHARE = 0.01


@dataclass
class DiffRow:
    kind: str  # "region" or "kernel"
    name: str  # region path or kernel name
    source: str  # "device" or "host"
    count_a: int
    count_b: int
    total_a_ns: int
    total_b_ns: int
    p50_a_ns: float | None
    p50_b_ns: float | None
    p99_a_ns: float | None
    p99_b_ns: float | None
    self_a_ns: int  # regions: total minus children; kernels: the total
    self_b_ns: int
    change_ns: int  # of the total
    self_change_ns: int  # orders the rows: a region slower only through a child ranks below it
    change_pct: float | None  # of the mean per call; None where one side is missing
    gated: bool  # large enough to count as a regression

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _regions(a: Analysis) -> dict[tuple[str, str, str], dict[str, Any]]:
    out = {}
    for r in a.regions:
        if r["cat"] not in REGION_CATS:
            continue
        key = ("region", r["path"], r["source"])
        if r["source"] == "device" or ("region", r["path"], "device") not in out:
            out[key] = r
    paths_with_device = {k[1] for k in out if k[2] == "device"}
    return {k: v for k, v in out.items() if k[2] == "device" or k[1] not in paths_with_device}


def _kernels(a: Analysis, per_device: bool = False) -> dict[tuple[str, str, str], dict[str, Any]]:
    """Kernel rows by name (and shape; and device where either run has more than one)."""
    return {("kernel", r["name"] + (f" [{r['shape']}]" if r.get("shape") else "") +
             (f" on {r.get('device', '')}" if per_device else ""), "device"): r for r in a.kernels}


def _devices(a: Analysis) -> int:
    return len({r.get("device", "") for r in a.kernels})


def diff(a: Analysis, b: Analysis, min_share: float = MIN_SHARE) -> list[DiffRow]:
    """Rows for every region and kernel of either run, largest absolute change first."""
    rows = []
    per_device = max(_devices(a), _devices(b)) > 1
    for pick in (_regions, lambda x: _kernels(x, per_device)):
        ra, rb = pick(a), pick(b)
        totals = {src: max(sum(r["total_ns"] for k, r in side.items() if k[2] == src) for side in (ra, rb)) or 1
                  for src in ("device", "host")}
        for key in sorted(set(ra) | set(rb)):
            x, y = ra.get(key), rb.get(key)
            ca, cb = (x or {}).get("count", 0), (y or {}).get("count", 0)
            ta, tb = (x or {}).get("total_ns", 0), (y or {}).get("total_ns", 0)
            pct = 100.0 * ((tb / cb) / (ta / ca) - 1.0) if ca and cb and ta else None
            share = max(ta, tb) / totals[key[2]]
            sa, sb = (x or {}).get("self_ns", ta), (y or {}).get("self_ns", tb)
            rows.append(DiffRow(key[0], key[1], key[2], ca, cb, int(ta), int(tb), (x or {}).get("p50_ns"),
                                (y or {}).get("p50_ns"), (x or {}).get("p99_ns"), (y or {}).get("p99_ns"),
                                int(sa), int(sb), int(tb - ta), int(sb - sa), None if pct is None else round(pct, 3),
                                share >= min_share))
    rows.sort(key=lambda r: (-abs(r.self_change_ns), -abs(r.change_ns), r.kind, r.name))
    return rows


def regressions(rows: list[DiffRow], fail_above_pct: float) -> list[DiffRow]:
    return [r for r in rows if r.gated and r.change_pct is not None and r.change_pct > fail_above_pct]


def render_diff(rows: list[DiffRow], a: str, b: str, width: int | None = None, top: int | None = 20) -> str:
    shown = rows[:top] if top else rows
    cols = [Column("region / kernel", keep=9), Column("src", keep=8, left=True), Column("count A", keep=4),
            Column("count B", keep=4), Column("total A", time=True, keep=7), Column("total B", time=True, keep=7),
            Column("self change", time=True, keep=8), Column("change", time=True, keep=9), Column("change %", keep=9), Column("p50 A", time=True, keep=3),
            Column("p50 B", time=True, keep=3), Column("p99 A", time=True, keep=2), Column("p99 B", time=True, keep=2)]
    data = [(("kernel " if r.kind == "kernel" else "") + r.name, r.source, r.count_a, r.count_b, r.total_a_ns,
             r.total_b_ns, r.self_change_ns, r.change_ns, "-" if r.change_pct is None else f"{r.change_pct:+.1f}",
             r.p50_a_ns, r.p50_b_ns, r.p99_a_ns, r.p99_b_ns) for r in shown]
    head = [f"cltrace diff: A = {a}", f"              B = {b}",
            "ordered by self change (B - A of the time not in children); change: of the total; "
            "change %: of the mean per call"]
    more = [f"({len(rows) - len(shown)} more rows; --top 0 shows all)"] if len(rows) > len(shown) else []
    return "\n".join(head + table(cols, data, width=width or terminal_width()) + more)


__all__ = ["DiffRow", "diff", "regressions", "render_diff"]
