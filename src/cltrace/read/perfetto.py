"""Reading a cltrace ``.pftrace`` back into Spans (for ``cltrace summary`` and tests).

Packets are parsed one at a time with the ``perfetto`` package's protos, so a
file cut off mid-packet yields everything up to its last complete packet.
Timestamps are decoded as trace processor decodes them (per-sequence defaults,
incremental clocks set by ClockSnapshots, absolute MONOTONIC timestamps), and
slices are paired per track after a stable sort by time, so events at equal
times keep file order, as trace processor keeps it.

A device slice carries its raw "device.start" stamp where the raw - mapped offset changed on its
sequence; on the others it is the slice's start plus the sequence's last offset, in file order.
Its category is its span's (on the host slice). Flow ids (the span id of a launch) may be fixed64
``flow_ids`` or varint ``flow_ids_old``, as trace processor reads both.
"""
from __future__ import annotations

import json
import os
from typing import Any, Iterator

from google.protobuf.message import DecodeError
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

from ..errors import TraceFileError
from ..record.memory import COUNTER_PREFIX
from . import checks, schema
from .inflate import expand, varint_at as _varint
from ..export.perfetto.wire import (A_DEV_END, A_DEV_START, A_ERROR, A_PARENT, A_SPAN, A_STATUS, BEGIN, COUNTER,
                                    DROPPED_TRACK, END, INSTANT, METADATA_EVENT, MONOTONIC, PACKET, uv)
from ..timeline import sites
from ..timeline.spans import STATUS_ERROR, STATUS_OK, Span
from .tree import fill_paths

_RESERVED = {A_SPAN, A_PARENT, A_STATUS, A_ERROR, A_DEV_START, A_DEV_END, sites.STACK}


def iter_packets(data: bytes) -> list[tuple[int, bytes]]:
    """(offset, bytes) of each complete ``Trace.packet``, compressed packets expanded in place (offsets
    count in the expanded data); a cut-off last packet is left out."""
    return _frames(expand(data).data)


def _frames(data: bytes) -> list[tuple[int, bytes]]:
    out: list[tuple[int, bytes]] = []
    pos = 0
    n = len(data)
    while pos < n:
        if data[pos] != PACKET:
            if not data[pos:].strip(b"\x00"):
                break  # the zero-filled tail of a file whose writer died: same as cut off
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


def _annotation_value(a: Any, strings: dict[int, str]) -> Any:
    """A DebugAnnotation's value; ``strings``: the sequence's interned string values."""
    kind = a.WhichOneof("value")
    if kind is None:
        if a.array_values:
            return [_annotation_value(x, strings) for x in a.array_values]
        if a.dict_entries:
            return {_str(x.name): _annotation_value(x, strings) for x in a.dict_entries}
        return None
    if kind == "string_value_iid":
        return strings.get(a.string_value_iid, f"#{a.string_value_iid}")
    if kind == "legacy_json_value":
        try:
            return json.loads(a.legacy_json_value)
        except ValueError:
            return a.legacy_json_value
    return _str(getattr(a, kind))


def note_track(td: Any, counter_names: dict[int, str], track_names: dict[int, tuple[str, int, int]],
               pids: dict[int, int]) -> None:
    """A TrackDescriptor's name: a counter track's, or (name, parent uuid, pid: 0 where it names none) of
    any other track. A thread track with no parent track belongs to the process track of its pid (``pids``:
    pid -> that track's uuid), as trace processor reads it: its parent is noted as ``-1 - pid`` until
    ``tracks_meta`` resolves it."""
    if td.HasField("counter"):
        counter_names[td.uuid] = _str(td.name)
    else:
        name = td.thread.thread_name if td.HasField("thread") and not td.name else td.name
        name = name or (td.process.process_name if td.HasField("process") else "")
        pid = td.thread.pid if td.HasField("thread") else td.process.pid if td.HasField("process") else 0
        parent = td.parent_uuid
        if td.HasField("process"):
            pids.setdefault(td.process.pid, td.uuid)
        elif not parent and td.HasField("thread"):
            parent = -1 - td.thread.pid
        track_names[td.uuid] = (_str(name), parent, pid)


def tracks_meta(track_names: dict[int, tuple[str, int, int]], pids: dict[int, int]) -> dict[str, dict[str, Any]]:
    """The metadata's ``tracks``: each track's name, its process's name (its parent track's) and its pid
    (a thread's own, else its process's), as the Chrome reader gives them."""
    def up(parent: int) -> tuple[str, int, int]:
        if parent < 0:
            parent = pids.get(-1 - parent, 0)
        return track_names.get(parent, ("", 0, 0))

    out = {}
    for u, (n, parent, pid) in track_names.items():
        p = up(parent)
        out[str(u)] = {"name": n, "process": p[0], **({"pid": pid or p[2]} if pid or p[2] else {})}
    return out


def metadata_of(te: Any) -> Iterator[dict[str, Any]]:
    """The checked metadata each "json" annotation of a cltrace.metadata instant holds."""
    for a in te.debug_annotations:
        if a.name == "json":
            try:
                meta = json.loads(a.string_value)
            except (ValueError, RecursionError):
                raise TraceFileError("corrupt Perfetto trace: cltrace.metadata is not JSON") from None
            yield schema.metadata(meta)


def _site(loc: Any) -> sites.CallSite:
    """A SourceLocation as a ``CallSite``."""
    return sites.CallSite(_str(loc.file_name), int(loc.line_number), _str(loc.function_name))


def with_callers(site: sites.CallSite | None, stack: Any) -> sites.CallSite | None:
    """A slice's call site with the outer frames its "code.stacktrace" annotation lists (``stack_depth`` > 1)."""
    if site is not None and isinstance(stack, str):
        return sites.from_attrs({**site.attrs(), sites.STACK: stack})
    return site


def _str(v: Any) -> Any:
    """A proto2 string field holding invalid UTF-8 reads back as bytes: text with replacements."""
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else v


class _Sequence:
    """What a packet sequence has set up: defaults, clocks and interned strings."""

    __slots__ = ("clock", "uuid", "incremental", "mono_minus_host", "names", "cats", "dnames", "strings", "dev_offset",
                 "sites")

    def __init__(self) -> None:
        self.clock = 0
        self.uuid = 0
        self.incremental: dict[int, int] = {}  # clock id -> last absolute value (host perf_counter_ns)
        self.mono_minus_host = 0  # MONOTONIC - host clock, from the sequence's ClockSnapshot
        self.names: dict[int, str] = {}
        self.cats: dict[int, str] = {}
        self.dnames: dict[int, str] = {}
        self.strings: dict[int, str] = {}  # interned debug annotation string values
        self.dev_offset: int | None = None  # raw - mapped start of the last "device.start" on the sequence
        self.sites: dict[int, sites.CallSite] = {}  # interned source locations

    def clear(self) -> None:
        self.clock = self.uuid = 0
        self.names.clear()
        self.cats.clear()
        self.dnames.clear()
        self.strings.clear()
        self.sites.clear()

    def timestamp(self, p: Any) -> int:
        """Host ``perf_counter_ns`` time of a packet: incremental clocks add up; MONOTONIC goes back
        through the sequence's snapshot (a zero offset on Linux)."""
        clock = p.timestamp_clock_id or self.clock
        if clock in self.incremental:
            self.incremental[clock] += p.timestamp
            return self.incremental[clock]
        if clock == MONOTONIC:
            return p.timestamp - self.mono_minus_host
        return p.timestamp


class _Reader:
    """Packet by packet: sequences, counter track names, slice events per track, metadata."""

    def __init__(self) -> None:
        self.seqs: dict[int, _Sequence] = {}
        self.events: dict[int, list[tuple[int, int, int, Any]]] = {}  # track uuid -> (ts, index, type, payload)
        self.counter_names: dict[int, str] = {}
        self.track_names: dict[int, tuple[str, int, int]] = {}  # uuid -> (name, parent uuid, pid)
        self.pids: dict[int, int] = {}  # pid -> its process track's uuid
        self.meta: dict[str, Any] = {}
        self.dropped = 0
        self.memory: dict[str, list[tuple[int, int]]] = {}  # context label -> (ns, live bytes)
        self.closed = False  # the final metadata, written when the run closed the file, was read

    def packet(self, p: Any, index: int) -> None:
        st = self.seqs.get(p.trusted_packet_sequence_id)
        if st is None:
            st = self.seqs[p.trusted_packet_sequence_id] = _Sequence()
        if p.sequence_flags & pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED or p.incremental_state_cleared:
            st.clear()
        if p.HasField("trace_packet_defaults"):
            st.clock = p.trace_packet_defaults.timestamp_clock_id
            st.uuid = p.trace_packet_defaults.track_event_defaults.track_uuid
        if p.HasField("interned_data"):
            i = p.interned_data
            st.names.update((e.iid, _str(e.name)) for e in i.event_names)
            st.cats.update((e.iid, _str(e.name)) for e in i.event_categories)
            st.dnames.update((e.iid, _str(e.name)) for e in i.debug_annotation_names)
            st.strings.update((e.iid, _str(e.str)) for e in i.debug_annotation_string_values)
            st.sites.update((e.iid, _site(e)) for e in i.source_locations)
        if p.HasField("clock_snapshot"):
            clocks = {c.clock_id: c for c in p.clock_snapshot.clocks}
            for cid, c in clocks.items():
                if c.is_incremental:
                    st.incremental[cid] = c.timestamp
                    if MONOTONIC in clocks:
                        st.mono_minus_host = clocks[MONOTONIC].timestamp - c.timestamp
        elif p.HasField("track_descriptor"):
            note_track(p.track_descriptor, self.counter_names, self.track_names, self.pids)
        elif p.HasField("track_event"):
            self.track_event(p, st, index)

    def track_event(self, p: Any, st: _Sequence, index: int) -> None:
        te = p.track_event
        ts = st.timestamp(p)
        if not -checks.LIMIT_NS < ts < checks.LIMIT_NS:
            raise TraceFileError(f"corrupt Perfetto trace: the timestamp of packet {index} is {ts}, out of range")
        uuid = te.track_uuid if te.HasField("track_uuid") else st.uuid
        if te.type == END:
            self.events.setdefault(uuid, []).append((ts, index, END, None))
        elif te.type == BEGIN:
            name = _str(te.name) if te.HasField("name") else st.names.get(te.name_iid, "?")
            if te.categories:
                cat = _str(te.categories[0])
            else:
                cat = st.cats.get(te.category_iids[0], "?") if te.category_iids else "?"
            ann: dict[str, Any] = {}
            for a in te.debug_annotations:
                key = _str(a.name) if a.HasField("name") else st.dnames.get(a.name_iid, f"#{a.name_iid}")
                ann.setdefault(key, _annotation_value(a, st.strings))
            raw = ann.get(A_DEV_START)
            if isinstance(raw, int):
                st.dev_offset = raw - ts
            elif raw is None and st.dev_offset is not None:
                ann[A_DEV_START] = ts + st.dev_offset
            sid = ann.get(A_SPAN)
            if sid is None:
                ids = te.flow_ids or te.terminating_flow_ids or te.flow_ids_old or te.terminating_flow_ids_old
                sid = ids[0] if ids else None
            if te.HasField("source_location_iid"):
                site = st.sites.get(te.source_location_iid)
            else:
                site = _site(te.source_location) if te.HasField("source_location") else None
            site = with_callers(site, ann.get(sites.STACK))
            self.events.setdefault(uuid, []).append((ts, index, BEGIN, (sid, name, cat, ann, site)))
        elif te.type == COUNTER and self.counter_names.get(uuid) == DROPPED_TRACK:
            self.dropped = max(self.dropped, te.counter_value)
        elif te.type == COUNTER and self.counter_names.get(uuid, "").startswith(COUNTER_PREFIX):
            label = self.counter_names[uuid][len(COUNTER_PREFIX):]
            self.memory.setdefault(label, []).append((ts, te.counter_value))
        elif te.type == INSTANT and te.name == METADATA_EVENT:
            for meta in metadata_of(te):
                self.meta = meta
                self.closed = self.closed or "recorded_spans" in meta  # written by close only

    def spans(self) -> list[Span]:
        """Pair BEGIN/END per track and join each span's host and device slices."""
        host: dict[int, tuple[int, int, int, str, str, dict[str, Any], Any]] = {}
        device: dict[int, tuple[int, int, int, dict[str, Any]]] = {}
        for uuid, evs in self.events.items():
            evs.sort(key=lambda e: (e[0], e[1]))
            stack: list[tuple[int, Any]] = []
            for ts, _, kind, payload in evs:
                if kind == BEGIN:
                    stack.append((ts, payload))
                elif stack:  # an END whose BEGIN never reached the file (run cut off) is skipped
                    begin, (sid, name, cat, ann, site) = stack.pop()
                    if sid is None:
                        continue
                    sid = checks.integer(sid, f"span id {sid!r:.20} of {name!r:.40}")
                    if A_DEV_START in ann:
                        device[sid] = (uuid, begin, ts, ann)
                    else:
                        host[sid] = (uuid, begin, ts, name, cat, ann, site)
        spans: dict[int, Span] = {}
        for sid, (uuid, hb, he, name, cat, ann, site) in host.items():
            where = f"span {sid} ({name!r:.40})"
            failed = ann.get(A_STATUS) == STATUS_ERROR
            error = ann.get(A_ERROR) if failed else None
            sp = Span(sid, checks.integer(ann.get(A_PARENT, 0), f"{where}: parent"), name, cat, uuid, hb, he,
                      attrs=checks.attrs({k: v for k, v in ann.items() if k not in _RESERVED}, where,
                                         cat) or None,
                      status=STATUS_ERROR if failed else STATUS_OK,
                      error=None if error is None else checks.text(error, f"{where}: error"), site=site)
            d = device.get(sid)
            if d is not None:  # a device slice whose END was cut off leaves the span host-only
                sp.device_track, sp.dev_start, sp.dev_end, dann = d
                sp.raw_start = raw = checks.optional_integer(dann[A_DEV_START], f"{where}: device start")
                if A_DEV_END in dann:
                    sp.raw_end = checks.optional_integer(dann[A_DEV_END], f"{where}: device end")
                elif raw is not None:  # left out where END - START equals the slice's length
                    sp.raw_end = raw + (sp.dev_end - sp.dev_start)
            spans[sp.id] = sp
        fill_paths(spans)
        return sorted(spans.values(), key=lambda s: (s.host_begin, s.id))


def load_pftrace(path: str | os.PathLike[str]) -> tuple[list[Span], dict[str, Any]]:
    """Spans and metadata of a ``.pftrace`` written by cltrace. Raises TraceFileError with a one-line reason."""
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError as exc:
        raise TraceFileError(f"cannot read it: {exc.strerror}") from None
    if not data:
        raise TraceFileError("file is empty")
    file_bytes = len(data)
    expanded = expand(data)
    data = expanded.data
    packets = _frames(data)
    if not packets:
        raise TraceFileError("not a Perfetto trace: the file ends before its first complete packet")
    reader = _Reader()
    for index, (offset, raw) in enumerate(packets):
        try:
            p = pb.TracePacket.FromString(raw)
        except (DecodeError, ValueError, RecursionError):
            raise TraceFileError(f"corrupt Perfetto trace: the packet at byte {offset} does not parse") from None
        if index == 0 and not p.HasField("clock_snapshot"):
            raise TraceFileError("not a cltrace Perfetto trace: it does not open with cltrace's clock snapshot")
        reader.packet(p, index)
    spans = reader.spans()
    meta = reader.meta
    meta["dropped_spans"] = max(reader.dropped, meta.get("dropped_spans", 0))
    if reader.memory:
        meta["memory_samples"] = {k: sorted(v) for k, v in reader.memory.items()}
    meta.setdefault("recorded_spans", len(spans))
    meta.setdefault("tracks", tracks_meta(reader.track_names, reader.pids))
    offset, raw = packets[-1]
    end = offset + 1 + len(uv(len(raw))) + len(raw)
    if end < len(data) or not reader.closed:  # the tail after the last complete packet is the file's own
        checks.cut_off(meta, expanded.file_offset(end), file_bytes, len(packets), 0, "packets")
    expanded.note(meta)
    return spans, meta

