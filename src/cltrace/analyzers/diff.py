"""``cltrace diff A B``: what got slower or faster between two runs, and whether it is a regression.

Rows: the run's device time (per step where the runs mark steps, ``cltrace.steps``/``step()``),
each region by path (device time where the region has it, host time otherwise) and each kernel by
name (and device, where either run has more than one). Each row carries its verdict and the reason
for it, decided by ``gate`` on the rows' samples (medians, quartiles, time added; see there), so
the text and ``--json`` say the same. The total row comes first, then regressions, then the rest,
each by the change of its self time (a region slower only because a kernel in it is ranks below
that kernel).
"""
from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from typing import Any, Union

from . import gate
from .model import TraceData
from .samples import RowSamples, RunSamples, devices, run_samples, whole
from .text import Column, table, terminal_width
from .window import Selection, Window, apply, as_window, select

DEFAULT_PCT = 10.0  # the threshold reasons are given at without --fail-above
Side = Union[str, "os.PathLike[str]", TraceData]


@dataclass
class DiffRow:
    kind: str  # "total", "region" or "kernel"
    name: str  # region path, kernel name, or the total's ("device time": per step, or the run's)
    source: str  # "device" or "host"
    per: str  # what one sample (p50, p99, mean) is: a "call", a "step", the "run"
    count_a: int
    count_b: int
    total_a_ns: int
    total_b_ns: int
    p50_a_ns: float | None
    p50_b_ns: float | None
    p99_a_ns: float | None
    p99_b_ns: float | None
    self_a_ns: int  # regions: total minus children; kernels: their share of device busy time
    self_b_ns: int
    change_ns: int  # of the total
    self_change_ns: int  # orders the rows: a region slower only through a child ranks below it
    change_pct: float | None  # of the median (p50) sample; None where one side is missing
    mean_change_pct: float | None  # of the mean sample: the time per call (or step)
    verdict: str  # regression, faster, ok, new, removed; not gated: small, listed (host time, few samples)
    reason: str  # why: the figures and the rule that decided (gate)
    gated: bool  # judged by the gate (not a row too small to count)

    @property
    def regressed(self) -> bool:
        return self.verdict == gate.REGRESSION

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "regressed": self.regressed}


def _columns(side: Side, window: Window) -> tuple[TraceData, Selection]:
    """One side's columns, of the window only (``analyzers.window``), and what the window is there."""
    if isinstance(side, TraceData):
        td = side
    else:
        from ..read import load_columns

        spans, meta = load_columns(side)
        td = TraceData(spans, meta)
    sel = select(td, window)
    return apply(td, sel), sel


def _pct(new: float | None, old: float | None) -> float | None:
    return None if new is None or old is None or not old else round(100.0 * (new / old - 1.0), 3)


def _row(key: tuple[str, str, str], x: RowSamples | None, y: RowSamples | None, v: gate.Verdict) -> DiffRow:
    def get(r: RowSamples | None, f: str, default: Any = 0) -> Any:
        return default if r is None else getattr(r, f)

    ta, tb = get(x, "total_ns"), get(y, "total_ns")
    sa, sb = get(x, "self_ns"), get(y, "self_ns")
    p50a, p50b = get(x, "p50_ns", None), get(y, "p50_ns", None)
    return DiffRow(key[0], key[1], key[2], get(x or y, "per"), get(x, "count"), get(y, "count"), ta, tb, p50a, p50b,
                   get(x, "p99_ns", None), get(y, "p99_ns", None), sa, sb, tb - ta, sb - sa, _pct(p50b, p50a),
                   _pct(get(y, "mean_ns", None), get(x, "mean_ns", None)) if x and y else None,
                   v.verdict, v.reason, v.gated)


def compare(ra: RunSamples, rb: RunSamples, pct: float = DEFAULT_PCT) -> list[DiffRow]:
    """Rows of two runs' samples, judged at ``pct`` percent."""
    scale = ra.steps / rb.steps if ra.steps and rb.steps else 1.0
    # new kernels' time less removed kernels' (a kernel renamed or fused at no extra cost nets out)
    net = sum(r.typical_ns * scale for k, r in rb.rows.items() if k[0] == "kernel" and k not in ra.rows) - \
        sum(r.typical_ns for k, r in ra.rows.items() if k[0] == "kernel" and k not in rb.rows)
    rows = []
    for key in sorted(set(ra.rows) | set(rb.rows)):
        x, y = ra.rows.get(key), rb.rows.get(key)
        if x is not None and y is not None and x.per != y.per:  # steps in one run only: whole runs
            x, y = whole(x), whole(y)
        base, kind = ra.base_ns(key[2]), "device" if key[2] == "device" else "wall"
        if x is not None and y is not None:
            v = gate.matched(x, y, pct, base, kind)
        elif y is not None:
            v = gate.new(y, scale, pct, base, net if key[0] == "kernel" else y.typical_ns * scale, kind)
        else:
            v = gate.removed(x, base, kind)  # type: ignore[arg-type]
        rows.append(_row(key, x, y, v))
    rows.sort(key=lambda r: (r.kind != "total", not r.regressed, -abs(r.self_change_ns), -abs(r.change_ns),
                             r.kind, r.name))
    return rows


def diff(a: Side, b: Side, pct: float = DEFAULT_PCT, window: Window | str | None = None) -> list[DiffRow]:
    """Rows for the run's device time and every region and kernel of either run (trace files or
    ``TraceData``), each with its verdict and reason at ``pct`` percent. ``window`` (the whole runs by
    default; ``"steady"``, ``"2:12"`` or a ``Window``) is applied to both runs alike."""
    return diff_windows(a, b, pct, window)[0]


def diff_windows(a: Side, b: Side, pct: float = DEFAULT_PCT,
                 window: Window | str | None = None) -> tuple[list[DiffRow], Selection, Selection]:
    """``diff``, and what the window is in each run (its words, for the report)."""
    w = as_window(window)
    (ta, sa), (tb, sb) = _columns(a, w), _columns(b, w)
    per_device = max(devices(ta), devices(tb)) > 1
    return compare(run_samples(ta, per_device), run_samples(tb, per_device), pct), sa, sb


def regressions(rows: list[DiffRow]) -> list[DiffRow]:
    return [r for r in rows if r.regressed]


def render_diff(rows: list[DiffRow], a: str, b: str, pct: float, width: int | None = None,
                top: int | None = 20, windows: tuple[str, str] | None = None) -> str:
    """The rows as a table; ``windows``: what part of each run was compared, in words."""
    shown = rows[:top] if top else rows
    cols = [Column("region / kernel", keep=9), Column("src", keep=8, left=True), Column("verdict", keep=10, left=True),
            Column("per", keep=6, left=True),
            Column("count A", keep=4), Column("count B", keep=4), Column("total A", time=True, keep=7, unit="total"),
            Column("total B", time=True, keep=7, unit="total"),
            Column("self change", time=True, keep=5, unit="total"),
            Column("p50 A", time=True, keep=6, unit="p50"), Column("p50 B", time=True, keep=6, unit="p50"),
            Column("p50 %", keep=8), Column("mean %", keep=7), Column("p99 A", time=True, keep=2, unit="p99"),
            Column("p99 B", time=True, keep=2, unit="p99"),
            Column("reason", keep=9, left=True)]
    label = {"kernel": "kernel ", "total": "total: "}
    data = [(label.get(r.kind, "") + r.name, r.source, r.verdict, r.per, r.count_a, r.count_b, r.total_a_ns, r.total_b_ns,
             r.self_change_ns, r.p50_a_ns, r.p50_b_ns, "-" if r.change_pct is None else f"{r.change_pct:+.1f}",
             "-" if r.mean_change_pct is None else f"{r.mean_change_pct:+.1f}", r.p99_a_ns, r.p99_b_ns, r.reason)
            for r in shown]
    wa, wb = (f" ({w})" for w in windows) if windows else ("", "")
    head = [f"cltrace diff: A = {a}{wa}", f"              B = {b}{wb}",
            f"judged at {pct:g}%: a regression is a p50 and a mean both up more than that and beyond both runs' "
            "p25-p75 (few samples, new rows: the time added against A's); per: what a sample is (p50, p99, mean); "
            "self change: B - A of the time not in children"]
    more = [f"({len(rows) - len(shown)} more rows; --top 0 shows all)"] if len(rows) > len(shown) else []
    return "\n".join(head + table(cols, data, width=width or terminal_width()) + more)


__all__ = ["DEFAULT_PCT", "DiffRow", "compare", "diff", "diff_windows", "regressions", "render_diff"]
