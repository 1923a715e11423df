"""Where spans go: a tracer provider, a user's exporter, or the SDK's OTLP gRPC and HTTP
exporters, taught to send requests cltrace already encoded.

They keep the SDK's transport, retries and ``OTEL_EXPORTER_OTLP_*`` configuration; an
``Encoded`` request goes out as it is, anything else through the stock encoder.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from opentelemetry.sdk.trace.export import SpanExportResult

from .config import GRPC, grpc_url, http_url, parse_headers, resolve_protocol


class Encoded:
    """An OTLP ExportTraceServiceRequest already serialized; ``len`` is its span count."""

    __slots__ = ("payload", "count")

    def __init__(self, payload: bytes, count: int) -> None:
        self.payload = payload
        self.count = count

    def __len__(self) -> int:
        return self.count


def grpc_exporter(endpoint: str | None, headers: dict[str, str] | None, timeout_s: float) -> tuple[Any, bool]:
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
        ExportTraceServiceResponse,
    )

    def serialize(request: Any) -> bytes:
        return request if isinstance(request, bytes) else request.SerializeToString()

    class _RawStub:
        """TraceService stub that sends already-encoded requests as they are."""

        def __init__(self, channel: Any) -> None:
            self.Export = channel.unary_unary(
                "/opentelemetry.proto.collector.trace.v1.TraceService/Export",
                request_serializer=serialize,
                response_deserializer=ExportTraceServiceResponse.FromString,
            )

    class _Exporter(OTLPSpanExporter):
        def _initialize_channel_and_stub(self) -> None:  # also runs on reconnect
            super()._initialize_channel_and_stub()
            self._client = _RawStub(self._channel)

        def _translate_data(self, data: Any) -> Any:
            if isinstance(data, Encoded):
                if isinstance(self._client, _RawStub):
                    return data.payload
                return ExportTraceServiceRequest.FromString(data.payload)
            return super()._translate_data(data)

    return _Exporter(endpoint=grpc_url(endpoint), headers=headers, timeout=timeout_s), True


def http_exporter(endpoint: str | None, headers: dict[str, str] | None, timeout_s: float) -> tuple[Any, bool]:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    class _Exporter(OTLPSpanExporter):
        def export(self, spans: Any) -> Any:
            if isinstance(spans, Encoded):
                if self._shutdown:
                    return SpanExportResult.FAILURE
                ok = self._client.export(spans.payload).success
                return SpanExportResult.SUCCESS if ok else SpanExportResult.FAILURE
            return super().export(spans)

    exp = _Exporter(endpoint=http_url(endpoint) if endpoint else None, headers=headers, timeout=timeout_s)
    # Older exporters have no payload client: fall back to ReadableSpans and the SDK encoder.
    return exp, callable(getattr(getattr(exp, "_client", None), "export", None))


@dataclass
class Destination:
    """Where a sink's spans go: ``exporters`` has one exporter per worker (``[None]`` for a
    tracer provider, whose span ``processor`` and ``resource`` are kept); ``own``: the sink
    made the exporters and shuts them down; ``wire``: they take ``Encoded`` requests."""

    protocol: str
    endpoint: str
    exporters: list[Any]
    processor: Any = None
    resource: Any = None
    own: bool = False
    wire: bool = False


def destination(endpoint: str | None, protocol: str | None, headers: Mapping[str, str] | str | None,
                timeout_s: float, exporter: Any, tracer_provider: Any, senders: int,
                sdk_encoder: bool) -> Destination:
    """A tracer provider, a user's exporter, or else ``senders`` OTLP exporters of our own."""
    if tracer_provider is not None:
        processor = getattr(tracer_provider, "_active_span_processor", None)
        if processor is None or not hasattr(processor, "on_end"):
            raise TypeError("OtlpSink: tracer_provider must be an opentelemetry.sdk.trace.TracerProvider")
        return Destination("tracer_provider", type(tracer_provider).__name__, [None],
                           processor=processor, resource=tracer_provider.resource)
    if exporter is not None:
        if not callable(getattr(exporter, "export", None)):
            raise TypeError("OtlpSink: exporter must be an opentelemetry SpanExporter (has export())")
        return Destination("exporter", type(exporter).__name__, [exporter])
    protocol = resolve_protocol(protocol, endpoint)
    hdrs = parse_headers(headers)
    make = grpc_exporter if protocol == GRPC else http_exporter
    made = [make(endpoint, hdrs, timeout_s) for _ in range(senders)]
    exporters = [e for e, _ in made]
    name = str(getattr(exporters[0], "_endpoint", None) or endpoint or protocol)
    return Destination(protocol, name, exporters, own=True, wire=made[0][1] and not sdk_encoder)
