"""A scheduled session: step boundaries, what each step records, and the cycles handed to
``on_trace_ready``.

``step()`` ends the open step and begins the next (``steps(iterable)`` does it per item). A
step's phase (``schedule.py``) sets the tracing flag while it runs: skipped and waited steps
record nothing, warm-up and active steps are traced, each as a root span ``step N``. Outside
steps (before the first, after the last) tracing stays on until the schedule is done.

Which step a span belongs to is decided by its own host begin against the step table, on the
worker, whenever it is resolved: the recorder's gate withholds every span that began in a
warm-up step from every output, the statistics and memory; the collector (a sink) keeps the
spans of each cycle's active steps. When a cycle's last active step ends, the spans still in
flight are resolved (one blocking flush: the cycle's device work must finish) and
``on_trace_ready`` gets the ``Cycle``. The default handler writes it next to each output file.
"""
from __future__ import annotations

import logging
import os
import threading
from collections import Counter
from typing import Any, Callable, Iterable, Iterator, TypeVar

import numpy as np

from .. import _state
from ..export.base import TraceContext, partial_path, put_in_place
from ..export.formats import format_for, sink_for, suffix
from ..record.recorder import RECORDER
from ..record.step_span import OpenStep
from ..timeline.arrays import sorted_distinct as distinct
from ..timeline.batch import SpanBatch, as_batch
from ..timeline.spans import Span
from .schedule import ACTIVE, DONE, TRACED, WARMUP, Schedule

log = logging.getLogger("cltrace")
T = TypeVar("T")


def cycle_path(path: str, number: int) -> str:
    """``run.json`` -> ``run.cycle1.json`` (the format's whole suffix kept: ``x.cycle1.speedscope.json``)."""
    end = suffix(format_for(path))
    return f"{path[:-len(end)]}.cycle{number}{end}"


class Cycle:
    """One active cycle, handed to ``on_trace_ready`` when its last active step ends (or tracing
    stops during it). ``steps``: its active step numbers (written); ``warmup``: the warm-up steps
    before them (traced, never written); ``begin_ns``/``end_ns``: the host interval of the active
    steps; ``batch``: their spans as columns (``spans()`` as objects)."""

    def __init__(self, number: int, steps: tuple[int, ...], warmup: tuple[int, ...], begin_ns: int,
                 end_ns: int, batch: SpanBatch, dropped: int, outputs: tuple[str, ...],
                 announce: Callable[[list[str]], None] | None = None, failed: bool = False) -> None:
        self.number = number
        self.steps = steps
        self.warmup = warmup
        self.begin_ns = begin_ns
        self.end_ns = end_ns
        self.batch = batch
        self.dropped = dropped  # spans of the cycle not kept (past the recorder's capacity)
        self.outputs = outputs  # the session's trace files when the cycle ended
        self._announce = announce
        self.paths: list[str] = []  # files written by write()
        self.failed = failed  # cut short by a failure: export() leaves its files <path>.partial

    def spans(self) -> list[Span]:
        return self.batch.spans()

    def metadata(self) -> dict[str, Any]:
        """The run's metadata (clocks, devices, schedule) with this cycle's counts."""
        meta = RECORDER.metadata()
        meta.update(recorded_spans=self.batch.n, dropped_spans=self.dropped, memory_dropped_spans=0)
        meta["cycle"] = {"number": self.number, "steps": list(self.steps), "warmup": list(self.warmup),
                         "begin_ns": self.begin_ns, "end_ns": self.end_ns}
        return meta

    def export(self, *outputs: str | os.PathLike[str] | Any) -> list[str]:
        """Write this cycle's spans to each output (a path, format from its suffix, or a sink);
        returns the paths written. A path is written as ``<path>.partial`` and renamed when complete,
        unless the cycle ``failed``."""
        written = []
        for out in outputs:
            path = os.fspath(out) if isinstance(out, (str, os.PathLike)) else None
            sink = sink_for(partial_path(path), format_for(path)) if path is not None else out
            sink.start(RECORDER)
            sink.write(self.batch)
            sink.close(self.metadata())
            if path is not None and self.failed:
                written.append(partial_path(path))  # an earlier file of this name stays as it was
            elif path is not None:
                put_in_place(path)  # written whole: an earlier file of this name is replaced only now
                written.append(path)
        return written

    def write(self) -> list[str]:
        """The default handler: ``run.cycleN.json`` next to each output file ``run.json`` (same for
        ``.pftrace`` and ``.speedscope.json``), one ``cltrace: wrote ...`` line unless quiet."""
        for out in self.outputs:
            path = cycle_path(out, self.number)
            try:
                self.paths += self.export(path)
            except Exception as exc:  # one output failing must not cost the others, nor the program
                log.warning("cltrace: writing cycle %d to %s failed: %s", self.number, path, exc)
        if self.paths and self._announce is not None:
            self._announce(self.paths)
        return self.paths

    def __repr__(self) -> str:
        return f"<Cycle {self.number} steps {list(self.steps)} {self.batch.n} spans>"


def write_cycle(cycle: Cycle) -> None:
    """The default ``on_trace_ready``."""
    cycle.write()


class _Collector:
    """A sink keeping the spans that began in each cycle's active steps until the cycle is handed out."""

    def __init__(self, stepper: "Stepper") -> None:
        self.table = RECORDER.steps
        self._lock = threading.Lock()
        self._parts: dict[int, list[SpanBatch]] = {}
        self._rows: Counter[int] = Counter()
        self._dropped: Counter[int] = Counter()

    def start(self, ctx: TraceContext) -> None:
        pass

    def write(self, batch: SpanBatch) -> None:
        batch = as_batch(batch, RECORDER.tables)
        idx = self.table.find_many(batch.host_begin)
        inside = idx >= 0
        if not inside.any():
            return
        safe = np.maximum(idx, 0)
        cycle = np.where(inside & (self.table.take("written", safe) == 1), self.table.take("cycle", safe), 0)
        for c in distinct(cycle[cycle > 0]).tolist():
            part = batch.take(cycle == c)
            with self._lock:
                room = RECORDER.capacity - self._rows[c]
                if part.n > room:
                    self._dropped[c] += part.n - max(room, 0)
                    if room <= 0:
                        continue
                    part = part.take(slice(0, room))
                self._parts.setdefault(c, []).append(part)
                self._rows[c] += part.n

    def take(self, cycle: int) -> tuple[SpanBatch, int]:
        """The spans kept for ``cycle`` (forgotten here), and how many were not kept."""
        with self._lock:
            parts = self._parts.pop(cycle, [])
            self._rows.pop(cycle, None)
            return SpanBatch.concat(RECORDER.tables, parts), self._dropped.pop(cycle, 0)

    def flush(self, meta: dict[str, Any]) -> None:
        pass

    def close(self, meta: dict[str, Any]) -> None:
        pass


class Stepper:
    """The step state of one scheduled session (made by ``start(schedule=...)``)."""

    def __init__(self, schedule: Schedule, on_trace_ready: Callable[[Cycle], Any] | None,
                 outputs: Callable[[], list[str]], announce: Callable[[list[str]], None] | None) -> None:
        self.schedule = schedule
        self.handler = on_trace_ready or write_cycle
        self._outputs = outputs
        self._announce = announce  # says where a cycle's files are (None: quiet)
        self.table = RECORDER.steps
        self.number = 0  # the next step's number
        self.counts: Counter[str] = Counter()
        self.withheld = 0  # spans that began in warm-up steps
        self.cycles_done = 0
        self._current: tuple[int, str, int, int, OpenStep | None] | None = None
        self._cycles: dict[int, dict[str, Any]] = {}
        self._lock = threading.RLock()
        self._collector = _Collector(self)

    # -- session ------------------------------------------------------------------------
    def attach(self) -> None:
        self.table.clear()
        RECORDER.gate = self._gate
        RECORDER.add_sink(self._collector)
        self._update_meta()
        _state.ENABLED = self.tracing()

    def detach(self) -> None:
        """After the session's sinks are closed: the recorder back to ungated."""
        if RECORDER.gate == self._gate:
            RECORDER.gate = None
        if self._collector in RECORDER.sinks:
            RECORDER.sinks.remove(self._collector)
        RECORDER.meta.pop("schedule", None)
        self.table.clear()

    def tracing(self) -> bool:
        """Whether the flag should be on now: in a traced step, or outside steps until the schedule is done."""
        cur = self._current
        if cur is not None:
            return cur[1] in TRACED
        return self.schedule.phase(self.number)[0] != DONE

    @property
    def in_step(self) -> bool:
        return self._current is not None

    # -- steps --------------------------------------------------------------------------
    def step(self, queue: Any = None) -> None:
        """End the open step (if any) and begin the next."""
        with self._lock:
            self.end_step()
            self.begin_step(queue)

    def begin_step(self, queue: Any = None) -> None:
        with self._lock:
            if self._current is not None:
                self.end_step()
            n = self.number
            self.number += 1
            phase, cycle = self.schedule.phase(n)
            self.counts[phase] += 1
            handle, idx = None, -1
            if phase in TRACED:
                _state.ENABLED = True
                handle = OpenStep(n, {"step": n, "phase": phase, "cycle": cycle}, queue)
                idx = self.table.open(n, handle.span_id, handle.begin_ns, cycle, phase == ACTIVE)
                rec = self._cycles.setdefault(cycle, {"steps": [], "warmup": [], "begin": None, "end": None})
                if phase == ACTIVE:
                    rec["steps"].append(n)
                    if rec["begin"] is None:
                        rec["begin"] = handle.begin_ns
                else:
                    rec["warmup"].append(n)
            else:
                _state.ENABLED = False
            self._current = (n, phase, cycle, idx, handle)

    def end_step(self) -> None:
        with self._lock:
            cur = self._current
            if cur is None:
                return
            self._current = None
            n, phase, cycle, idx, handle = cur
            if handle is not None:
                end = handle.end()
                self.table.close(idx, end)
                if phase == ACTIVE:
                    self._cycles[cycle]["end"] = end
            _state.ENABLED = self.tracing()
            if phase == ACTIVE and self.schedule.ends_cycle(n):
                self._ready(cycle)
            self._update_meta()

    def finish(self, failed: bool = False) -> None:
        """Tracing stops: end the open step and hand out a cycle cut short (if it has active steps);
        ``failed``: the traced work failed, so that cycle's files stay ``.partial`` (``Cycle.failed``)."""
        with self._lock:
            self.end_step()
            for cycle in sorted(self._cycles):
                if self._cycles[cycle]["steps"]:
                    self._ready(cycle, failed)
            self._cycles.clear()
            self._update_meta()

    def _ready(self, cycle: int, failed: bool = False) -> None:
        rec = self._cycles.pop(cycle)
        RECORDER.flush(block=True)  # every span of the cycle resolved and collected
        batch, dropped = self._collector.take(cycle)
        end = rec["end"] if rec["end"] is not None else rec["begin"]
        c = Cycle(cycle, tuple(rec["steps"]), tuple(rec["warmup"]), rec["begin"], end, batch, dropped,
                  tuple(self._outputs()), self._announce, failed)
        self.cycles_done += 1
        try:
            self.handler(c)
        except Exception as exc:  # a failing handler costs its cycle, never the traced program
            log.warning("cltrace: on_trace_ready failed for cycle %d: %s: %s", cycle, type(exc).__name__, exc)

    # -- the gate (worker thread) ---------------------------------------------------------
    def _gate(self, batch: SpanBatch) -> SpanBatch:
        """The batch without the spans that began in warm-up steps."""
        idx = self.table.find_many(batch.host_begin)
        inside = idx >= 0
        if not inside.any():
            return batch
        keep = ~inside | (self.table.take("written", np.maximum(idx, 0)) == 1)
        if keep.all():
            return batch
        self.withheld += int(batch.n - keep.sum())
        return batch.take(keep)

    def _update_meta(self) -> None:
        c = self.counts
        RECORDER.meta["schedule"] = {
            "schedule": str(self.schedule), "steps": self.number,
            "skipped": c["skip"], "waited": c["wait"], "warmup": c[WARMUP], "active": c[ACTIVE],
            "untraced_after_done": c[DONE], "cycles": self.cycles_done, "warmup_spans_withheld": self.withheld,
        }

    def summary(self) -> str:
        """One line: the schedule and what it did with the steps so far."""
        c = self.counts
        parts = [f"{c[k]} {label}" for k, label in (("skip", "skipped"), ("wait", "waited"),
                                                   (WARMUP, "warm-up (not written)"), (ACTIVE, "active"),
                                                   (DONE, "after the last cycle")) if c[k]]
        return (f"schedule {self.schedule}: {self.number} steps: {', '.join(parts) or 'none'}; "
                f"{self.cycles_done} cycle{'s' if self.cycles_done != 1 else ''} written")


_ACTIVE: Stepper | None = None


def current() -> Stepper | None:
    """The scheduled session's stepper, or None."""
    return _ACTIVE


def set_current(stepper: Stepper | None) -> None:
    global _ACTIVE
    _ACTIVE = stepper


def step(queue: Any = None) -> None:
    """Mark a step boundary: the open step ends, the next begins (call it at the top of each
    iteration; the end of tracing ends the last step). With ``queue`` (or the active queue of
    ``cltrace.set_queue``) the step also gets a device span. Without a schedule it does nothing."""
    s = _ACTIVE
    if s is not None:
        s.step(queue)


def steps(iterable: Iterable[T], queue: Any = None) -> Iterator[T]:
    """``for batch in cltrace.steps(loader):`` each item is a step, from when it is handed out
    until the next one is (so fetching the next item belongs to the step before it); the step
    ends when the loop does. ``queue``: as for ``step``. Without a schedule it yields the items
    and does nothing else."""
    it = iter(iterable)
    try:
        while True:
            try:
                item = next(it)
            except StopIteration:
                return
            s = _ACTIVE
            if s is not None:
                s.step(queue)
            yield item
    finally:
        s = _ACTIVE
        if s is not None:
            s.end_step()
