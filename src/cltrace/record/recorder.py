"""The recorder: hot-path capture of raw records, resolution on a worker thread, fan-out to sinks.

Data path, in one direction:

    record (hot path, the user's thread: a tuple appended to a deque, no wait, no lock; timeline/raw.py)
      -> resolve (worker thread "cltrace-resolver", in chunks: events -> stamps -> host timeline;
         one ``SpanBatch`` of columns per chunk; see timeline/resolve.py)
      -> statistics, the in-memory store and every sink, each fed the whole batch

Events (native path): the hot path trades each command's event for a ticket of the reaper
(timeline/_reaper.c) and the launching thread itself reads stamps in batches: every so many commands,
when its queue has caught up, it waits on its newest command there (done already; never a finish,
which could wait on another thread's command held back by a user event) and reads and releases what
it launched there, without the GIL. On NVIDIA's driver a read costs ~1 us there and 4-8 us at any other moment, and any
other thread's driver calls slow each enqueue by as much; so while the program launches, no other
thread reads a ticket younger than the reaper's ``stale_ns``. The reaper thread reads the rest: once
the program has been quiet for a moment, or the device was behind (the harvest declined).
``tickets_above`` (default 0) keeps the first records waiting on their Events instead.

Memory policy: records not yet resolved (queued here or waiting for their commands) past
``max_pending`` wake the worker; the launching thread never waits, for the device or for us (a
training loop that runs ahead of a busy device keeps its lead: a backlog of commands in flight is
memory, not a reason to stop the program). Past ``hard_cap`` records are dropped and counted
(``lost``: missing from every output, said at ``stop()``): the memory budget (``memory_budget_mb``,
default 512, ``CLTRACE_MEMORY_MB``) over what a record costs (~300 B with the reaper, twice without:
the record holds the driver's event), and never below four times ``max_pending`` plus one chunk. Resolved spans kept in memory (for
``spans()``, reports and late export) are capped at ``capacity`` (about 110 B each);
``overflow="discard"`` drops new spans (the start of the run is kept), ``overflow="ring"``
drops the oldest; ``memory_dropped`` counts them. Streaming sinks receive every span.
"""
from __future__ import annotations

import atexit
import collections
import itertools
import logging
import os
import threading
import time
from types import MappingProxyType
from typing import Any, Callable, Mapping

from .. import _state
from .._version import version
from ..errors import OutputError
from ..timeline import host, stamps
from ..timeline.batch import SpanBatch, Tables
from ..timeline.clock import ClockRegistry
from ..timeline.raw import R_EV0, R_EV1
from ..timeline.resolve import Resolver
from ..timeline.spans import Span
from ..timeline.stats import Stats
from ..timeline.step_table import StepTable
from ..timeline.tracks import TrackRegistry
from . import heap, job, switch
from .fanout import Fanout
from .memory import Ledger

log = logging.getLogger("cltrace")

_ids = itertools.count(1)
new_id: Callable[[], int] = _ids.__next__  # atomic under the GIL

perf_ns = time.perf_counter_ns

CHUNK = 4096  # headroom past the hard cap
RECORD_BYTES = 300  # what a record waiting to be resolved takes (tuple, ints, attrs shared), with the reaper
DEFAULT_MEMORY_MB = 512.0


def budget_from_env() -> float:
    """``CLTRACE_MEMORY_MB``: the records' memory budget; a value that is not a positive number is one
    warning and the default."""
    raw = os.environ.get("CLTRACE_MEMORY_MB", "").strip()
    if not raw:
        return DEFAULT_MEMORY_MB
    try:
        mb = float(raw)
        if not 0 < mb < 1 << 30:
            raise ValueError
    except ValueError:
        log.warning("cltrace: CLTRACE_MEMORY_MB=%r is not a positive number of MB: using %d", raw[:40],
                    DEFAULT_MEMORY_MB)
        return DEFAULT_MEMORY_MB
    return mb
STEP_ROWS = 8192  # records the worker resolves per step at most (each pass over them holds the GIL)
MIN_STEP_ROWS = STEP_ROWS // 2  # fewer left after a step wait for the next wake (resolve_interval_s)
FIRST_FLUSH_S = 0.25  # first bytes on disk this soon after the first sink is attached
FIRST_CHUNK = 256  # records a step until the first device's clock has been flushed
MERGE_ROWS = 1 << 18  # rows of a merged block of the in-memory store


class Recorder:
    """Process-wide span recorder. Use the module-level ``RECORDER``.

    It is the ``TraceContext`` (export/base.py) of the sinks it feeds: ``tracks``, ``tables``, ``start_ns``,
    ``start_unix_ns``, ``memory``, ``steps``, ``process_names``, ``metadata()`` and ``now_ns()``.

    The launching threads' side (``regions.py``, ``programs/launcher.py``'s generated launchers and
    ``_region.c``, which read these by name): append a record to ``pending``; once ``len(pending) >= room``,
    call ``make_room()``; with the reaper, a record pushed while ``tickets_above`` or more wait carries
    tickets in place of its events."""

    process_names: Mapping[int, str] = MappingProxyType({})  # one process, named after the program

    def __init__(self, capacity: int = 1_000_000, overflow: str = "discard",
                 max_pending: int = 65_536, flush_interval_s: float = 1.0, resolve_interval_s: float = 0.05,
                 tickets_above: int = 0, memory_budget_mb: float | None = None) -> None:
        self.tracks = TrackRegistry()
        self.steps = StepTable()  # a scheduled session's traced steps (capture/stepper.py)
        self.gate: Callable[[SpanBatch], SpanBatch] | None = None  # set by a schedule: withholds warm-up
        self.clocks = ClockRegistry()
        self.tables = Tables()
        self.stats = Stats()
        self.resolver = Resolver(self.tracks, self.clocks, self.tables)
        self.memory = Ledger()  # device memory allocations: a side channel, see memory.py
        self.pending: collections.deque = collections.deque()
        self._store: collections.deque[SpanBatch] = collections.deque()
        self._stored = 0
        self._lock = threading.RLock()
        self._fanout = Fanout()
        self.sinks: list[Any] = []
        self.memory_dropped = 0
        self.lost = 0
        self.recorded = 0
        self.start_ns = perf_ns()
        self.start_unix_ns = time.time_ns()
        self.room = max_pending
        self.tickets_above = tickets_above
        self.switch_interval_s = switch.from_env()
        self.memory_budget_mb = budget_from_env() if memory_budget_mb is None else float(memory_budget_mb)
        self.configure(capacity, overflow, max_pending, flush_interval_s, resolve_interval_s, tickets_above)
        self._worker: threading.Thread | None = None
        self._wake = threading.Event()
        self._stop_worker = threading.Event()
        self._next_flush = 0.0
        self._clocks_flushed = 0
        self.meta: dict[str, Any] = {}

    def configure(self, capacity: int | None = None, overflow: str | None = None,
                  max_pending: int | None = None, flush_interval_s: float | None = None,
                  resolve_interval_s: float | None = None, tickets_above: int | None = None,
                  switch_interval_s: float | None = None, memory_budget_mb: float | None = None) -> None:
        """Change the memory caps and the worker's pace. ``memory_budget_mb``: what records not yet
        resolved may take before new ones are dropped (``hard_cap``); ``overflow`` is ``"discard"`` or ``"ring"``;
        ``tickets_above``: records waiting past which new ones hold the reaper's tickets, not events
        (native path; 0: always); ``switch_interval_s``: the interpreter's switch interval while
        tracing (record/switch.py; 0: leave it alone), from the next start on."""
        if capacity is not None:
            if capacity < 1:
                raise ValueError("capacity must be >= 1")
            self.capacity = capacity
        if overflow is not None:
            if overflow not in ("discard", "ring"):
                raise ValueError("overflow must be 'discard' or 'ring'")
            self.overflow = overflow
        if max_pending is not None:
            self.max_pending = max(16, max_pending)
            self.room = self.max_pending - len(self.resolver.waiting)
        if flush_interval_s is not None:
            self.flush_interval_s = flush_interval_s
        if resolve_interval_s is not None:
            self.resolve_interval_s = resolve_interval_s
        if tickets_above is not None:
            if tickets_above < 0:
                raise ValueError("tickets_above must be >= 0")
            self.tickets_above = tickets_above
        if memory_budget_mb is not None:
            if not memory_budget_mb > 0:
                raise ValueError("memory_budget_mb must be > 0")
            self.memory_budget_mb = float(memory_budget_mb)
        if switch_interval_s is not None:
            if not switch_interval_s >= 0:
                raise ValueError("switch_interval_s must be >= 0 (0: leave the interpreter's alone)")
            self.switch_interval_s = switch_interval_s

    @property
    def dropped(self) -> int:
        """Spans recorded but not kept in memory (``lost`` ones included)."""
        return self.memory_dropped + self.lost

    # ---- hot path -------------------------------------------------------------
    def push(self, rec: tuple) -> None:
        """Append one raw record. Never resolves; past the cap, waits for the device only."""
        pending = self.pending
        pending.append(rec)
        if len(pending) >= self.room:
            self.make_room()

    def make_room(self) -> None:
        """Called by the launching thread when the backlog reaches its cap: wake the worker. Never waits:
        records waiting for commands still running are memory, up to ``hard_cap``; past it new records
        are dropped and counted (``lost``, said at ``stop()``)."""
        self._ensure_worker()
        if not self._wake.is_set():  # set() takes the Event's lock: at launch rates the launching
            self._wake.set()         # threads held it so often that the worker, waking, starved on it
        pending = self.pending
        if len(pending) + len(self.resolver.waiting) >= self.hard_cap:
            try:
                rec = pending.pop()
                self.lost += 1
            except IndexError:
                pass
            else:
                if type(rec[R_EV0]) is int:  # its tickets: the reaper may free their slots
                    stamps.done([rec[R_EV0], rec[R_EV1] or 0])
        self.room = min(len(pending) + max(16, self.max_pending // 16), self.hard_cap)

    @property
    def hard_cap(self) -> int:
        """Records unresolved past which new ones are dropped (the worker is behind, not the device):
        the memory budget over a record's cost, at least four times ``max_pending`` plus a chunk. With
        the reaper, records past ``tickets_above`` hold no driver event: half the cost."""
        per = RECORD_BYTES if stamps.REAPER is not None else 2 * RECORD_BYTES
        floor = (4 if stamps.REAPER is not None else 2) * self.max_pending + CHUNK
        return max(floor, int(self.memory_budget_mb * (1 << 20)) // per)

    # ---- the worker -------------------------------------------------------------
    def activate(self) -> None:
        """Start resolving in the background (tracing was switched on)."""
        switch.lower(self.switch_interval_s)
        self._ensure_worker()
        self._next_flush = time.monotonic() + FIRST_FLUSH_S

    def _ensure_worker(self) -> None:
        w = self._worker
        if w is not None and w.is_alive():
            return
        with self._lock:
            if self._worker is not None and self._worker.is_alive():
                return
            self._stop_worker.clear()
            t = threading.Thread(target=self._work, name="cltrace-resolver", daemon=True)
            self._worker = t
            t.start()

    def _work(self) -> None:
        while not self._stop_worker.is_set():
            self._wake.wait(self.resolve_interval_s)
            self._wake.clear()
            if not (_state.ENABLED or self.sinks):
                if not self.pending:
                    continue
            try:
                while True:
                    # Records waiting for their commands are asked again at every wake, new records or
                    # none: else a program that launches nothing more left them unresolved until stop().
                    if self.pending or self.resolver.waiting:
                        # Small first steps: the first spans and the clock reach the files at once,
                        # however slowly a chunk resolves (the pure-Python fallback on a busy core).
                        # Then steps of at most STEP_ROWS: each pass over a step is one C call that holds
                        # the GIL, and a launching thread waits for the whole of it (65 536 records a
                        # step held it 1-3 ms a pass on an H200 host). Each step costs some Python
                        # glue and a wait of up to a switch interval (``switch.DEFAULT_S`` while tracing)
                        # for the GIL after each write: small against a step's work.
                        n = STEP_ROWS if self._clocks_flushed else FIRST_CHUNK
                        with self._lock:
                            self._step(block=False, limit_records=n)
                    if self.sinks and (time.monotonic() >= self._next_flush
                                       or self.clocks.count != self._clocks_flushed):
                        self._flush_sinks()  # a new device's calibration reaches the files at once
                    if not self.pending or self._stop_worker.is_set():
                        break
                    if self._clocks_flushed and len(self.pending) < MIN_STEP_ROWS:
                        # What came in during the step waits for the next wake: back to back, a
                        # launch loop kept the worker at ~600 records a step, its glue paid each time
                        # (H200: 316 steps and 517 ms of the worker's CPU for 200k launches).
                        break
            except Exception as exc:  # the worker must survive anything a sink or driver throws
                log.warning("cltrace: background resolution failed: %s", exc)

    # ---- resolution -----------------------------------------------------------
    def _step(self, block: bool, limit_records: int | None = None, wait_limit: int | None = None) -> SpanBatch:
        """Resolve up to ``limit_records`` queued records (all if None) and deliver the batch."""
        pending = self.pending
        n = len(pending) if limit_records is None else min(limit_records, len(pending))
        # map over repeat runs in C, no bytecode between the pops: one stretch with the GIL (~16 ns a
        # record), where a comprehension's loop was preempted every switch interval by the launchers.
        batch = list(map(collections.deque.popleft, itertools.repeat(pending, n)))
        spans = self.resolver.resolve(batch, block=block, limit=wait_limit)
        self.room = self.max_pending - len(self.resolver.waiting)
        if spans.n:
            self._deliver(spans)
        return spans

    def _deliver(self, batch: SpanBatch) -> None:
        gate = self.gate
        if gate is not None:
            batch = gate(batch)
            if not batch.n:
                return
        self.recorded += batch.n
        self.stats.add(batch)
        self._fanout.write(list(self.sinks), batch, _sink_failed)
        room = self.capacity - self._stored
        n = batch.n
        if n <= room:
            self._keep(batch)
        elif self.overflow == "ring":
            self._keep(batch if n <= self.capacity else batch.take(slice(n - self.capacity, None)))
            extra = self._stored - self.capacity
            self.memory_dropped += max(0, n - self.capacity)
            while extra > 0:
                head = self._store[0]
                if head.n <= extra:
                    self._store.popleft()
                    self._stored -= head.n
                    extra -= head.n
                    self.memory_dropped += head.n
                else:
                    self._store[0] = head.take(slice(extra, None))
                    self._stored -= extra
                    self.memory_dropped += extra
                    extra = 0
        else:
            if room > 0:
                self._keep(batch.take(slice(0, room)))
            self.memory_dropped += n - max(room, 0)

    def _keep(self, batch: SpanBatch) -> None:
        store = self._store
        store.append(batch)
        self._stored += batch.n
        # Small batches are merged into blocks of ~MERGE_ROWS rows, never the whole store again:
        # each span is copied at most once, and no merge holds the GIL for long.
        small = rows = 0
        for b in reversed(store):
            if b.n >= MERGE_ROWS:
                break
            small += 1
            rows += b.n
        if small >= 64 or rows >= MERGE_ROWS:
            merged = SpanBatch.concat(self.tables, [store.pop() for _ in range(small)][::-1])
            store.append(merged)

    def flush(self, block: bool = True) -> None:
        """Resolve queued records (waiting for their commands if ``block``) and flush the sinks."""
        with self._lock:
            self._step(block=block)
            self._flush_sinks()

    def _flush_sinks(self) -> None:
        """Recalibrate when due, then make what the sinks have written durable, with fresh metadata."""
        with self._lock:
            self.clocks.maybe_recalibrate()
            meta = self.metadata()
            for sink in list(self.sinks):
                try:
                    sink.flush(meta)
                except Exception as exc:
                    log.warning("cltrace: sink %r failed to flush: %s", sink, exc)
            now = time.monotonic()
            if now >= self._next_flush:  # a flush for a new clock keeps the one due at FIRST_FLUSH_S
                self._next_flush = now + self.flush_interval_s
            self._clocks_flushed = self.clocks.count

    def batch(self) -> SpanBatch:
        """Resolved spans kept in memory, as one batch of columns (after a blocking flush)."""
        self.flush(block=True)
        with self._lock:
            return SpanBatch.concat(self.tables, list(self._store))

    def spans(self) -> list[Span]:
        """Resolved spans kept in memory (after a blocking flush), as ``Span`` objects."""
        return self.batch().spans()

    def clear(self) -> None:
        """Forget recorded spans and statistics and give their memory back (tracks and clocks are kept)."""
        with self._lock:
            self.flush(block=True)
            self._store.clear()
            self._stored = 0
            self.stats = Stats()
            self.memory_dropped = 0
            self.lost = 0
            self.recorded = 0
            self.memory.clear()
        heap.give_back()  # the store's columns, freed above, back to the OS (record/heap.py)

    @staticmethod
    def now_ns() -> int:
        """The trace's present: ``perf_counter_ns`` now."""
        return perf_ns()

    def metadata(self) -> dict[str, Any]:
        """What every output records about the run. ``dropped_spans`` counts spans missing from a
        streamed file (lost before any sink saw them); ``memory_dropped_spans`` those not kept in memory."""
        memory = self.memory.metadata()
        return {
            "cltrace.version": version(),
            "start_ns": self.start_ns,
            "start_unix_ns": self.start_unix_ns,
            "pid": os.getpid(),
            "host": host.identity(),
            "job": job.identity(),
            "dropped_spans": self.lost,
            "memory_dropped_spans": self.memory_dropped,
            "recorded_spans": self.recorded,
            "capacity": self.capacity,
            "overflow": self.overflow,
            "clocks": self.clocks.metadata(),
            "devices": {k: vars(v) for k, v in self.tracks.devices.items()},
            **({"memory": memory} if memory else {}),
            **self.meta,
        }

    def reset_after_fork(self) -> list[Any]:
        """In a forked child: start afresh, as a recorder of this process (tracing stays as it was).

        The parent's records, spans, worker, locks (another thread may have held one at the fork)
        and device state are dropped; its sinks are abandoned (``abandon()`` where they have it),
        never written or closed: their outputs are the parent's. Called by ``os.register_at_fork``.
        """
        self.pending.clear()  # the same deque: the hot path holds it
        self.tracks = TrackRegistry()
        self.clocks = ClockRegistry()
        self.tables = Tables()
        self.stats = Stats()
        self.resolver = Resolver(self.tracks, self.clocks, self.tables)
        self._store = collections.deque()
        self._stored = self.memory_dropped = self.lost = self.recorded = 0
        self._lock = threading.RLock()
        self._worker = None
        self._wake = threading.Event()
        self._stop_worker = threading.Event()
        self._next_flush = 0.0
        self._clocks_flushed = 0
        self.room = self.max_pending
        self.start_ns = perf_ns()
        self.start_unix_ns = time.time_ns()
        orphans, self.sinks = self.sinks, []
        for sink in orphans:
            abandon = getattr(sink, "abandon", None)
            if abandon is not None:
                try:
                    abandon()
                except Exception:
                    pass
        return orphans

    # ---- sinks ----------------------------------------------------------------
    def add_sink(self, sink: Any) -> None:
        with self._lock:
            sink.start(self)
            self.sinks.append(sink)
        self.activate()

    def remove_sink(self, sink: Any) -> None:
        """Resolve every record still waiting (delivered to all sinks), then close ``sink`` with final
        metadata. The other sinks are not flushed here: each is flushed on the worker's schedule or
        closed in turn (``stop()`` closing two files paid three rounds of flushes before)."""
        error = self.remove_sinks([sink]).get(id(sink))
        if error is not None:
            raise error

    def remove_sinks(self, sinks: list[Any]) -> dict[int, BaseException]:
        """``remove_sink`` for several sinks at once: one resolve, then their closes side by side
        (``Fanout.each``: each sink has a file of its own). Returns what each failing close raised, by
        ``id(sink)``; every sink is closed whatever the others do."""
        errors: dict[int, BaseException] = {}
        with self._lock:
            try:
                self._step(block=True)
                self.clocks.maybe_recalibrate()
            except Exception as exc:  # the sinks are closed even so, with what reached them
                errors.update((id(s), exc) for s in sinks)
            for s in sinks:
                if s in self.sinks:
                    self.sinks.remove(s)
            meta = self.metadata()
            self._fanout.each(sinks, lambda s: s.close(dict(meta)),
                              lambda s, exc: errors.setdefault(id(s), exc))
        return errors

    # How export() writes a trace file named by a path: path -> (sink writing ``<path>.partial``, the
    # call putting it in place once closed). Set by ``export.formats``, which this layer cannot import.
    file_writer: Callable[[str], tuple[Any, Callable[[], None]]] | None = None

    def export(self, out: str | os.PathLike[str] | Any) -> str | None:
        """Write the spans kept in memory to ``out`` in one go: a path (format from its suffix, as
        ``cltrace.start()`` takes it; written as ``<path>.partial`` and renamed when complete, and
        returned) or a sink (closed after). The metadata counts the spans memory did not keep as
        missing. A path that cannot be written raises ``OutputError``."""
        if not isinstance(out, (str, os.PathLike)):
            self._export(out)
            return None
        path = os.fspath(out)
        if self.file_writer is None:  # set whenever cltrace is imported
            raise OutputError(f"cannot write {path!r}: no trace writers loaded (import cltrace)")
        sink, finish = self.file_writer(path)
        try:
            self._export(sink)
        except OSError as exc:
            raise OutputError(f"cannot write the trace {path!r}: {exc.strerror or exc}; "
                              "choose a path in a folder you can write to") from None
        finish()
        return path

    def _export(self, sink: Any) -> None:
        batch = self.batch()
        with self.memory.replay():
            sink.start(self)
        sink.write(batch)
        meta = self.metadata()
        meta["dropped_spans"] = self.dropped
        sink.close(meta)

    def shutdown(self) -> None:
        """Flush and close every sink (runs at exit)."""
        self._stop_worker.set()
        self._wake.set()
        w = self._worker
        if w is not None and w is not threading.current_thread():
            w.join(timeout=2.0)  # its chunk in flight finishes; what is left is resolved below
        for sink in list(self.sinks):
            try:
                self.remove_sink(sink)
            except Exception as exc:
                log.warning("cltrace: closing %r failed: %s", sink, exc)
        stamps.stop_reaper()  # before the driver's own exit handlers; later tickets are read inline
        switch.restore()


def _sink_failed(sink: Any, exc: BaseException) -> None:
    """An exporter must never break the traced program: its failure is one warning."""
    log.warning("cltrace: sink %r failed: %s", sink, exc)


RECORDER = Recorder()
push = RECORDER.push
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=RECORDER.reset_after_fork)


@atexit.register
def _at_exit() -> None:
    RECORDER.shutdown()

