"""Direct OTLP protobuf encoding of cltrace spans.

The SDK's encoder manages 7-12k spans/s here, far below the 50k spans/s target, so the
sink writes the ExportTraceServiceRequest bytes itself: the same message the SDK builds
from ``readable_span(mapper.convert(s))`` (tested equal), without protobuf objects.
"""
from __future__ import annotations

import struct
from typing import Any, Mapping

from ...timeline.spans import STATUS_ERROR, Span
from ..protowire import SMALL as _SMALL
from ..protowire import varint as _varint
from .mapping import CACHE_MAX, EVENT_NAMES, Mapper, attr_key, attr_value

_pack_fixed64 = struct.Struct("<Q").pack
_pack_id = struct.Struct(">Q").pack
_pack_ids = struct.Struct(">2sQ2sQ").pack  # span_id and parent_span_id fields
_pack_double = struct.Struct("<d").pack
_pack_times = struct.Struct("<BBBQBQ").pack  # kind, start and end time fields
_FLAGS = b"\x85\x01" + struct.pack("<I", 0x100)  # SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK
_FLAGS_REMOTE_PARENT = b"\x85\x01" + struct.pack("<I", 0x300)
_STATUS_UNSET = b"\x7a\x00"


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


def _status(code: int, msg: str) -> bytes:
    """The Span.status field: UNSET for code 0, else the code with its message."""
    if not code:
        return _STATUS_UNSET
    return _ld(b"\x7a", _ld(b"\x12", _utf8(msg)) + b"\x18" + _varint(code))


class WireEncoder:
    """Writes the OTLP ExportTraceServiceRequest bytes for cltrace spans directly. Repeated
    parts (string attributes, names) are cached."""

    def __init__(self, mapper: Mapper, scope_name: str, scope_version: str) -> None:
        self.mapper = mapper
        self._trace = b"\x0a\x10" + mapper.trace_id.to_bytes(16, "big")
        self._traces: dict[int, bytes] = {}  # a scheduled session's step traces
        self._scope = _ld(b"\x0a", _ld(b"\x0a", _utf8(scope_name)) + _ld(b"\x12", _utf8(scope_version)))
        self._kv_cache: dict[tuple[str, Any], bytes] = {}
        self._rec_cache: dict[tuple[Any, Any], bytes] = {}
        self._static: dict[tuple, tuple[bytes, bytes]] = {}
        self._sites: dict[Any, bytes] = {}  # CallSite -> its code.* attributes, encoded
        self._keys: dict[str, bytes] = {}
        self._host_dur = self._key("cltrace.host.duration_ns")
        self._dev_dur = self._key("cltrace.device.duration_ns")
        parts = [self._event_parts(n) for n in EVENT_NAMES]
        self._events = dict(zip(EVENT_NAMES, parts))
        self._pack_events = struct.Struct("<" + "".join(f"{len(p)}sQ{len(q)}s" for p, q in parts)).pack
        self._event_args = [b for pq in parts for b in pq]

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
                if len(self._kv_cache) < CACHE_MAX:
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
        v2 = attr_value(v)
        b = b"" if v2 is None else self.attribute(attr_key(k), v2)
        if cacheable and len(self._rec_cache) < CACHE_MAX:
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
            if len(self._static) < CACHE_MAX:
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
        site = s.site
        if site is not None:
            sb = self._sites.get(site)
            if sb is None:
                sb = b"".join([self.attribute(k, v) for k, v in site.attrs().items()])
                if len(self._sites) < CACHE_MAX:
                    self._sites[site] = sb
            ints += sb
        status = _status(2, s.error or "error") if s.status == STATUS_ERROR else _STATUS_UNSET
        trace, parent, flags = self._trace, s.parent ^ key, _FLAGS
        if m.parents or (m.steps is not None and m.steps.n):  # other OTel parents, or a step's own trace
            tid, parent, remote = m.place(s)
            if tid != m.trace_id:
                trace = self._traces.get(tid)
                if trace is None:
                    trace = self._traces[tid] = b"\x0a\x10" + tid.to_bytes(16, "big")
            if remote:
                flags = _FLAGS_REMOTE_PARENT
        ids = (_pack_ids(b"\x12\x08", s.id ^ key, b"\x22\x08", parent) if parent is not None
               else b"\x12\x08" + _pack_id(s.id ^ key))
        body = b"".join((trace, ids,
                         cached[0], _pack_times(0x30, 1, 0x39, hb + off, 0x41, end), cached[1],
                         ints, events, status, flags))
        return b"\x12" + _varint(len(body)) + body

    def encode_record(self, rec: tuple, parent_remote: bool = False) -> bytes:
        """A Mapper record (the root span) as a ScopeSpans.spans field."""
        name, sid, pid, start, end, attrs, events, code, msg = rec
        parts = [self._trace, b"\x12\x08", _pack_id(sid)]
        if pid is not None:
            parts += [b"\x22\x08", _pack_id(pid)]
        parts += [_ld(b"\x2a", _utf8(name)), _pack_times(0x30, 1, 0x39, start, 0x41, end)]
        parts += [self.attribute(k, v) for k, v in attrs.items()]
        for ename, ts in events:
            head, name_field = self._events.get(ename) or self._event_parts(ename)
            parts += [head, _pack_fixed64(ts), name_field]
        parts.append(_status(code, msg))
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


def chunks_by_size(items: list[bytes], limit: int) -> list[list[bytes]]:
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
