"""OtlpSink: the SpanSink that streams spans to OTLP without ever blocking the traced program.

``write`` only queues (bounded; overflow is dropped and counted), worker threads convert
and export, ``close`` waits a bounded time, and undelivered spans are counted
(``stats()``) and reported in one log line.
"""
from __future__ import annotations

import logging
import random
import threading
import time
from collections import deque
from typing import Any, Mapping

from opentelemetry import trace as otel_trace

from ...record import otel_context
from ...timeline.batch import SpanBatch, as_batch
from ..base import TraceContext
from .batch import Batch, BatchExporter
from .config import (
    DEFAULT_CLOSE_TIMEOUT_S,
    DEFAULT_FAILING_CLOSE_TIMEOUT_S,
    DEFAULT_MAX_BATCH_SPANS,
    DEFAULT_MAX_QUEUE_SPANS,
    DEFAULT_MAX_REQUEST_BYTES,
    DEFAULT_TIMEOUT_S,
    ENDPOINT_VARS,
    env,
    timeout_from_env,
)
from .diagnose import diagnose
from .logs import ExporterLogFilter
from .mapping import Mapper
from .resource import base_resource
from .transport import destination

log = logging.getLogger("cltrace")

_perf = time.perf_counter_ns


class OtlpSink:
    """Streams spans to an OTLP endpoint, a user's ``SpanExporter`` or a ``TracerProvider``.

    ``endpoint``: ``host:port`` or URL (default: ``OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT``,
    else localhost:4317 / :4318), read as ``config.resolve_target`` says (``https://`` TLS,
    ``http://`` plain text, a bare ``host:port`` as OTEL_EXPORTER_OTLP_[TRACES_]INSECURE says,
    TLS without it). ``protocol``: ``"grpc"`` or ``"http/protobuf"`` (see
    ``resolve_protocol``). ``headers``: dict or ``"k=v,k2=v2"``. ``timeout_s``: per export
    request, retries included (default: OTEL_EXPORTER_OTLP_TIMEOUT, else 2 s).
    ``close_timeout_s``: the most ``close`` waits for delivery; ``failing_close_timeout_s``: the
    most it waits once exports have been failing (a dead or silent collector), counted from the
    later of the close and the failure. ``max_request_bytes`` keeps
    requests under collectors' usual 4 MiB limit. Counters: ``delivered``, ``failed`` (export
    refused or timed out), ``dropped`` (never sent: queue full, written after close, or still
    queued when close gave up).

    With its own OTLP exporters the sink runs ``senders`` workers, each with its own exporter
    (an exporter is never called concurrently), so one encodes while another waits on the
    network; a user's exporter or tracer provider gets one worker. ``sdk_encoder=True`` sends
    ``ReadableSpan`` batches through the stock encoder instead of cltrace's direct encoding.

    While attached, regions join the OpenTelemetry context both ways (``record.otel_context``):
    one opened under an SDK span is exported as its child, and one open is the parent of SDK
    spans started inside it.
    """

    def __init__(self, endpoint: str | None = None, protocol: str | None = None,
                 headers: Mapping[str, str] | str | None = None, timeout_s: float | None = None,
                 exporter: Any = None, service_name: str | None = None, *,
                 tracer_provider: Any = None, close_timeout_s: float = DEFAULT_CLOSE_TIMEOUT_S,
                 failing_close_timeout_s: float = DEFAULT_FAILING_CLOSE_TIMEOUT_S,
                 max_queue_spans: int = DEFAULT_MAX_QUEUE_SPANS,
                 max_batch_spans: int = DEFAULT_MAX_BATCH_SPANS,
                 max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
                 senders: int = 2, sdk_encoder: bool = False) -> None:
        if exporter is not None and tracer_provider is not None:
            raise ValueError("OtlpSink: pass exporter or tracer_provider, not both")
        if timeout_s is None:
            timeout_s = timeout_from_env() or DEFAULT_TIMEOUT_S
        if not timeout_s > 0 or not close_timeout_s >= 0 or not failing_close_timeout_s >= 0:
            raise ValueError("OtlpSink: timeout_s must be > 0, close_timeout_s and failing_close_timeout_s >= 0")
        if min(max_queue_spans, max_batch_spans, max_request_bytes, senders) < 1:
            raise ValueError("OtlpSink: max_queue_spans, max_batch_spans, max_request_bytes "
                             "and senders must be >= 1")
        self.timeout_s = float(timeout_s)
        self.close_timeout_s = float(close_timeout_s)
        self.failing_close_timeout_s = float(failing_close_timeout_s)
        self.max_queue_spans = max_queue_spans
        self.max_batch_spans = max_batch_spans
        self.max_request_bytes = max_request_bytes
        self.service_name = service_name
        self._base_resource = base_resource(service_name)
        self._last_error: str | None = None
        self._stopping = False
        self._dest = dest = destination(endpoint, protocol, headers, self.timeout_s, exporter,
                                        tracer_provider, senders, sdk_encoder, self._error)
        self.protocol = dest.protocol
        self.endpoint = dest.endpoint
        # What its own exporters dial, scheme included (plain text or TLS as decided here): children reach
        # the collector the same way. None for a user's exporter or tracer provider.
        self.url = dest.target.url if dest.target is not None else None
        self.exporters = dest.exporters
        if dest.own and not dest.wire:
            self.max_batch_spans = min(max_batch_spans, 512)  # the SDK encoder cannot split by size
        self.delivered = 0
        self.failed = 0
        self.dropped = 0
        self.unanswered = 0  # of ``failed``: sent, with no answer when close gave up
        self._given_up = False
        self.exports = 0
        self.failed_exports = 0
        self.received = 0
        self._warned = False
        self._failing_since: float | None = None  # monotonic time of the first failure since the last success
        self._queue: deque[tuple[bool, list]] = deque()
        self._queued = 0
        self._inflight = 0
        self._cv = threading.Condition()
        self._closing = False
        self._closed = False
        self._workers: list[threading.Thread] = []
        self._log_filter = ExporterLogFilter(self._error)
        self._ctx: TraceContext | None = None
        self.mapper: Mapper | None = None
        self._batches: BatchExporter | None = None
        self.trace_id = 0
        self._begin_ns: int | None = None
        self._claimed = False

    # -- SpanSink -------------------------------------------------------------------------
    def start(self, ctx: TraceContext) -> None:
        if self._ctx is not None:
            return
        self._ctx = ctx
        self._begin_ns = _perf()
        current = otel_trace.get_current_span().get_span_context()  # the program's OpenTelemetry span, if any
        salt = random.getrandbits(32) or 1
        if current.is_valid:
            ids = (salt << 32, current.trace_id, current.span_id, current.is_remote)
        else:
            ids = (salt << 32, random.getrandbits(128) or 1, None, False)
        # Regions join the OpenTelemetry context under these ids (shared by every attached OTLP sink).
        key, self.trace_id, root_parent, root_remote = otel_context.claim(*ids)
        self._claimed = True
        self.mapper = Mapper(ctx, self.trace_id, key >> 32, root_parent, root_remote)
        dest = self._dest
        self._batches = BatchExporter(ctx, self.mapper, self._base_resource, wire=dest.wire,
                                      processor=dest.processor, provider_resource=dest.resource,
                                      max_request_bytes=self.max_request_bytes, on_error=self._error)
        self._log_filter.install()
        for i, exp in enumerate(self.exporters):
            t = threading.Thread(target=self._run, args=(exp,), name=f"cltrace-otlp-{i}", daemon=True)
            self._workers.append(t)
            t.start()

    def write(self, batch: SpanBatch) -> None:
        """Queue a batch for the workers; never waits. What does not fit is dropped and counted."""
        n = len(batch)
        if not n:
            return
        with self._cv:
            self.received += n
            if self._closed or not self._workers:
                self.dropped += n
                return
            room = self.max_queue_spans - self._queued
            if room < n:
                self.dropped += n - max(room, 0)
                if room <= 0:
                    return
                batch = as_batch(batch, self._ctx.tables).take(slice(0, room))
                n = room
            self._queue.append((False, list(batch)))
            self._queued += n
            self._cv.notify()

    def flush(self, meta: dict[str, Any]) -> None:
        with self._cv:
            self._cv.notify_all()

    def close(self, meta: dict[str, Any]) -> None:
        """Send the root span, wait at most ``close_timeout_s`` for delivery, report losses."""
        with self._cv:
            if self._closed:
                return
            self._closed = True
        try:
            self._finish(meta)
        except Exception as exc:
            log.warning("cltrace: closing the OTLP sink failed: %s", exc)
        finally:
            if self._claimed:
                self._claimed = False
                otel_context.release()
            if not any(t.is_alive() for t in self._workers):  # a worker left behind stays quiet
                self._log_filter.remove()

    def _finish(self, meta: dict[str, Any]) -> None:
        if not self._workers or self.mapper is None:
            return
        root = self.mapper.root(self._begin_ns or 0, _perf(), meta, self.stats())
        with self._cv:
            self.received += 1
            self._queue.append((True, [root]))
            self._queued += 1
            self._closing = True
            self._cv.notify_all()
        limit = self._wait_for_delivery()
        if any(t.is_alive() for t in self._workers):
            with self._cv:
                self.dropped += self._queued
                self._queue.clear()
                self._queued = 0
                # Sent but not answered by now (a collector that accepts and never replies): failed, said
                # as such; a worker left behind that hears back later changes no count.
                self.unanswered = self._inflight
                self.failed += self._inflight
                self._inflight = 0
                self._given_up = True
                if not self._last_error:
                    self._last_error = f"gave up after close_timeout_s={self.close_timeout_s:g}"
            if self._dest.own:
                self._stopping = True  # what the cut-short calls report is not the collector's doing
                for exp in self.exporters:
                    try:
                        exp.shutdown()  # also cuts short a retry, and a gRPC call, still in flight
                    except Exception:
                        pass
            # An HTTP request in flight cannot be cut short: its (daemon) worker is left behind.
            failing = self._failing_since is not None
            deadline = max(limit, time.monotonic() + 0.05) if failing else time.monotonic() + min(1.0, self.timeout_s)
            for t in self._workers:
                t.join(max(0.0, deadline - time.monotonic()))
        elif self._dest.own:
            for exp in self.exporters:
                try:
                    exp.shutdown()
                except Exception:
                    pass
        self._report()

    def _wait_for_delivery(self) -> float:
        """Wait until the workers have sent everything and left: at most ``close_timeout_s``, and at
        most ``failing_close_timeout_s`` past the close or the first failure, whichever came later.
        Returns the time limit it kept to."""
        start = time.monotonic()
        with self._cv:
            while True:
                limit = start + self.close_timeout_s
                if self._failing_since is not None:
                    limit = min(limit, max(start, self._failing_since) + self.failing_close_timeout_s)
                if not (self._queued or self._inflight):
                    break
                left = limit - time.monotonic()
                if left <= 0 or not any(t.is_alive() for t in self._workers):
                    return limit
                self._cv.wait(left)
        for t in self._workers:  # nothing left: they are on their way out
            t.join(max(0.0, limit - time.monotonic()))
        return limit

    # -- public helpers -------------------------------------------------------------------
    def force_flush(self, timeout_s: float | None = None) -> bool:
        """Wait (at most ``timeout_s``, default ``close_timeout_s``) until nothing is queued or in flight."""
        deadline = time.monotonic() + (self.close_timeout_s if timeout_s is None else timeout_s)
        with self._cv:
            self._cv.notify_all()
            while self._queued or self._inflight:
                left = deadline - time.monotonic()
                if left <= 0 or not any(t.is_alive() for t in self._workers):
                    return False
                self._cv.wait(left)
        return True

    def span_id(self, cltrace_id: int) -> int:
        """The OTel span id a cltrace span id is exported under (0: the ``cltrace.run`` root)."""
        if self.mapper is None:
            raise RuntimeError("OtlpSink.span_id: the sink has not been started")
        return self.mapper.span_id(cltrace_id)

    def stats(self) -> dict[str, Any]:
        with self._cv:
            return {
                "endpoint": self.endpoint,
                "protocol": self.protocol,
                "received": self.received,
                "delivered": self.delivered,
                "failed": self.failed,
                "dropped": self.dropped,
                "unanswered": self.unanswered,
                "queued": self._queued,
                "in_flight": self._inflight,
                "exports": self.exports,
                "failed_exports": self.failed_exports,
                "last_error": self._last_error,
            }

    def __repr__(self) -> str:
        return f"<OtlpSink {self.protocol} {self.endpoint}>"

    # -- workers --------------------------------------------------------------------------
    def _run(self, exporter: Any) -> None:
        me = threading.get_ident()
        self._log_filter.threads.add(me)
        try:
            self._send(exporter)
        finally:
            # A thread's ident is reused once it ends: a filter still holding it would take the records of
            # a later sink's worker (and their errors with them). The last worker of a closed sink removes it.
            f = self._log_filter
            f.threads.discard(me)
            if self._closing and not f.threads:
                f.remove()

    def _send(self, exporter: Any) -> None:
        cv = self._cv
        while True:
            with cv:
                while not self._queue and not self._closing:
                    cv.wait()
                if not self._queue:
                    return
                batch: Batch = []
                n = 0
                while self._queue and n < self.max_batch_spans:
                    is_record, items = self._queue.popleft()
                    take = self.max_batch_spans - n
                    if len(items) > take:
                        self._queue.appendleft((is_record, items[take:]))
                        items = items[:take]
                    batch.append((is_record, items))
                    n += len(items)
                self._queued -= n
                self._inflight += n
            results = self._batches.export(exporter, batch, n)
            with cv:
                if self._given_up:  # counted as failed (unanswered) at close
                    return
                for count, ok in results:
                    self.exports += 1
                    if ok:
                        self.delivered += count
                        self._failing_since = None
                    else:
                        self.failed += count
                        self.failed_exports += 1
                        if self._failing_since is None:
                            self._failing_since = time.monotonic()
                self._inflight -= n
                cv.notify_all()
                # At close the report says it; during the run, one early warning.
                warn = not self._warned and not self._closing and not all(ok for _, ok in results)
                if warn:
                    self._warned = True
            if warn:
                log.warning("cltrace: OTLP export to %s is failing (%s); tracing goes on, losses are "
                            "reported at exit", self.endpoint, self.diagnosis())

    def _error(self, message: str, final: bool = True) -> None:
        """Keep ``message`` as the last error (one not ``final`` only where there is none yet)."""
        if self._stopping:
            return
        if final or not self._last_error:
            self._last_error = message

    def diagnosis(self) -> str:
        """Why exports fail and what to change, in one short phrase (from the last error)."""
        return diagnose(self._last_error, self.protocol, self.endpoint, self._dest.target, self.timeout_s)

    def _report(self) -> None:
        st = self.stats()
        lost = st["received"] - st["delivered"]
        if lost <= 0:
            return
        why = self.diagnosis() if st["failed"] or st["last_error"] else "the queue was full"
        parts = [f"{st['failed'] - st['unanswered']:,} failed"] if st["failed"] > st["unanswered"] else []
        if st["unanswered"]:
            parts.append(f"{st['unanswered']:,} unanswered at close")
        if st["dropped"]:
            parts.append(f"{st['dropped']:,} unsent")
        log.warning("cltrace: OTLP: %d of %d spans not delivered to %s (%s; %s)", lost, st["received"],
                    self.endpoint, ", ".join(parts), why)


def otlp_sink_from_env(**kwargs: Any) -> OtlpSink | None:
    """An OtlpSink configured by the OTEL_EXPORTER_OTLP_* variables, or None when neither
    OTEL_EXPORTER_OTLP_TRACES_ENDPOINT nor OTEL_EXPORTER_OTLP_ENDPOINT is set."""
    if not env(*ENDPOINT_VARS):
        return None
    return OtlpSink(**kwargs)
