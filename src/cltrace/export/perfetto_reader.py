"""Reading a cltrace ``.pftrace`` back into Spans (for ``cltrace summary`` and tests).

Packets are parsed with the ``perfetto`` package's protos, one at a time, so
a file cut off mid-packet yields everything up to its last complete packet.
Timestamps are decoded the way trace processor does it (per-sequence
defaults, incremental clocks from ClockSnapshots, absolute MONOTONIC
timestamps) and slices are paired per track after a stable sort by time, so
equal timestamps keep file order, as trace processor orders them.
"""
from __future__ import annotations

import json
import os
from typing import Any

from google.protobuf.message import DecodeError
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

from ..errors import TraceFileError
from ..spans import STATUS_ERROR, STATUS_OK, Span
from ..tracefile import _fill_paths
from .perfetto import (A_DEV_END, A_DEV_START, A_ERROR, A_PARENT, A_SPAN, A_STATUS, BEGIN, COUNTER,
                       DROPPED_TRACK, END, INSTANT, METADATA_EVENT, MONOTONIC)

_PACKET_TAG = 0x0A
_RESERVED = {A_SPAN, A_PARENT, A_STATUS, A_ERROR, A_DEV_START, A_DEV_END}


class _SeqState:
    __slots__ = ("clock", "uuid", "incremental", "mono_minus_clock", "names", "cats", "dnames")

    def __init__(self) -> None:
        self.clock = 0
        self.uuid = 0
        self.incremental: dict[int, int] = {}  # clock id -> last absolute value
        self.mono_minus_clock: dict[int, int] = {}  # clock id -> MONOTONIC - clock, from snapshots
        self.names: dict[int, str] = {}
        self.cats: dict[int, str] = {}
        self.dnames: dict[int, str] = {}

    def clear(self) -> None:
        self.clock = 0
        self.uuid = 0
        self.names.clear()
        self.cats.clear()
        self.dnames.clear()


def _varint(data: bytes, pos: int) -> tuple[int, int] | None:
    result = shift = 0
    n = len(data)
    while pos < n:
        b = data[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise TraceFileError(f"not a Perfetto trace: bad length varint before byte {pos}")
    return None


def iter_packets(data: bytes) -> list[tuple[int, bytes]]:
    """(offset, bytes) of each complete ``Trace.packet``; a cut-off last packet is left out."""
    out: list[tuple[int, bytes]] = []
    pos = 0
    n = len(data)
    while pos < n:
        if data[pos] != _PACKET_TAG:
            if not data[pos:].strip(b"\x00"):
                break  # zero-filled tail of a file whose writer died: same as truncated
            where = "" if pos == 0 else f" at byte {pos}"
            raise TraceFileError(f"not a Perfetto trace: expected a Trace.packet field{where}, "
                                 f"found byte 0x{data[pos]:02x}")
        got = _varint(data, pos + 1)
        if got is None:
            break
        size, start = got
        if start + size > n:
            break
        out.append((pos, data[start:start + size]))
        pos = start + size
    return out


def _annotation_value(a: Any) -> Any:
    kind = a.WhichOneof("value")
    if kind is None:
        if a.array_values:
            return [_annotation_value(x) for x in a.array_values]
        if a.dict_entries:
            return {x.name: _annotation_value(x) for x in a.dict_entries}
        return None
    if kind == "legacy_json_value":
        try:
            return json.loads(a.legacy_json_value)
        except ValueError:
            return a.legacy_json_value
    return getattr(a, kind)


def load_pftrace(path: str | os.PathLike[str]) -> tuple[list[Span], dict[str, Any]]:
    """Spans and metadata of a ``.pftrace`` written by cltrace. Raises TraceFileError with a one-line reason."""
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError as exc:
        raise TraceFileError(f"cannot read {os.fspath(path)}: {exc.strerror}") from None
    if not data:
        raise TraceFileError("file is empty")
    packets = iter_packets(data)
    if not packets:
        raise TraceFileError("not a Perfetto trace: the file ends before its first complete packet")
    seqs: dict[int, _SeqState] = {}
    # track uuid -> [(ts, file index, type, payload)]
    events: dict[int, list[tuple[int, int, int, Any]]] = {}
    counter_names: dict[int, str] = {}
    meta: dict[str, Any] = {}
    dropped = 0
    for index, (offset, raw) in enumerate(packets):
        try:
            p = pb.TracePacket.FromString(raw)
        except DecodeError:
            raise TraceFileError(f"corrupt Perfetto trace: packet at byte {offset} does not parse") from None
        st = seqs.get(p.trusted_packet_sequence_id)
        if st is None:
            st = seqs[p.trusted_packet_sequence_id] = _SeqState()
        if p.sequence_flags & pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED or p.incremental_state_cleared:
            st.clear()
        if p.HasField("trace_packet_defaults"):
            d = p.trace_packet_defaults
            st.clock = d.timestamp_clock_id
            st.uuid = d.track_event_defaults.track_uuid
        if p.HasField("interned_data"):
            i = p.interned_data
            st.names.update((e.iid, e.name) for e in i.event_names)
            st.cats.update((e.iid, e.name) for e in i.event_categories)
            st.dnames.update((e.iid, e.name) for e in i.debug_annotation_names)
        if p.HasField("clock_snapshot"):
            clocks = {c.clock_id: c for c in p.clock_snapshot.clocks}
            mono = clocks.get(MONOTONIC)
            for cid, c in clocks.items():
                if c.is_incremental:
                    st.incremental[cid] = c.timestamp
                if mono is not None and cid != MONOTONIC:
                    st.mono_minus_clock[cid] = mono.timestamp - c.timestamp
            continue
        if p.HasField("track_descriptor"):
            d = p.track_descriptor
            if d.HasField("counter"):
                counter_names[d.uuid] = d.name
            continue
        if not p.HasField("track_event"):
            continue
        te = p.track_event
        ts = _timestamp(p, st)
        uuid = te.track_uuid if te.HasField("track_uuid") else st.uuid
        kind = te.type
        if kind == END:
            events.setdefault(uuid, []).append((ts, index, END, None))
        elif kind == BEGIN:
            name = te.name if te.HasField("name") else st.names.get(te.name_iid, "?")
            if te.categories:
                cat = te.categories[0]
            else:
                cat = st.cats.get(te.category_iids[0], "?") if te.category_iids else "?"
            ann: dict[str, Any] = {}
            for a in te.debug_annotations:
                key = a.name if a.HasField("name") else st.dnames.get(a.name_iid, f"#{a.name_iid}")
                ann.setdefault(key, _annotation_value(a))
            sid = ann.get(A_SPAN)
            if sid is None:
                ids = te.flow_ids or te.terminating_flow_ids or te.flow_ids_old or te.terminating_flow_ids_old
                sid = ids[0] if ids else None
            events.setdefault(uuid, []).append((ts, index, BEGIN, (sid, name, cat, ann)))
        elif kind == COUNTER and counter_names.get(uuid) == DROPPED_TRACK:
            dropped = max(dropped, te.counter_value)
        elif kind == INSTANT and te.name == METADATA_EVENT:
            for a in te.debug_annotations:
                if a.name == "json":
                    try:
                        meta = json.loads(a.string_value)
                    except ValueError:
                        raise TraceFileError("corrupt Perfetto trace: cltrace.metadata is not JSON") from None
    spans = _spans(events)
    meta["dropped_spans"] = max(dropped, int(meta.get("dropped_spans", 0) or 0))
    meta.setdefault("recorded_spans", len(spans))
    return spans, meta


def _timestamp(p: Any, st: _SeqState) -> int:
    """Host ``perf_counter_ns`` time of a packet."""
    clock = p.timestamp_clock_id or st.clock
    if clock in st.incremental:
        st.incremental[clock] += p.timestamp
        return st.incremental[clock]
    if clock == MONOTONIC:
        # Absolute: back onto the host clock through the sequence's own snapshot.
        for cid in st.incremental:
            return p.timestamp - st.mono_minus_clock.get(cid, 0)
    return p.timestamp


def _spans(events: dict[int, list[tuple[int, int, int, Any]]]) -> list[Span]:
    """Pair BEGIN/END per track and join each span's host and device slices."""
    host: dict[int, tuple[int, int, int, Any]] = {}
    device: dict[int, tuple[int, int, int, dict[str, Any]]] = {}
    for uuid, evs in events.items():
        evs.sort(key=lambda e: (e[0], e[1]))
        stack: list[tuple[int, Any]] = []
        for ts, _, kind, payload in evs:
            if kind == BEGIN:
                stack.append((ts, payload))
            elif stack:  # an END whose BEGIN was never written (run cut off) is skipped
                begin, (sid, name, cat, ann) = stack.pop()
                if sid is None:
                    continue
                if A_DEV_START in ann:
                    device[sid] = (uuid, begin, ts, ann)
                else:
                    host[sid] = (uuid, begin, ts, (name, cat, ann))
    spans = {}
    for sid, (uuid, hb, he, (name, cat, ann)) in host.items():
        attrs = {k: v for k, v in ann.items() if k not in _RESERVED} or None
        error = STATUS_ERROR if ann.get(A_STATUS) == STATUS_ERROR else STATUS_OK
        sp = Span(int(sid), int(ann.get(A_PARENT, 0)), name, cat, uuid, hb, he, attrs=attrs,
                  status=error, error=ann.get(A_ERROR) if error == STATUS_ERROR else None)
        d = device.get(sid)
        if d is not None:
            dt, ds, de, dann = d
            sp.device_track = dt
            sp.dev_start, sp.dev_end = ds, de
            sp.raw_start, sp.raw_end = dann.get(A_DEV_START), dann.get(A_DEV_END)
        spans[sp.id] = sp
    _fill_paths(spans)
    return sorted(spans.values(), key=lambda s: (s.host_begin, s.id))
