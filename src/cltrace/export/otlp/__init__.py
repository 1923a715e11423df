"""OTLP export: cltrace spans as OpenTelemetry spans, sent to a collector off the traced program's path.

Mapping (exporters/README.md has the table): one trace per run with a root span
``cltrace.run`` (or, when an OpenTelemetry span is current at ``start``, the root becomes
its child in its trace); regions, launches and compile spans keep their parents. Device
placement: events QUEUED/SUBMIT/START/END; exact durations: ``cltrace.host.duration_ns``
and ``cltrace.device.duration_ns`` (END-START). Failed regions/builds: status ERROR with
the error message.

Modules: ``config`` (settings and ``OTEL_EXPORTER_OTLP_*``; one reading of an endpoint for
arguments and variables), ``mapping`` (Span -> OTel fields), ``resource``, ``encode`` (direct
protobuf encoding), ``transport`` (exporters), ``batch`` (a batch -> export calls), ``logs``
(quiet exporter logs), ``diagnose`` (why exports fail, what to change), ``sink`` (OtlpSink:
bounded queue, workers, delivery accounting, bounded close). User exporters and tracer providers always
get ``ReadableSpan`` objects.
"""
from .config import (
    DEFAULT_CLOSE_TIMEOUT_S,
    DEFAULT_FAILING_CLOSE_TIMEOUT_S,
    DEFAULT_MAX_BATCH_SPANS,
    DEFAULT_MAX_QUEUE_SPANS,
    DEFAULT_MAX_REQUEST_BYTES,
    DEFAULT_TIMEOUT_S,
    GRPC,
    HTTP,
    Target,
    resolve_protocol,
    resolve_target,
)
from .encode import WireEncoder
from .mapping import Mapper, readable_span
from .resource import base_resource, resource_attributes
from .sink import OtlpSink, otlp_sink_from_env

__all__ = [
    "DEFAULT_CLOSE_TIMEOUT_S", "DEFAULT_FAILING_CLOSE_TIMEOUT_S", "DEFAULT_MAX_BATCH_SPANS", "DEFAULT_MAX_QUEUE_SPANS",
    "DEFAULT_MAX_REQUEST_BYTES", "DEFAULT_TIMEOUT_S", "GRPC", "HTTP", "Target", "resolve_protocol", "resolve_target",
    "WireEncoder", "Mapper", "readable_span", "base_resource", "resource_attributes",
    "OtlpSink", "otlp_sink_from_env",
]
