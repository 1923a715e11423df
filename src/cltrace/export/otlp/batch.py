"""One queued batch -> export calls: direct OTLP requests split under the size limit, or
``ReadableSpan`` objects for the SDK encoder, a user's exporter or a tracer provider."""
from __future__ import annotations

import threading
from typing import Any, Callable, Mapping

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from ..._version import version as _version
from ..base import TraceContext
from .encode import WireEncoder, chunks_by_size
from .mapping import Mapper, readable_span
from .resource import resource_attributes
from .transport import Encoded

# A batch: (is_record, items) parts; items are cltrace Spans, or Mapper records (the root).
Batch = list[tuple[bool, list]]


class BatchExporter:
    """Exports batches for one run; safe to call from several workers, each with its own exporter.

    ``wire``: encode requests directly (the exporters take ``Encoded``); ``processor``: a
    tracer provider's span processor that gets each span instead of an exporter.
    ``on_error`` receives the message of an export that raised.
    """

    def __init__(self, ctx: TraceContext, mapper: Mapper, base: Mapping[str, Any], *, wire: bool,
                 processor: Any, provider_resource: Any, max_request_bytes: int,
                 on_error: Callable[[str], None]) -> None:
        self.ctx = ctx
        self.mapper = mapper
        self.base = base
        self.encoder = WireEncoder(mapper, "cltrace", _version()) if wire else None
        self.processor = processor
        self.provider_resource = provider_resource
        self.max_request_bytes = max_request_bytes
        self.on_error = on_error
        self.scope = InstrumentationScope("cltrace", _version())
        self._resource_key = -1
        self._resource: Any = None
        self._resource_bytes = b""
        self._lock = threading.Lock()

    def export(self, exporter: Any, batch: Batch, n: int) -> list[tuple[int, bool]]:
        """Export one batch of ``n`` spans (in several requests if it is large): [(spans, delivered?)]."""
        try:
            self._refresh_resource()
            if self.encoder is not None:
                return self._export_encoded(exporter, batch)
            return self._export_readable(exporter, batch, n)
        except Exception as exc:
            self.on_error(f"{type(exc).__name__}: {exc}")
            return [(n, False)]

    def _export_encoded(self, exporter: Any, batch: Batch) -> list[tuple[int, bool]]:
        enc = self.encoder
        root_remote = self.mapper.root_parent_remote
        body: list[bytes] = []
        for is_record, items in batch:
            if is_record:
                body += [enc.encode_record(r, root_remote) for r in items]
            else:
                body += map(enc.encode, items)
        out = []
        for chunk in chunks_by_size(body, self.max_request_bytes):
            payload = enc.request(self._resource_bytes, chunk)
            try:
                ok = exporter.export(Encoded(payload, len(chunk))) == SpanExportResult.SUCCESS
            except Exception as exc:
                self.on_error(f"{type(exc).__name__}: {exc}")
                ok = False
            out.append((len(chunk), ok))
        return out

    def _export_readable(self, exporter: Any, batch: Batch, n: int) -> list[tuple[int, bool]]:
        mapper = self.mapper
        res, scope = self._resource, self.scope
        key = mapper.key
        root_remote = mapper.root_parent_remote
        spans = []
        for is_record, items in batch:
            if is_record:
                spans += [readable_span(r, mapper.trace_id, res, scope, root_remote and r[1] == key)
                          for r in items]
            else:
                for s in items:
                    tid, _, remote = mapper.place(s)
                    spans.append(readable_span(mapper.convert(s), tid, res, scope, remote))
        if self.processor is not None:
            for s in spans:
                self.processor.on_end(s)
            return [(n, True)]
        return [(n, exporter.export(spans) == SpanExportResult.SUCCESS)]

    def _refresh_resource(self) -> None:
        """(Re)build the resource when the trace has seen new OpenCL devices."""
        ndev = len(self.ctx.tracks.devices)
        if ndev == self._resource_key:
            return
        with self._lock:
            attrs = resource_attributes(self.ctx, self.base)
            if self.provider_resource is not None:
                attrs = {**attrs, **dict(self.provider_resource.attributes)}
            self._resource = Resource(attrs)
            if self.encoder is not None:
                self._resource_bytes = self.encoder.resource(attrs)
            self._resource_key = ndev
