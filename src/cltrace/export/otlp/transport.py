"""Where spans go: a tracer provider, a user's exporter, or the SDK's OTLP gRPC and HTTP
exporters, taught to send requests cltrace already encoded. The exporters are the ``[otlp]`` extra;
a tracer provider or a user's exporter needs only the SDK.

They keep the SDK's transport, retries and the rest of its ``OTEL_EXPORTER_OTLP_*`` configuration
(headers, certificates, compression); where to connect and whether in plain text is cltrace's one
reading of the endpoint (``config.resolve_target``). An ``Encoded`` request goes out as it is,
anything else through the stock encoder.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

from opentelemetry.sdk.trace.export import SpanExportResult

from ...errors import MissingExtraError
from .config import GRPC, Target, parse_headers, resolve_protocol, resolve_target


class Encoded:
    """An OTLP ExportTraceServiceRequest already serialized; ``len`` is its span count."""

    __slots__ = ("payload", "count")

    def __init__(self, payload: bytes, count: int) -> None:
        self.payload = payload
        self.count = count

    def __len__(self) -> int:
        return self.count


def grpc_exporter(target: Target, headers: dict[str, str] | None, timeout_s: float,
                  on_error: Callable[[str], None]) -> tuple[Any, bool]:
    try:
        import grpc
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
    except ModuleNotFoundError:
        raise MissingExtraError("OTLP export", "otlp") from None

    def serialize(request: Any) -> bytes:
        return request if isinstance(request, bytes) else request.SerializeToString()

    class _Client:
        """The TraceService stub, sending already-encoded requests as they are and passing
        each refused call's status on (the exporter logs only some of them)."""

        def __init__(self, channel: Any) -> None:
            self.call = channel.unary_unary(
                "/opentelemetry.proto.collector.trace.v1.TraceService/Export",
                request_serializer=serialize,
                response_deserializer=ExportTraceServiceResponse.FromString,
            )

        def Export(self, request: Any, **kw: Any) -> Any:  # noqa: N802 (the stub's name)
            try:
                return self.call(request, **kw)
            except grpc.RpcError as exc:
                on_error(f"{exc.code().name}: {exc.details()}")
                raise

    class _Exporter(OTLPSpanExporter):
        def _initialize_channel_and_stub(self) -> None:  # also runs on reconnect
            super()._initialize_channel_and_stub()
            self._client = _Client(self._channel)

        def _translate_data(self, data: Any) -> Any:
            if isinstance(data, Encoded):
                return data.payload
            return super()._translate_data(data)

    return _Exporter(endpoint=target.url, insecure=target.insecure, headers=headers, timeout=timeout_s), True


def http_exporter(target: Target, headers: dict[str, str] | None, timeout_s: float,
                  on_error: Callable[[str], None]) -> tuple[Any, bool]:
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    except ModuleNotFoundError:
        raise MissingExtraError("OTLP export", "otlp") from None

    class _Exporter(OTLPSpanExporter):
        def export(self, spans: Any) -> Any:
            if isinstance(spans, Encoded):
                if self._shutdown:
                    return SpanExportResult.FAILURE
                res = self._client.export(spans.payload)
                error = getattr(res, "error", None)
                if not res.success and error is not None:  # the cause: the client logs only "gave up" for it
                    on_error(f"{type(error).__name__}: {error}")
                return SpanExportResult.SUCCESS if res.success else SpanExportResult.FAILURE
            return super().export(spans)

    exp = _Exporter(endpoint=target.url, headers=headers, timeout=timeout_s)
    # Older exporters have no payload client: fall back to ReadableSpans and the SDK encoder.
    return exp, callable(getattr(getattr(exp, "_client", None), "export", None))


@dataclass
class Destination:
    """Where a sink's spans go: ``exporters`` has one exporter per worker (``[None]`` for a
    tracer provider, whose span ``processor`` and ``resource`` are kept); ``own``: the sink
    made the exporters (connecting as ``target`` says) and shuts them down; ``wire``: they take
    ``Encoded`` requests."""

    protocol: str
    endpoint: str
    exporters: list[Any]
    processor: Any = None
    resource: Any = None
    own: bool = False
    wire: bool = False
    target: Target | None = None  # how the sink's own exporters connect


def destination(endpoint: str | None, protocol: str | None, headers: Mapping[str, str] | str | None,
                timeout_s: float, exporter: Any, tracer_provider: Any, senders: int,
                sdk_encoder: bool, on_error: Callable[[str], None]) -> Destination:
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
    target = resolve_target(endpoint, protocol)
    hdrs = parse_headers(headers)
    make = grpc_exporter if protocol == GRPC else http_exporter
    made = [make(target, hdrs, timeout_s, on_error) for _ in range(senders)]
    exporters = [e for e, _ in made]
    name = str(getattr(exporters[0], "_endpoint", None) or target.url)
    return Destination(protocol, name, exporters, own=True, wire=made[0][1] and not sdk_encoder, target=target)
