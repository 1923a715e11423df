"""cltrace Span -> OpenTelemetry span fields, and the ``cltrace.*`` attribute naming.

Span ids are ``(run salt << 32) XOR cltrace span id``; the ``cltrace.run`` root is cltrace
id 0, which is what ``Span.parent == 0`` means. Spans are in the run's trace under their cltrace
parent, except where ``record.otel_context.PARENTS`` says a region was opened under another
OpenTelemetry span: then it, its kernels and nested regions go in that span's trace, under it; and
in a scheduled session each step is a trace of its own: a span that began inside a step's host
interval (``TraceContext.steps``) goes to that step's trace, under the step span (its root) unless its
parent began inside the step too (``Mapper.place``). Times are Unix-epoch ns: host
``perf_counter_ns`` + ``ctx.start_unix_ns - ctx.start_ns``. A span runs from the
host call that issued the work to the later of the host return and the device END. The call
site goes under the semantic-convention keys ``code.file.path``, ``code.line.number`` and
``code.function.name`` (``code.stacktrace`` with ``stack_depth`` > 1).
"""
from __future__ import annotations

import hashlib
from typing import Any, Mapping

from opentelemetry.attributes import BoundedAttributes
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

from ...record.otel_context import PARENTS
from ...timeline.spans import KERNEL, STATUS_ERROR, STEP, Span
from ..base import TraceContext

# Record attribute keys with a name of their own; every other key K becomes "cltrace.K".
_KEY_NAMES = {"global_size": "cltrace.kernel.global_size", "local_size": "cltrace.kernel.local_size"}
# Attributes cltrace sets itself; a record attribute never overrides one.
_FIXED_KEYS = frozenset({
    "cltrace.category", "cltrace.thread", "cltrace.path", "cltrace.kernel.name", "cltrace.time.source",
    "cltrace.queue", "cltrace.device.name", "cltrace.device.platform", "cltrace.host.duration_ns",
    "cltrace.device.duration_ns",
})
_INT64 = 1 << 63
EVENT_NAMES = ("QUEUED", "SUBMIT", "START", "END")
# The OpenCL devices a run used, one list per field (``cltrace.opencl.device.names`` ...), on its
# ``cltrace.run`` span: (attribute, field of the trace metadata's ``devices`` entries).
DEVICE_LISTS = (("cltrace.opencl.device.names", "name"), ("cltrace.opencl.device.types", "type"),
                ("cltrace.opencl.device.versions", "version"), ("cltrace.opencl.driver.versions", "driver"),
                ("cltrace.opencl.platform.names", "platform"), ("cltrace.opencl.device.ids", "uid"),
                ("cltrace.opencl.device.labels", "label"), ("cltrace.opencl.device.indices", "index"),
                ("cltrace.opencl.device.hardware_ids", "hardware_id"))
CACHE_MAX = 8192  # entries per mapping or encoding cache; past it, compute afresh


def attr_value(v: Any) -> Any:
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
    if isinstance(v, int):
        return attr_value(int(v))
    if isinstance(v, float):
        return float(v)
    if isinstance(v, str):
        return str.__str__(v)
    item = getattr(v, "item", None)  # numpy scalars
    if callable(item) and getattr(v, "ndim", None) == 0:
        try:
            return attr_value(item())
        except Exception:
            pass
    return str(v)


def attr_key(k: Any) -> str:
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

    def __init__(self, ctx: TraceContext, trace_id: int, salt: int,
                 root_parent: int | None = None, root_parent_remote: bool = False) -> None:
        """``ctx``: the trace's context, or as much of one as the mapping reads (``tracks``, ``start_ns``,
        ``start_unix_ns``, ``steps``; ``steps`` None where there are none: a file loaded by ``store``)."""
        self.tracks = ctx.tracks
        self.offset = ctx.start_unix_ns - ctx.start_ns
        self.trace_id = trace_id
        self.key = salt << 32
        self.root_parent = root_parent
        self.root_parent_remote = root_parent_remote
        self.parents = PARENTS
        self._threads: dict[int, str] = {}
        self._queues: dict[int, tuple[str, str, str, str]] = {}
        self._static: dict[tuple, dict[str, Any]] = {}
        self.steps = ctx.steps
        self._step_ids: dict[int, tuple[int, int]] = {}  # step table index -> (trace id, step span id)

    def span_id(self, cltrace_id: int) -> int:
        return cltrace_id ^ self.key

    def place(self, s: Span) -> tuple[int, int | None, bool]:
        """(trace id, OTel parent span id or None for a trace's root, parent is remote) of a span.

        A region opened under another OpenTelemetry span (``PARENTS``) goes under it, in its trace,
        with its kernels and nested regions; else, a span that began inside a step goes to the
        step's trace, with the step span as parent where its own parent began before the step;
        else the run's trace and the recorded parent.
        """
        parents = self.parents
        if parents:
            e = parents.get(s.id)
            if e is not None:
                return e
            e = parents.get(s.parent)
            if e is not None:
                return e[0], s.parent ^ self.key, False
        steps = self.steps
        i = steps.find(s.host_begin) if steps is not None and steps.n else -1
        if i < 0:
            return self.trace_id, s.parent ^ self.key, False
        ids = self._step_ids.get(i)
        if ids is None:
            row = steps.get(i)
            digest = hashlib.blake2b(f"{self.trace_id:032x}/{row['number']}".encode(), digest_size=16).digest()
            ids = self._step_ids[i] = (int.from_bytes(digest, "big") or 1, row["span"])
        trace, step_span = ids
        if s.cat == STEP and s.id == step_span:
            return trace, None, False
        return trace, (step_span if s.parent < step_span else s.parent) ^ self.key, False

    def _thread(self, tid: int) -> str:
        name = self._threads.get(tid)
        if name is None:
            try:
                name = self.tracks.get(tid).name
            except KeyError:
                name = f"track {tid}"
            self._threads[tid] = name
        return name

    def _queue(self, tid: int) -> tuple[str, str, str, str]:
        """(track name, device name, platform, device uid) of a device track."""
        info = self._queues.get(tid)
        if info is None:
            try:
                track = self.tracks.get(tid)
                dev = self.tracks.devices.get(track.device)
                info = (track.name, dev.name if dev else "?", dev.platform if dev else "?", track.device or "?")
            except KeyError:
                info = (f"track {tid}", "?", "?", "?")
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
        elif s.cat == STEP:
            attrs["cltrace.run.trace_id"] = f"{self.trace_id:032x}"  # the run this step's trace belongs to
        if s.dev_start is not None:
            attrs["cltrace.time.source"] = "device"
            qname, dname, pname, uid = self._queue(s.device_track)
            attrs["cltrace.queue"] = qname
            attrs["cltrace.device.name"] = dname
            attrs["cltrace.device.platform"] = pname
            attrs["cltrace.device.id"] = uid
        else:
            attrs["cltrace.time.source"] = "host"
        if len(self._static) < CACHE_MAX:
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
                v = attr_value(v)
                if v is not None:
                    attrs[attr_key(k)] = v
        site = s.site
        if site is not None:  # semantic conventions: code.file.path, code.line.number, code.function.name
            attrs.update(site.attrs())
        key = self.key
        parent = self.place(s)[1] if self.parents or (self.steps is not None and self.steps.n) else s.parent ^ key
        if s.status == STATUS_ERROR:
            return (s.name, s.id ^ key, parent, start, end, attrs, events, 2, s.error or "error")
        return (s.name, s.id ^ key, parent, start, end, attrs, events, 0, None)

    def root(self, begin_ns: int, end_ns: int, meta: Mapping[str, Any], counts: Mapping[str, int]) -> tuple:
        """The ``cltrace.run`` span (cltrace id 0) that every top-level span hangs under. It lists the
        OpenCL devices the run used (``DEVICE_LISTS``, from ``meta["devices"]``): facts about the run,
        complete only at its end, not the process's identity, so not in the resource, which
        OpenTelemetry keeps immutable and which a store repeats on every span."""
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
        devices = [d for d in (meta.get("devices") or {}).values() if isinstance(d, Mapping)]
        if devices:
            for key, field in DEVICE_LISTS:
                attrs[key] = [str(d.get(field, "")) for d in devices]
        return ("cltrace.run", self.key, self.root_parent, begin_ns + off, end_ns + off, attrs, (), 0, None)


# An event's attributes as the SDK makes them (the 1.25 encoder reads ``.dropped`` of them): none, shared.
_NO_ATTRIBUTES = BoundedAttributes(immutable=True)


def readable_span(rec: tuple, trace_id: int, resource: Any, scope: Any,
                  parent_remote: bool = False) -> Any:
    """A Mapper record as an SDK ``ReadableSpan`` (for user exporters, tracer providers and
    the SDK encoder)."""
    name, sid, pid, start, end, attrs, events, code, msg = rec
    flags = TraceFlags(TraceFlags.SAMPLED)
    parent = SpanContext(trace_id, pid, parent_remote, flags) if pid is not None else None
    return ReadableSpan(
        name=name,
        context=SpanContext(trace_id, sid, False, flags),
        parent=parent,
        resource=resource,
        attributes=attrs,
        events=[Event(n, _NO_ATTRIBUTES, ts) for n, ts in events],
        kind=SpanKind.INTERNAL,
        status=Status(StatusCode.ERROR, msg) if code else Status(StatusCode.UNSET),
        start_time=start,
        end_time=end,
        instrumentation_scope=scope,
    )
