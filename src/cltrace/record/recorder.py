"""The recorder: hot-path capture of raw records, batched resolution, fan-out to sinks.

Data path, in one direction:

    record (hot path: a tuple appended to a deque, no wait, no dict)
      -> resolve (events -> device stamps -> host timeline; see resolve.py)
      -> sinks (exporters and the always-on statistics; see export/base.py)

Memory policy: unresolved records are capped at ``max_pending``; past it the
recorder first resolves what has completed, then waits on the oldest half
(back-pressure: the device is far behind the host). Resolved spans kept in
memory (for ``spans()``/late export) are capped at ``capacity``; past it,
``overflow="discard"`` drops new spans (the start of the run is kept) and
``overflow="ring"`` drops the oldest. Either way ``dropped`` counts them and
every exporter writes the count into the trace. Streaming sinks receive every
span regardless of the in-memory cap.
"""
from __future__ import annotations

import atexit
import collections
import itertools
import logging
import os
import threading
import time
from typing import Any, Callable

from .. import _state
from .._version import version
from ..timeline.clock import ClockRegistry
from ..timeline.resolve import Resolver
from ..timeline.spans import Span
from ..timeline.stats import Stats
from ..timeline.tracks import TrackRegistry

log = logging.getLogger("cltrace")

# Raw record layout (a plain tuple; the hot path builds nothing else):
# (cat, name, span_id, parent_id, path, thread_key, host_begin, host_end,
#  queue, ev0, ev1, attrs, status, error)
R_CAT, R_NAME, R_ID, R_PARENT, R_PATH, R_THREAD, R_HB, R_HE, R_QUEUE, R_EV0, R_EV1, R_ATTRS, R_STATUS, R_ERROR = range(14)

_ids = itertools.count(1)
new_id: Callable[[], int] = _ids.__next__  # atomic under the GIL

perf_ns = time.perf_counter_ns


class Recorder:
    """Process-wide span recorder. Use the module-level ``RECORDER``."""

    def __init__(self, capacity: int = 1_000_000, overflow: str = "discard",
                 max_pending: int = 65_536, flush_interval_s: float = 1.0) -> None:
        self.tracks = TrackRegistry()
        self.clocks = ClockRegistry()
        self.stats = Stats()
        self.resolver = Resolver(self.tracks, self.clocks)
        self.pending: collections.deque = collections.deque()
        self._spans: collections.deque[Span] = collections.deque()
        self._lock = threading.RLock()
        self.sinks: list[Any] = []
        self.dropped = 0
        self.recorded = 0
        self.start_ns = perf_ns()
        self.start_unix_ns = time.time_ns()
        self.configure(capacity, overflow, max_pending, flush_interval_s)
        self._flusher: threading.Thread | None = None
        self._stop_flusher = threading.Event()
        self.meta: dict[str, Any] = {}

    def configure(self, capacity: int | None = None, overflow: str | None = None,
                  max_pending: int | None = None, flush_interval_s: float | None = None) -> None:
        """Change the memory caps. ``overflow`` is ``"discard"`` or ``"ring"``."""
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
            self._room = self.max_pending - len(self.resolver.waiting)
        if flush_interval_s is not None:
            self.flush_interval_s = flush_interval_s

    # ---- hot path -------------------------------------------------------------
    def push(self, rec: tuple) -> None:
        """Append one raw record. Resolves in a batch only when the cap is reached."""
        pending = self.pending
        pending.append(rec)
        if len(pending) >= self._room:
            self._drain_backpressure()

    # ---- resolution -----------------------------------------------------------
    def _drain_backpressure(self) -> None:
        with self._lock:
            self.clocks.maybe_recalibrate()
            self._resolve(block=False)
            # Wait for the oldest so at most half the cap stays in flight: the next
            # drain is then max_pending // 2 pushes away, not one.
            excess = len(self.resolver.waiting) - self.max_pending // 2
            if excess > 0:
                self._resolve(block=True, limit=excess)

    def _resolve(self, block: bool, limit: int | None = None) -> list[Span]:
        pending = self.pending
        batch = []
        n = len(pending)
        popleft = pending.popleft
        for _ in range(n):
            batch.append(popleft())
        spans = self.resolver.resolve(batch, block=block, limit=limit)
        self._room = self.max_pending - len(self.resolver.waiting)
        if spans:
            self._deliver(spans)
        return spans

    def _deliver(self, spans: list[Span]) -> None:
        self.recorded += len(spans)
        self.stats.add(spans)
        for sink in list(self.sinks):
            try:
                sink.write(spans)
            except Exception as exc:  # an exporter must never break the traced program
                log.warning("cltrace: sink %r failed: %s", sink, exc)
        room = self.capacity - len(self._spans)
        if len(spans) <= room:
            self._spans.extend(spans)
        elif self.overflow == "ring":
            self._spans.extend(spans)
            extra = len(self._spans) - self.capacity
            for _ in range(extra):
                self._spans.popleft()
            self.dropped += extra
        else:
            if room > 0:
                self._spans.extend(spans[:room])
            self.dropped += len(spans) - max(room, 0)

    def flush(self, block: bool = True) -> None:
        """Resolve pending records (waiting for their events if ``block``) and flush sinks."""
        with self._lock:
            self.clocks.maybe_recalibrate()
            self._resolve(block=block)
            for sink in list(self.sinks):
                try:
                    sink.flush(self.metadata())
                except Exception as exc:
                    log.warning("cltrace: sink %r failed to flush: %s", sink, exc)

    def spans(self) -> list[Span]:
        """Resolved spans kept in memory (after a blocking flush)."""
        self.flush(block=True)
        return list(self._spans)

    def clear(self) -> None:
        """Forget recorded spans and statistics (tracks and clocks are kept)."""
        with self._lock:
            self.flush(block=True)
            self._spans.clear()
            self.stats = Stats()
            self.dropped = 0
            self.recorded = 0

    def metadata(self) -> dict[str, Any]:
        return {
            "cltrace.version": version(),
            "start_ns": self.start_ns,
            "start_unix_ns": self.start_unix_ns,
            "pid": os.getpid(),
            "dropped_spans": self.dropped,
            "recorded_spans": self.recorded,
            "capacity": self.capacity,
            "overflow": self.overflow,
            "clocks": self.clocks.metadata(),
            "devices": {k: vars(v) for k, v in self.tracks.devices.items()},
            **self.meta,
        }

    # ---- sinks ----------------------------------------------------------------
    def add_sink(self, sink: Any) -> None:
        with self._lock:
            sink.start(self)
            self.sinks.append(sink)
        self._ensure_flusher()

    def remove_sink(self, sink: Any) -> None:
        """Flush everything into ``sink`` and close it."""
        self.flush(block=True)
        with self._lock:
            if sink in self.sinks:
                self.sinks.remove(sink)
            sink.close(self.metadata())

    def export(self, sink: Any) -> None:
        """Write the spans kept in memory to a sink in one go and close it."""
        spans = self.spans()
        sink.start(self)
        sink.write(spans)
        sink.close(self.metadata())

    def _ensure_flusher(self) -> None:
        if self._flusher is not None and self._flusher.is_alive():
            return
        self._stop_flusher.clear()
        t = threading.Thread(target=self._flush_loop, name="cltrace-flusher", daemon=True)
        self._flusher = t
        t.start()

    def _flush_loop(self) -> None:
        while not self._stop_flusher.wait(self.flush_interval_s):
            if not self.sinks:
                return
            try:
                self.flush(block=False)
            except Exception as exc:
                log.warning("cltrace: background flush failed: %s", exc)

    def shutdown(self) -> None:
        """Flush and close every sink (runs at exit)."""
        self._stop_flusher.set()
        for sink in list(self.sinks):
            try:
                self.remove_sink(sink)
            except Exception as exc:
                log.warning("cltrace: closing %r failed: %s", sink, exc)


RECORDER = Recorder()
push = RECORDER.push


def enable() -> None:
    _state.ENABLED = True


def disable() -> None:
    _state.ENABLED = False


def is_enabled() -> bool:
    return _state.ENABLED


@atexit.register
def _at_exit() -> None:
    RECORDER.shutdown()

