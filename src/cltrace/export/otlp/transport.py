"""Where spans go: a tracer provider, a user's exporter, or the SDK's OTLP gRPC and HTTP
exporters, taught to send requests cltrace already encoded. The exporters are the ``[otlp]`` extra;
a tracer provider or a user's exporter needs only the SDK.

They keep the SDK's transport, retries and the rest of its ``OTEL_EXPORTER_OTLP_*`` configuration
(headers, certificates, compression); where to connect and whether in plain text is cltrace's one
reading of the endpoint (``config.resolve_target``). An ``Encoded`` request goes out as it is,
anything else through the stock encoder.

No public API of the SDK sends a request already encoded, or hands out a tracer provider's span
processor, so these build on its internals (``HOOKS``): on gRPC the exporter's
``_initialize_channel_and_stub`` (1.40 on: it sets ``_channel`` and ``_client``, ours sends bytes) and
``_translate_data``; on HTTP its payload client ``_client.export`` and ``_shutdown`` (1.45 on); a
``TracerProvider``'s ``_active_span_processor``. ``TESTED`` is the range of releases the tests ran with
(``pyproject.toml`` pins the same; ``tests/test_otlp_sdk.py`` checks the installed ones). A release without
an exporter's hooks sends through the SDK's own encoder (its public ``export``), never an AttributeError
from inside; a tracer provider whose processor cannot be found is one error naming the fix.
"""
from __future__ import annotations

from dataclasses import dataclass
from importlib import metadata
from typing import Any, Callable, Mapping

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SpanExportResult

from ...errors import CltraceError, MissingExtraError
from .config import GRPC, Target, parse_headers, resolve_protocol, resolve_target

SDK = "opentelemetry-sdk"
GRPC_DIST = "opentelemetry-exporter-otlp-proto-grpc"
HTTP_DIST = "opentelemetry-exporter-otlp-proto-http"
# The releases tested, per distribution (pyproject.toml pins the same): the SDK for the context and a tracer
# provider (1.25.0 and 1.45.2 run); the exporters, the [otlp] extra (1.45.0 and 1.45.2 run). Earlier exporters
# send, through the fallbacks below, but fail tests: 1.25 holds close for its whole backoff (~7 s) when the
# collector is gone; 1.40's own error text replaces cltrace's diagnosis (no "connection refused", no hint that
# the collector speaks plain text).
TESTED = {SDK: ">=1.25,<1.46", GRPC_DIST: ">=1.45,<1.46", HTTP_DIST: ">=1.45,<1.46"}
GRPC_HOOKS = ("_initialize_channel_and_stub", "_translate_data")  # methods of OTLPSpanExporter we override
HTTP_HOOKS = ("_client", "_shutdown")  # attributes of an HTTP OTLPSpanExporter our ``export`` reads
PROVIDER_HOOKS = ("_active_span_processor",)  # the attribute of a TracerProvider we read
# distribution -> (the first release with the hooks, what has them, their names)
HOOKS: dict[str, tuple[tuple[int, int], str, tuple[str, ...]]] = {
    SDK: ((1, 25), "TracerProvider", PROVIDER_HOOKS),
    GRPC_DIST: ((1, 40), "the gRPC OTLPSpanExporter", GRPC_HOOKS),
    HTTP_DIST: ((1, 45), "the HTTP OTLPSpanExporter", HTTP_HOOKS),
}


def release(dist: str) -> tuple[int, int] | None:
    """(major, minor) of an installed distribution; None where it is not installed or its version is not numbers."""
    try:
        major, minor = metadata.version(dist).split(".")[:2]
        return int(major), int(minor)
    except (metadata.PackageNotFoundError, ValueError):
        return None


def missing(obj: Any, names: tuple[str, ...]) -> list[str]:
    """The names ``obj`` (a class or an instance) does not have."""
    return [n for n in names if not hasattr(obj, n)]


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

    kw = dict(endpoint=target.url, insecure=target.insecure, headers=headers, timeout=timeout_s)
    if missing(OTLPSpanExporter, GRPC_HOOKS):  # a release before 1.40: the stock exporter, the SDK's encoder
        return OTLPSpanExporter(**kw), False
    exp = _Exporter(**kw)
    return exp, isinstance(getattr(exp, "_client", None), _Client)  # our client is in place: send our bytes


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
    # Releases before 1.45 have no payload client: ReadableSpans and the SDK encoder (the stock ``export``).
    return exp, not missing(exp, HTTP_HOOKS) and callable(getattr(exp._client, "export", None))


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
        if not isinstance(tracer_provider, TracerProvider):
            raise TypeError("OtlpSink: tracer_provider must be an opentelemetry.sdk.trace.TracerProvider")
        processor = getattr(tracer_provider, PROVIDER_HOOKS[0], None)
        if not callable(getattr(processor, "on_end", None)):
            raise CltraceError(f"OtlpSink(tracer_provider=...): {_installed(SDK)} keeps its span processors where "
                               f"cltrace cannot find them (tested: {SDK}{TESTED[SDK]}); install a tested release "
                               f"(pip install '{SDK}{TESTED[SDK]}') or pass exporter= instead")
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


def _installed(dist: str) -> str:
    try:
        return f"{dist} {metadata.version(dist)}"
    except metadata.PackageNotFoundError:
        return f"{dist} (not installed)"


def sdk_problems() -> list[str]:
    """One line for each thing the installed OpenTelemetry releases lack that cltrace builds on at that release
    (``HOOKS``), and for each release outside ``TESTED``; empty where all is as tested. Exporters not installed
    (no ``[otlp]`` extra) are not looked at."""
    out = []
    for dist, (first, where, names) in HOOKS.items():
        rel = release(dist)
        if rel is None:
            continue
        lo, hi = (tuple(int(x) for x in bound.lstrip("<>=").split(".")) for bound in TESTED[dist].split(","))
        if not lo <= rel < hi:
            out.append(f"{_installed(dist)} is outside the tested range {TESTED[dist]}: run tests/test_otlp_sdk.py "
                       "and tests/test_otlp.py with it, then widen the pin in pyproject.toml")
            continue
        if rel < first:
            continue  # an earlier release: the SDK's own encoder (exporters)
        lacking = missing(_hook_owner(dist), names)
        if lacking:
            out.append(f"{_installed(dist)}: {where} has no {', '.join(lacking)}, which cltrace builds on from "
                       f"{first[0]}.{first[1]} on (transport.py): adapt transport.py or pin below this release")
    return out


def _hook_owner(dist: str) -> Any:
    """What carries a distribution's hooks: the TracerProvider or exporter class, or (HTTP) an exporter made now."""
    if dist == SDK:
        return TracerProvider()
    if dist == GRPC_DIST:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter

    return HttpExporter(endpoint="http://127.0.0.1:9/v1/traces")
