"""``cltrace.analyze``: where the time went, as one data object.

The facade: it reads the spans (a file, a list of spans, or the recorder), builds the columns
once, keeps the part of the run asked for (``window``: the steady state unless told otherwise),
asks each module its question (utilisation, kernels, launches, regions, findings) and
keeps the answers as plain data: ``as_dict()`` is the stable JSON schema (``SCHEMA``) that
``--json`` prints and ``Analysis.from_dict`` reads back (``memory``, ``transfers`` and ``processes``,
added later, may be absent).
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable

from ..timeline.batch import SpanBatch
from ..timeline.spans import Span
from . import findings as _findings
from .kernels import GROUPS, kernel_table, self_time
from .launches import launches
from .memory import memory
from .processes import processes
from ..timeline.arrays import sorted_distinct as distinct
from .model import TraceData, queues_from_registry
from .regions import region_tree
from .transfers import transfers
from .report import device_name, region_rows
from .utilisation import timeline, utilisation
from .window import STEADY, Window, apply, as_window, select

SCHEMA = "cltrace.analysis/1"


@dataclass
class Analysis:
    """The answers for one trace. Times are integer (or mean/percentile float) nanoseconds."""

    source: str  # the file analysed, or "memory"
    wall: dict[str, int]  # t0_ns, t1_ns, wall_ns: first span to last, host timeline
    spans: int
    devices: list[dict[str, Any]]  # busy/idle split per device (see utilisation.Use.as_dict)
    queues: list[dict[str, Any]]  # the same per queue
    kernels: list[dict[str, Any]]  # the kernel table (kernels.KernelRow), by total device time
    launches: dict[str, Any]  # enqueue against device time, launch-bound share, queue depth
    findings: list[dict[str, Any]]  # rules that fired, most time at stake first (findings.Finding)
    regions: list[dict[str, Any]]  # the region tree rows (report.region_rows)
    timeline: dict[str, Any]  # per queue busy fraction in equal slices of the wall interval
    clocks: list[dict[str, Any]] = field(default_factory=list)  # per device: name and clock mapping
    memory: dict[str, Any] = field(default_factory=dict)  # live device bytes per context (analyzers.memory)
    transfers: list[dict[str, Any]] = field(default_factory=list)  # bandwidth per device and direction
    processes: list[dict[str, Any]] = field(default_factory=list)  # per process of a merged trace
    schema: str = SCHEMA
    window: dict[str, Any] = field(default_factory=dict)  # the part of the run analysed (window.Selection)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.as_dict(), indent=indent)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Analysis":
        if d.get("schema") != SCHEMA:
            raise ValueError(f"not a {SCHEMA} document (schema {d.get('schema')!r})")
        return cls(**d)

    def finding(self, rule: str) -> dict[str, Any] | None:
        """The finding of a rule (``"launch-bound"``, ...), or None when it did not fire."""
        return next((f for f in self.findings if f["rule"] == rule), None)

    def report(self, width: int | None = None) -> str:
        """The text report; ``width=None`` fits the terminal."""
        from .render import render_analysis

        return render_analysis(self, width=width)


def _load(spans_or_path: Any, meta: dict[str, Any] | None) -> tuple[SpanBatch | list[Span], dict[str, Any], str, Any]:
    if spans_or_path is None:
        from ..record.recorder import RECORDER

        RECORDER.flush(block=True)
        return RECORDER.batch(), _with_samples(RECORDER.metadata(), RECORDER), "memory", RECORDER.tracks
    if isinstance(spans_or_path, (str, os.PathLike)):
        from ..read import load_columns

        spans, m = load_columns(spans_or_path)
        return spans, {**m, **(meta or {})}, os.fspath(spans_or_path), None
    from ..record.recorder import RECORDER

    if not isinstance(spans_or_path, SpanBatch):
        spans_or_path = list(spans_or_path)
    return (spans_or_path, meta if meta is not None else _with_samples(RECORDER.metadata(), RECORDER),
            "memory", RECORDER.tracks)


def _with_samples(meta: dict[str, Any], recorder: Any) -> dict[str, Any]:
    """The recorder's metadata with its memory samples, as a file's reader adds them."""
    samples = recorder.memory.samples_by_label()
    return {**meta, "memory_samples": samples} if samples else meta


def analyze(spans_or_path: str | os.PathLike[str] | Iterable[Span] | SpanBatch | None = None,
            meta: dict[str, Any] | None = None, by_shape: bool = False, by: str | None = None,
            window: Window | str | None = STEADY) -> Analysis:
    """Analyse a trace file (``.json``/``.pftrace``), spans (a list of ``Span`` or a ``SpanBatch``),
    or (None) the recorder's spans.

    ``window`` is the part of the run every answer is about (``analyzers.window``): the steady state
    by default (the steps after the first, else from the first kernel launch; builds left out),
    ``None`` or ``"whole"`` the whole run, ``"2:12"`` steps 2 to 12, or a ``Window`` (steps, a time
    range, a region). ``by`` groups the kernel table by name and also ``"shape"`` (launch shape;
    ``by_shape=True`` is the same) or ``"callsite"`` (the user's line that launched it). Raises
    ``TraceFileError`` for a file that cannot be read, ``ValueError`` for an unknown ``by`` or a
    window the trace does not have (naming what it has).
    """
    if by is not None and by not in GROUPS:
        raise ValueError(f"by must be one of {', '.join(GROUPS)}, not {by!r}")
    w = as_window(window)
    spans, m, source, registry = _load(spans_or_path, meta)
    td = TraceData(spans, m)
    if registry is not None and not m.get("tracks"):
        named = queues_from_registry(registry, distinct(td.track[td.on_device]).tolist())
        td.queues.update(named)
    return analyse_columns(td, source, by_shape=by_shape, by=by, window=w)


def analyse_columns(td: TraceData, source: str = "memory", by_shape: bool = False,
                    by: str | None = None, window: Window | str | None = None) -> Analysis:
    """The analysis of columns already built; ``window`` as for ``analyze`` (here the whole run by default)."""
    sel = select(td, as_window(window))
    td = apply(td, sel)
    devices, queues = utilisation(td)
    selfs = self_time(td)
    la = launches(td)
    ctx = _findings.Context(td, devices, queues, la, selfs)
    found = _findings.run(ctx)
    clocks = [{"device": device_name(k, td.meta), **v} for k, v in (td.meta.get("clocks") or {}).items()
              if isinstance(v, dict)]
    return Analysis(
        source=source, wall={"t0_ns": td.t0, "t1_ns": td.t1, "wall_ns": td.wall_ns}, spans=td.n,
        devices=[u.as_dict() for u in devices], queues=[u.as_dict() for u in queues],
        kernels=[r.as_dict() for r in kernel_table(td, selfs, by_shape=by_shape, by=by)], launches=la.as_dict(),
        findings=[f.as_dict() for f in found], regions=region_rows(region_tree(td)), timeline=timeline(td),
        clocks=clocks, memory=memory(td), window=sel.as_dict(), transfers=transfers(td), processes=processes(td))
