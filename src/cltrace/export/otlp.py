"""OTLP export: cltrace spans as OpenTelemetry spans, sent to a collector off the traced program's path.

Mapping (exporters/README.md has the table):

* One trace per run: a random trace id, a root span ``cltrace.run`` (or, when an
  OpenTelemetry span is current at ``start``, the root becomes its child in its trace).
* Span ids: ``(run salt << 32) XOR cltrace span id`` -- deterministic within a run, the
  low 8 hex digits are the cltrace id, and the root is cltrace id 0, which is what
  ``Span.parent == 0`` means. Regions, launches and compile spans keep their parents.
* Times are Unix-epoch ns: host ``perf_counter_ns`` + ``recorder.start_unix_ns -
  recorder.start_ns`` (resource attribute ``cltrace.host.unix_offset_ns``). An OTel span
  covers the work's whole life: from the host call that issued it to the later of the host
  return and the device END. Device placement: events QUEUED/SUBMIT/START/END; exact
  durations: ``cltrace.host.duration_ns`` and ``cltrace.device.duration_ns`` (END-START).
* Failed regions/builds: status ERROR with the error message.

Delivery never blocks the traced program: ``write`` only queues (bounded; overflow is
dropped and counted), worker threads convert and export, ``close`` waits a bounded
time, and undelivered spans are counted (``stats()``) and reported in one log line.

The built-in OTLP gRPC and HTTP exporters are used for transport and configuration
(``OTEL_EXPORTER_OTLP_*``), fed requests that cltrace encodes straight to OTLP protobuf:
the SDK's encoder manages 7-12k spans/s here, far below the 50k spans/s target.
``sdk_encoder=True`` sends ``ReadableSpan`` batches through the stock encoder instead
(the two encodings are tested equal); user exporters and tracer providers always get
``ReadableSpan`` objects.
"""
from __future__ import annotations

import logging
import os
import platform
import random
import socket
import struct
import sys
import threading
import time
from collections import deque
from typing import Any, Mapping, Sequence
from urllib.parse import urlparse

from opentelemetry import trace as otel_trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

from ..recorder import _version
from ..spans import KERNEL, STATUS_ERROR, Span

log = logging.getLogger("cltrace")

GRPC = "grpc"
HTTP = "http/protobuf"
_PROTOCOLS = {"grpc": GRPC, "http/protobuf": HTTP, "http": HTTP}

DEFAULT_TIMEOUT_S = 2.0
DEFAULT_CLOSE_TIMEOUT_S = 5.0
DEFAULT_MAX_QUEUE_SPANS = 131_072
DEFAULT_MAX_BATCH_SPANS = 4096
DEFAULT_MAX_REQUEST_BYTES = 3 << 20  # collectors (otelcol, rotel) refuse gRPC messages over 4 MiB

# Record attribute keys with a name of their own; every other key K becomes "cltrace.K".
_KEY_NAMES = {"global_size": "cltrace.kernel.global_size", "local_size": "cltrace.kernel.local_size"}
# Attributes cltrace sets itself; a record attribute never overrides one.
_FIXED_KEYS = frozenset({
    "cltrace.category", "cltrace.thread", "cltrace.path", "cltrace.kernel.name", "cltrace.time.source",
    "cltrace.queue", "cltrace.device.name", "cltrace.device.platform", "cltrace.host.duration_ns",
    "cltrace.device.duration_ns",
})
_INT64 = 1 << 63
_EVENT_NAMES = ("QUEUED", "SUBMIT", "START", "END")
_EXPORTER_LOGGERS = "opentelemetry.exporter"
_CACHE_MAX = 8192  # entries per encoding cache (names, attribute runs); past it, encode afresh

_perf = time.perf_counter_ns


# ---- configuration ---------------------------------------------------------------------

def _env(*names: str) -> str | None:
    for n in names:
        v = os.environ.get(n)
        if v:
            return v.strip()
    return None


def resolve_protocol(protocol: str | None, endpoint: str | None) -> str:
    """``grpc`` or ``http/protobuf``: argument, then OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL,
    then the endpoint's look (port 4318 or a ``/v1/traces`` path mean HTTP), else gRPC."""
    p = protocol or _env("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")
    if p:
        key = p.strip().lower()
        if key not in _PROTOCOLS:
            raise ValueError(f"OTLP protocol {p!r} is not supported: use 'grpc' or 'http/protobuf'")
        return _PROTOCOLS[key]
    if endpoint:
        u = urlparse(endpoint if "://" in endpoint else "//" + endpoint)
        if u.path.rstrip("/").endswith("/v1/traces") or u.port == 4318:
            return HTTP
    return GRPC


def _http_url(endpoint: str) -> str:
    url = endpoint if "://" in endpoint else "http://" + endpoint
    u = urlparse(url)
    if u.path in ("", "/"):
        url = url.rstrip("/") + "/v1/traces"
    return url


def _headers(headers: Mapping[str, str] | str | None) -> dict[str, str] | None:
    if headers is None or isinstance(headers, Mapping):
        return dict(headers) if headers is not None else None
    out = {}
    for part in headers.split(","):
        if part.strip():
            k, sep, v = part.partition("=")
            if not sep:
                raise ValueError(f"OTLP headers {headers!r}: expected 'key=value[,key=value]'")
            out[k.strip()] = v.strip()
    return out


def _timeout_from_env() -> float | None:
    raw = _env("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "OTEL_EXPORTER_OTLP_TIMEOUT")
    if raw is None:
        return None
    try:
        return float(raw)  # seconds, as the OpenTelemetry Python exporters read it
    except ValueError:
        raise ValueError(f"OTEL_EXPORTER_OTLP_TIMEOUT={raw!r} is not a number of seconds") from None


class _Encoded:
    """An OTLP ExportTraceServiceRequest already serialized; ``len`` is its span count."""

    __slots__ = ("payload", "count")

    def __init__(self, payload: bytes, count: int) -> None:
        self.payload = payload
        self.count = count

    def __len__(self) -> int:
        return self.count


def _grpc_exporter(endpoint: str | None, headers: dict[str, str] | None, timeout_s: float) -> tuple[Any, bool]:
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
            if isinstance(data, _Encoded):
                if isinstance(self._client, _RawStub):
                    return data.payload
                return ExportTraceServiceRequest.FromString(data.payload)
            return super()._translate_data(data)

    if endpoint is not None and "://" not in endpoint:
        endpoint = "http://" + endpoint  # a bare host:port is a plain-text collector
    return _Exporter(endpoint=endpoint, headers=headers, timeout=timeout_s), True


def _http_exporter(endpoint: str | None, headers: dict[str, str] | None, timeout_s: float) -> tuple[Any, bool]:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    class _Exporter(OTLPSpanExporter):
        def export(self, spans: Any) -> Any:
            if isinstance(spans, _Encoded):
                if self._shutdown:
                    return SpanExportResult.FAILURE
                ok = self._client.export(spans.payload).success
                return SpanExportResult.SUCCESS if ok else SpanExportResult.FAILURE
            return super().export(spans)

    exp = _Exporter(endpoint=_http_url(endpoint) if endpoint else None, headers=headers, timeout=timeout_s)
    # Older exporters have no payload client: fall back to ReadableSpans and the SDK encoder.
    return exp, callable(getattr(getattr(exp, "_client", None), "export", None))


# ---- mapping ---------------------------------------------------------------------------

def _attr_value(v: Any) -> Any:
    """A valid OpenTelemetry attribute value for ``v`` (None: leave the attribute out).

    str/bool/float/int64 and homogeneous tuples or lists of them pass; numpy scalars are
    unwrapped; anything else (mixed sequences, dicts, huge ints, objects) becomes ``str(v)``.
    """
    t = type(v)
    if t is str or t is bool or t is float:
        return v
    if t is int:
        return v if -_INT64 <= v < _INT64 else str(v)
    if v is None:
        return None
    if t is tuple or t is list:
        if not v:
            return v
        t0 = type(v[0])
        if t0 is int:
            if all(type(x) is int and -_INT64 <= x < _INT64 for x in v):
                return v
        elif (t0 is str or t0 is bool or t0 is float) and all(type(x) is t0 for x in v):
            return v
        return str(v)
    if isinstance(v, bool):
        return bool(v)
    if isinstance(v, int):
        return _attr_value(int(v))
    if isinstance(v, float):
        return float(v)
    if isinstance(v, str):
        return str.__str__(v)
    item = getattr(v, "item", None)  # numpy scalars
    if callable(item) and getattr(v, "ndim", None) == 0:
        try:
            return _attr_value(item())
        except Exception:
            pass
    return str(v)


def _attr_key(k: Any) -> str:
    """OTel name of a record attribute: see _KEY_NAMES; else ``cltrace.K`` (``K`` as is when it
    already starts with ``cltrace.``), or ``cltrace.attr.K`` where that would shadow a fixed one."""
    k = str(k)
    name = _KEY_NAMES.get(k)
    if name is not None:
        return name
    name = k if k.startswith("cltrace.") else "cltrace." + k
    return "cltrace.attr." + k if name in _FIXED_KEYS else name


class Mapper:
    """cltrace Span -> OTel span record ``(name, span_id, parent_id, start, end, attrs, events,
    status_code, status_message)``: one mapping shared by both encoders."""

    def __init__(self, recorder: Any, trace_id: int, salt: int,
                 root_parent: int | None = None, root_parent_remote: bool = False) -> None:
        self.tracks = recorder.tracks
        self.offset = recorder.start_unix_ns - recorder.start_ns
        self.trace_id = trace_id
        self.key = salt << 32
        self.root_parent = root_parent
        self.root_parent_remote = root_parent_remote
        self._threads: dict[int, str] = {}
        self._queues: dict[int, tuple[str, str, str]] = {}
        self._static: dict[tuple, dict[str, Any]] = {}

    def span_id(self, cltrace_id: int) -> int:
        return cltrace_id ^ self.key

    def _thread(self, tid: int) -> str:
        name = self._threads.get(tid)
        if name is None:
            try:
                name = self.tracks.get(tid).name
            except KeyError:
                name = f"track {tid}"
            self._threads[tid] = name
        return name

    def _queue(self, tid: int) -> tuple[str, str, str]:
        info = self._queues.get(tid)
        if info is None:
            try:
                track = self.tracks.get(tid)
                dev = self.tracks.devices.get(track.device)
                info = (track.name, dev.name if dev else "?", dev.platform if dev else "?")
            except KeyError:
                info = (f"track {tid}", "?", "?")
            self._queues[tid] = info
        return info

    def static_attrs(self, s: Span) -> dict[str, Any]:
        """The string attributes, shared by every span of one name, kind, path, thread and
        queue (cached: do not modify the dict)."""
        key = (s.cat, s.thread, s.path, s.name, s.device_track)
        attrs = self._static.get(key)
        if attrs is not None:
            return attrs
        attrs = {"cltrace.category": s.cat, "cltrace.thread": self._thread(s.thread)}
        if s.path:
            attrs["cltrace.path"] = "/".join(s.path)
        if s.cat == KERNEL:
            attrs["cltrace.kernel.name"] = s.name
        if s.dev_start is not None:
            attrs["cltrace.time.source"] = "device"
            qname, dname, pname = self._queue(s.device_track)
            attrs["cltrace.queue"] = qname
            attrs["cltrace.device.name"] = dname
            attrs["cltrace.device.platform"] = pname
        else:
            attrs["cltrace.time.source"] = "host"
        if len(self._static) < _CACHE_MAX:
            self._static[key] = attrs
        return attrs

    def convert(self, s: Span) -> tuple:
        off = self.offset
        start = s.host_begin + off
        end = s.host_end + off
        attrs = dict(self.static_attrs(s))
        attrs["cltrace.host.duration_ns"] = s.host_end - s.host_begin
        events: tuple = ()
        if s.dev_start is not None:
            attrs["cltrace.device.duration_ns"] = s.raw_end - s.raw_start
            dend = s.dev_end + off
            events = (("QUEUED", s.dev_queued + off), ("SUBMIT", s.dev_submit + off),
                      ("START", s.dev_start + off), ("END", dend))
            if dend > end:
                end = dend
        if s.attrs:
            for k, v in s.attrs.items():
                v = _attr_value(v)
                if v is not None:
                    attrs[_attr_key(k)] = v
        key = self.key
        if s.status == STATUS_ERROR:
            return (s.name, s.id ^ key, s.parent ^ key, start, end, attrs, events, 2, s.error or "error")
        return (s.name, s.id ^ key, s.parent ^ key, start, end, attrs, events, 0, None)

    def root(self, begin_ns: int, end_ns: int, meta: Mapping[str, Any], counts: Mapping[str, int]) -> tuple:
        """The ``cltrace.run`` span (cltrace id 0) that every top-level span hangs under."""
        off = self.offset
        attrs: dict[str, Any] = {
            "cltrace.category": "run",
            "cltrace.spans.recorded": int(meta.get("recorded_spans", 0)),
            "cltrace.spans.dropped": int(meta.get("dropped_spans", 0)),
            "cltrace.otlp.dropped": counts["dropped"],
            "cltrace.otlp.failed": counts["failed"],
        }
        clocks = meta.get("clocks") or {}
        if clocks:
            keys = sorted(clocks)
            attrs["cltrace.clock.devices"] = keys
            attrs["cltrace.clock.bound_ns"] = [int(clocks[k].get("bound_ns", 0)) for k in keys]
            attrs["cltrace.clock.drift_ns"] = [int(clocks[k].get("drift_ns", 0)) for k in keys]
            attrs["cltrace.clock.domain"] = [str(clocks[k].get("domain", "")) for k in keys]
            attrs["cltrace.clock.method"] = [str(clocks[k].get("method", "")) for k in keys]
        return ("cltrace.run", self.key, self.root_parent, begin_ns + off, end_ns + off, attrs, (), 0, None)


def base_resource(service_name: str | None) -> dict[str, Any]:
    """Resource attributes from the environment (OTEL_RESOURCE_ATTRIBUTES, OTEL_SERVICE_NAME)
    and the SDK, with an explicit ``service_name`` over both; default name ``cltrace``.

    Computed once, before any export: the SDK runs its resource detectors on a thread
    pool, which no longer accepts work while the interpreter shuts down.
    """
    attrs = dict(Resource.create({"service.name": service_name} if service_name else {}).attributes)
    if str(attrs.get("service.name", "")).startswith("unknown_service"):
        attrs["service.name"] = "cltrace"
    return attrs


def resource_attributes(recorder: Any, base: Mapping[str, Any]) -> dict[str, Any]:
    """Detected host/process/OpenCL facts, overridden by ``base`` (see ``base_resource``)."""
    devices = list(recorder.tracks.devices.values())
    detected: dict[str, Any] = {
        "host.name": socket.gethostname(),
        "host.arch": platform.machine(),
        "os.type": platform.system().lower(),
        "process.pid": os.getpid(),
        "process.executable.path": sys.executable,
        "process.command_args": [str(a) for a in sys.argv],
        "process.runtime.name": sys.implementation.name,
        "process.runtime.version": platform.python_version(),
        "cltrace.version": _version(),
        "cltrace.host.unix_offset_ns": recorder.start_unix_ns - recorder.start_ns,
        "cltrace.opencl.device.names": [d.name for d in devices],
        "cltrace.opencl.device.types": [d.type for d in devices],
        "cltrace.opencl.device.versions": [d.version for d in devices],
        "cltrace.opencl.driver.versions": [d.driver for d in devices],
        "cltrace.opencl.platform.names": [d.platform for d in devices],
    }
    return {**detected, **base}


# ---- encoders --------------------------------------------------------------------------

_pack_fixed64 = struct.Struct("<Q").pack
_pack_id = struct.Struct(">Q").pack
_pack_ids = struct.Struct(">2sQ2sQ").pack  # span_id and parent_span_id fields
_pack_double = struct.Struct("<d").pack
_SMALL = [bytes((i,)) for i in range(128)]
_FLAGS = b"\x85\x01" + struct.pack("<I", 0x100)  # SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK
_FLAGS_REMOTE_PARENT = b"\x85\x01" + struct.pack("<I", 0x300)


def _varint(n: int) -> bytes:
    if n < 128:
        return _SMALL[n]
    if n < 16384:
        return bytes(((n & 127) | 128, n >> 7))
    if n < 2097152:
        return bytes(((n & 127) | 128, ((n >> 7) & 127) | 128, n >> 14))
    out = bytearray()
    while n > 127:
        out.append((n & 127) | 128)
        n >>= 7
    out.append(n)
    return bytes(out)


def _ld(tag: bytes, payload: bytes) -> bytes:
    return tag + _varint(len(payload)) + payload


def _utf8(s: str) -> bytes:
    return s.encode("utf-8", "replace")


def _any_value(v: Any) -> bytes:
    """AnyValue message body."""
    if isinstance(v, str):
        return _ld(b"\x0a", _utf8(v))
    if isinstance(v, bool):
        return b"\x10\x01" if v else b"\x10\x00"
    if isinstance(v, int):
        return b"\x18" + _varint(v if v >= 0 else v + (1 << 64))
    if isinstance(v, float):
        return b"\x21" + _pack_double(v)
    if isinstance(v, (list, tuple)):
        return _ld(b"\x2a", b"".join(_ld(b"\x0a", _any_value(x)) for x in v))
    return _ld(b"\x0a", _utf8(str(v)))


class WireEncoder:
    """Writes the OTLP ExportTraceServiceRequest bytes for cltrace spans directly: the same
    message the SDK encoder builds from ``readable_span(mapper.convert(s))`` (tested equal),
    without building protobuf objects. Repeated parts (string attributes, names) are cached."""

    def __init__(self, mapper: Mapper, scope_name: str, scope_version: str) -> None:
        self.mapper = mapper
        self._trace = b"\x0a\x10" + mapper.trace_id.to_bytes(16, "big")
        self._scope = _ld(b"\x0a", _ld(b"\x0a", _utf8(scope_name)) + _ld(b"\x12", _utf8(scope_version)))
        self._kv_cache: dict[tuple[str, Any], bytes] = {}
        self._rec_cache: dict[tuple[Any, Any], bytes] = {}
        self._static: dict[tuple, tuple[bytes, bytes]] = {}
        self._keys: dict[str, bytes] = {}
        self._host_dur = self._key("cltrace.host.duration_ns")
        self._dev_dur = self._key("cltrace.device.duration_ns")
        parts = [self._event_parts(n) for n in _EVENT_NAMES]
        self._events = dict(zip(_EVENT_NAMES, parts))
        self._pack_events = struct.Struct("<" + "".join(f"{len(p)}sQ{len(q)}s" for p, q in parts)).pack
        self._event_args = [b for pq in parts for b in pq]
        self._pack_times = struct.Struct("<BBBQBQ").pack

    @staticmethod
    def _event_parts(name: str) -> tuple[bytes, bytes]:
        """An Event field around its timestamp: (tag, length, time tag) and the name field."""
        nb = _ld(b"\x12", _utf8(name))
        return b"\x5a" + _varint(9 + len(nb)) + b"\x09", nb

    def _key(self, k: str) -> bytes:
        kb = self._keys.get(k)
        if kb is None:
            kb = self._keys[k] = _ld(b"\x0a", _utf8(k))
        return kb

    def attribute(self, k: str, v: Any, tag: bytes = b"\x4a") -> bytes:
        """One KeyValue as a length-delimited field (span attributes: field 9)."""
        if type(v) is str and tag == b"\x4a":
            ck = (k, v)
            b = self._kv_cache.get(ck)
            if b is None:
                b = _ld(tag, self._key(k) + _ld(b"\x12", _any_value(v)))
                if len(self._kv_cache) < _CACHE_MAX:
                    self._kv_cache[ck] = b
            return b
        return _ld(tag, self._key(k) + _ld(b"\x12", _any_value(v)))

    @staticmethod
    def _int_attribute(kb: bytes, v: int) -> bytes:
        vb = _varint(v if v >= 0 else v + (1 << 64))
        n = len(kb) + len(vb) + 3
        if n < 128:
            return b"".join((b"\x4a", _SMALL[n], kb, b"\x12", _SMALL[len(vb) + 1], b"\x18", vb))
        inner = kb + b"\x12" + _SMALL[len(vb) + 1] + b"\x18" + vb
        return b"\x4a" + _varint(len(inner)) + inner

    def _record_attribute(self, k: Any, v: Any) -> bytes:
        t = type(v)
        cacheable = t is str or (t is tuple and all(type(x) is int for x in v))
        if cacheable:
            b = self._rec_cache.get((k, v))
            if b is not None:
                return b
        v2 = _attr_value(v)
        b = b"" if v2 is None else self.attribute(_attr_key(k), v2)
        if cacheable and len(self._rec_cache) < _CACHE_MAX:
            self._rec_cache[(k, v)] = b
        return b

    def encode(self, s: Span) -> bytes:
        """One cltrace span as a ScopeSpans.spans field."""
        m = self.mapper
        off = m.offset
        key = m.key
        skey = (s.cat, s.thread, s.path, s.name, s.device_track)
        cached = self._static.get(skey)
        if cached is None:  # the name field and the string attributes
            cached = (_ld(b"\x2a", _utf8(s.name)),
                      b"".join([self.attribute(k, v) for k, v in m.static_attrs(s).items()]))
            if len(self._static) < _CACHE_MAX:
                self._static[skey] = cached
        hb = s.host_begin
        end = s.host_end + off
        ints = self._int_attribute(self._host_dur, s.host_end - hb)
        ds = s.dev_start
        if ds is not None:
            dend = s.dev_end + off
            if dend > end:
                end = dend
            ints += self._int_attribute(self._dev_dur, s.raw_end - s.raw_start)
            p = self._event_args
            events = self._pack_events(p[0], s.dev_queued + off, p[1], p[2], s.dev_submit + off, p[3],
                                       p[4], ds + off, p[5], p[6], dend, p[7])
        else:
            events = b""
        if s.attrs:
            rec = self._record_attribute
            ints += b"".join([rec(k, v) for k, v in s.attrs.items()])
        if s.status == STATUS_ERROR:
            status = _ld(b"\x7a", _ld(b"\x12", _utf8(s.error or "error")) + b"\x18\x02")
        else:
            status = b"\x7a\x00"
        body = b"".join((self._trace, _pack_ids(b"\x12\x08", s.id ^ key, b"\x22\x08", s.parent ^ key),
                         cached[0], self._pack_times(0x30, 1, 0x39, hb + off, 0x41, end), cached[1],
                         ints, events, status, _FLAGS))
        return b"\x12" + _varint(len(body)) + body

    def encode_record(self, rec: tuple, parent_remote: bool = False) -> bytes:
        """A Mapper record (the root span) as a ScopeSpans.spans field."""
        name, sid, pid, start, end, attrs, events, code, msg = rec
        parts = [self._trace, b"\x12\x08", _pack_id(sid)]
        if pid is not None:
            parts += [b"\x22\x08", _pack_id(pid)]
        parts += [_ld(b"\x2a", _utf8(name)), self._pack_times(0x30, 1, 0x39, start, 0x41, end)]
        parts += [self.attribute(k, v) for k, v in attrs.items()]
        for ename, ts in events:
            head, name_field = self._events.get(ename) or self._event_parts(ename)
            parts += [head, _pack_fixed64(ts), name_field]
        if code:
            parts.append(_ld(b"\x7a", _ld(b"\x12", _utf8(msg)) + b"\x18" + _varint(code)))
        else:
            parts.append(b"\x7a\x00")
        parts.append(_FLAGS_REMOTE_PARENT if parent_remote else _FLAGS)
        body = b"".join(parts)
        return b"\x12" + _varint(len(body)) + body

    def resource(self, attrs: Mapping[str, Any]) -> bytes:
        """ResourceSpans field 1 (Resource message)."""
        return _ld(b"\x0a", b"".join(self.attribute(k, v, b"\x0a") for k, v in attrs.items()))

    def request(self, resource: bytes, spans: list[bytes]) -> bytes:
        """ExportTraceServiceRequest with one ResourceSpans / ScopeSpans, joined in one copy."""
        scope_len = len(self._scope) + sum(map(len, spans))
        scope_head = b"\x12" + _varint(scope_len)
        rs_len = len(resource) + len(scope_head) + scope_len
        head = [b"\x0a", _varint(rs_len), resource, scope_head, self._scope]
        return b"".join(head + spans)


def readable_span(rec: tuple, trace_id: int, resource: Any, scope: Any,
                  parent_remote: bool = False) -> Any:
    """The same record as an SDK ``ReadableSpan`` (for user exporters and tracer providers)."""
    name, sid, pid, start, end, attrs, events, code, msg = rec
    flags = TraceFlags(TraceFlags.SAMPLED)
    parent = SpanContext(trace_id, pid, parent_remote, flags) if pid is not None else None
    return ReadableSpan(
        name=name,
        context=SpanContext(trace_id, sid, False, flags),
        parent=parent,
        resource=resource,
        attributes=attrs,
        events=[Event(n, None, ts) for n, ts in events],
        kind=SpanKind.INTERNAL,
        status=Status(StatusCode.ERROR, msg) if code else Status(StatusCode.UNSET),
        start_time=start,
        end_time=end,
        instrumentation_scope=scope,
    )


# ---- the sink --------------------------------------------------------------------------

class _ExporterLogs(logging.Filter):
    """Swallows OpenTelemetry exporter log records from one sink's workers (they would print
    a retry warning per batch into the traced program's stderr) and keeps the last error."""

    def __init__(self, sink: "OtlpSink") -> None:
        super().__init__()
        self.sink = sink
        self._cause: str | None = None

    def filter(self, record: logging.LogRecord) -> bool:
        sink = self.sink
        if record.thread not in sink._worker_idents or record.levelno < logging.WARNING:
            return record.thread not in sink._worker_idents
        try:
            msg = record.getMessage().splitlines()[0][:300]
        except Exception:
            return False
        if record.levelno >= logging.ERROR:
            # "gave up" errors say little; the latest retry warning holds the cause.
            cause = self._cause
            sink._last_error = f"{msg} [{cause}]" if cause else msg
        else:
            self._cause = msg
            if not sink._last_error:
                sink._last_error = msg
        return False


class OtlpSink:
    """Streams spans to an OTLP endpoint, a user's ``SpanExporter`` or a ``TracerProvider``.

    ``endpoint``: ``host:port`` or URL (default: ``OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT``,
    else localhost:4317 / :4318). ``protocol``: ``"grpc"`` or ``"http/protobuf"`` (see
    ``resolve_protocol``). ``headers``: dict or ``"k=v,k2=v2"``. ``timeout_s``: per export
    request, retries included (default: OTEL_EXPORTER_OTLP_TIMEOUT, else 2 s).
    ``close_timeout_s``: the most ``close`` waits for delivery. ``max_request_bytes`` keeps
    requests under collectors' usual 4 MiB limit. Counters: ``delivered``, ``failed`` (export
    refused or timed out), ``dropped`` (never sent: queue full, written after close, or still
    queued when close gave up).

    With its own OTLP exporters the sink runs ``senders`` workers, each with its own exporter
    (an exporter is never called concurrently), so one encodes while another waits on the
    network; a user's exporter or tracer provider gets one worker.
    """

    def __init__(self, endpoint: str | None = None, protocol: str | None = None,
                 headers: Mapping[str, str] | str | None = None, timeout_s: float | None = None,
                 exporter: Any = None, service_name: str | None = None, *,
                 tracer_provider: Any = None, close_timeout_s: float = DEFAULT_CLOSE_TIMEOUT_S,
                 max_queue_spans: int = DEFAULT_MAX_QUEUE_SPANS,
                 max_batch_spans: int = DEFAULT_MAX_BATCH_SPANS,
                 max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
                 senders: int = 2, sdk_encoder: bool = False) -> None:
        if exporter is not None and tracer_provider is not None:
            raise ValueError("OtlpSink: pass exporter or tracer_provider, not both")
        if timeout_s is None:
            timeout_s = _timeout_from_env() or DEFAULT_TIMEOUT_S
        if not timeout_s > 0 or not close_timeout_s >= 0:
            raise ValueError("OtlpSink: timeout_s must be > 0 and close_timeout_s >= 0")
        if min(max_queue_spans, max_batch_spans, max_request_bytes, senders) < 1:
            raise ValueError("OtlpSink: max_queue_spans, max_batch_spans, max_request_bytes "
                             "and senders must be >= 1")
        self.timeout_s = float(timeout_s)
        self.close_timeout_s = float(close_timeout_s)
        self.max_queue_spans = max_queue_spans
        self.max_batch_spans = max_batch_spans
        self.max_request_bytes = max_request_bytes
        self.service_name = service_name
        self._base_resource = base_resource(service_name)
        self._processor = None
        self._provider_resource = None
        self._own_exporter = False
        self._wire = False
        if tracer_provider is not None:
            self._processor = getattr(tracer_provider, "_active_span_processor", None)
            if self._processor is None or not hasattr(self._processor, "on_end"):
                raise TypeError("OtlpSink: tracer_provider must be an opentelemetry.sdk.trace.TracerProvider")
            self._provider_resource = tracer_provider.resource
            self.protocol = "tracer_provider"
            self.endpoint = type(tracer_provider).__name__
            exporters = [None]
        elif exporter is not None:
            if not callable(getattr(exporter, "export", None)):
                raise TypeError("OtlpSink: exporter must be an opentelemetry SpanExporter (has export())")
            self.protocol = "exporter"
            self.endpoint = type(exporter).__name__
            exporters = [exporter]
        else:
            self.protocol = resolve_protocol(protocol, endpoint)
            hdrs = _headers(headers)
            make = _grpc_exporter if self.protocol == GRPC else _http_exporter
            made = [make(endpoint, hdrs, self.timeout_s) for _ in range(senders)]
            exporters = [e for e, _ in made]
            self._own_exporter = True
            self._wire = made[0][1] and not sdk_encoder
            if not self._wire:
                self.max_batch_spans = min(max_batch_spans, 512)  # the SDK encoder cannot split by size
            self.endpoint = str(getattr(exporters[0], "_endpoint", None) or endpoint or self.protocol)
        self.exporters = exporters
        self.delivered = 0
        self.failed = 0
        self.dropped = 0
        self.exports = 0
        self.failed_exports = 0
        self.received = 0
        self._last_error: str | None = None
        self._warned = False
        self._queue: deque[tuple[bool, list]] = deque()
        self._queued = 0
        self._inflight = 0
        self._cv = threading.Condition()
        self._closing = False
        self._closed = False
        self._workers: list[threading.Thread] = []
        self._worker_idents: set[int] = set()
        self._log_filter = _ExporterLogs(self)
        self._filtered: list[logging.Logger] = []
        self._recorder: Any = None
        self.mapper: Mapper | None = None
        self.trace_id = 0
        self._begin_ns: int | None = None
        self._resource_key: int = -1
        self._resource: Any = None
        self._resource_bytes = b""
        self._res_lock = threading.Lock()

    # -- SpanSink -------------------------------------------------------------------------
    def start(self, recorder: Any) -> None:
        if self._recorder is not None:
            return
        self._recorder = recorder
        self._begin_ns = _perf()
        ctx = otel_trace.get_current_span().get_span_context()
        salt = random.getrandbits(32) or 1
        if ctx.is_valid:
            self.trace_id = ctx.trace_id
            self.mapper = Mapper(recorder, ctx.trace_id, salt, ctx.span_id, ctx.is_remote)
        else:
            self.trace_id = random.getrandbits(128) or 1
            self.mapper = Mapper(recorder, self.trace_id, salt)
        if self._wire:
            self._encoder = WireEncoder(self.mapper, "cltrace", _version())
        for name, lg in list(logging.Logger.manager.loggerDict.items()):
            if name.startswith(_EXPORTER_LOGGERS) and isinstance(lg, logging.Logger):
                lg.addFilter(self._log_filter)
                self._filtered.append(lg)
        for i, exp in enumerate(self.exporters):
            t = threading.Thread(target=self._run, args=(exp,), name=f"cltrace-otlp-{i}", daemon=True)
            self._workers.append(t)
            t.start()

    def write(self, spans: Sequence[Span]) -> None:
        """Queue a batch for the workers; never waits. What does not fit is dropped and counted."""
        n = len(spans)
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
                spans = spans[:room]
                n = room
            self._queue.append((False, list(spans)))
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
            for lg in self._filtered:
                lg.removeFilter(self._log_filter)
            self._filtered = []

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
        deadline = time.monotonic() + self.close_timeout_s
        for t in self._workers:
            t.join(max(0.0, deadline - time.monotonic()))
        if any(t.is_alive() for t in self._workers):
            with self._cv:
                self.dropped += self._queued
                self._queue.clear()
                self._queued = 0
                if not self._last_error:
                    self._last_error = f"gave up after close_timeout_s={self.close_timeout_s:g}"
        if self._own_exporter:
            for exp in self.exporters:
                try:
                    exp.shutdown()  # also cuts short a retry still in flight
                except Exception:
                    pass
        deadline = time.monotonic() + min(1.0, self.timeout_s)
        for t in self._workers:
            t.join(max(0.0, deadline - time.monotonic()))
        self._report()

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
        self._worker_idents.add(threading.get_ident())
        cv = self._cv
        while True:
            with cv:
                while not self._queue and not self._closing:
                    cv.wait()
                if not self._queue:
                    return
                batch: list[tuple[bool, list]] = []
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
            results = self._export(exporter, batch, n)
            with cv:
                for count, ok in results:
                    self.exports += 1
                    if ok:
                        self.delivered += count
                    else:
                        self.failed += count
                        self.failed_exports += 1
                self._inflight -= n
                cv.notify_all()
                warn = not self._warned and not all(ok for _, ok in results)
                if warn:
                    self._warned = True
            if warn:
                log.warning("cltrace: OTLP export to %s failed (%s); tracing goes on, undelivered "
                            "spans are counted and reported at exit", self.endpoint,
                            self._last_error or "exporter returned FAILURE")

    def _export(self, exporter: Any, batch: list[tuple[bool, list]], n: int) -> list[tuple[int, bool]]:
        """Export one batch (in several requests if it is large): [(spans, delivered?)]."""
        try:
            mapper = self.mapper
            self._refresh_resource()
            root_remote = mapper.root_parent_remote
            if self._wire:
                enc = self._encoder
                body: list[bytes] = []
                for is_record, items in batch:
                    if is_record:
                        body += [enc.encode_record(r, root_remote) for r in items]
                    else:
                        body += map(enc.encode, items)
                out = []
                for chunk in _chunks_by_size(body, self.max_request_bytes):
                    payload = enc.request(self._resource_bytes, chunk)
                    try:
                        ok = exporter.export(_Encoded(payload, len(chunk))) == SpanExportResult.SUCCESS
                    except Exception as exc:
                        self._last_error = f"{type(exc).__name__}: {exc}"
                        ok = False
                    out.append((len(chunk), ok))
                return out
            recs: list[tuple] = []
            for is_record, items in batch:
                recs += items if is_record else map(mapper.convert, items)
            key = mapper.key
            spans = [readable_span(r, self.trace_id, self._resource, self._scope,
                                   root_remote and r[1] == key) for r in recs]
            if self._processor is not None:
                for s in spans:
                    self._processor.on_end(s)
                return [(n, True)]
            return [(n, exporter.export(spans) == SpanExportResult.SUCCESS)]
        except Exception as exc:
            self._last_error = f"{type(exc).__name__}: {exc}"
            return [(n, False)]

    def _refresh_resource(self) -> None:
        """(Re)build the resource when the recorder has seen new OpenCL devices."""
        ndev = len(self._recorder.tracks.devices)
        if ndev == self._resource_key:
            return
        with self._res_lock:
            attrs = resource_attributes(self._recorder, self._base_resource)
            if self._provider_resource is not None:
                attrs = {**attrs, **dict(self._provider_resource.attributes)}
            self._scope = InstrumentationScope("cltrace", _version())
            self._resource = Resource(attrs)
            if self._wire:
                self._resource_bytes = self._encoder.resource(attrs)
            self._resource_key = ndev

    def _report(self) -> None:
        st = self.stats()
        lost = st["received"] - st["delivered"]
        if lost <= 0:
            return
        inflight = f", {st['in_flight']} still in flight" if st["in_flight"] else ""
        log.warning("cltrace: OTLP: %d of %d spans not delivered to %s (%d failed, %d dropped%s%s)",
                    lost, st["received"], self.endpoint, st["failed"], st["dropped"], inflight,
                    f"; last error: {st['last_error']}" if st["last_error"] else "")


def _chunks_by_size(items: list[bytes], limit: int) -> list[list[bytes]]:
    """Consecutive groups of encoded spans whose sizes add up to at most ``limit`` (a lone
    larger span gets a group of its own)."""
    out: list[list[bytes]] = []
    cur: list[bytes] = []
    size = 0
    for b in items:
        if cur and size + len(b) > limit:
            out.append(cur)
            cur, size = [], 0
        cur.append(b)
        size += len(b)
    if cur:
        out.append(cur)
    return out


def otlp_sink_from_env(**kwargs: Any) -> OtlpSink | None:
    """An OtlpSink configured by the OTEL_EXPORTER_OTLP_* variables, or None when neither
    OTEL_EXPORTER_OTLP_TRACES_ENDPOINT nor OTEL_EXPORTER_OTLP_ENDPOINT is set."""
    if not _env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"):
        return None
    return OtlpSink(**kwargs)
