"""Perfetto protobuf (``.pftrace``), streamed.

The file is a ``perfetto.protos.Trace``: a run of ``Trace.packet`` entries
(field 1, length-delimited) appended batch by batch, so a run cut off after
a flush still loads up to its last complete packet.

Tracks (TrackDescriptor): the host process; one thread track per host thread;
the compile track inside the process; per device a parent track
("OpenCL: <device>") holding one track per (queue, submitting thread), named
as the TrackRegistry names it; counter tracks for bytes transferred and for
spans dropped. Spans are TYPE_SLICE_BEGIN/END pairs. A launch's host slice
carries ``flow_ids`` = [span id] and its device slice ``terminating_flow_ids``
= [span id]; other slices carry the span id as a debug annotation, next to
parent, status, error, attributes and the raw device stamps.

Size: each track writes on its own packet sequence whose TracePacketDefaults
name the track and a sequence-scoped incremental clock (id 64, tied by a
ClockSnapshot to BUILTIN_CLOCK_MONOTONIC, which ``perf_counter_ns`` reads on
Linux); event names, categories and annotation names are interned per
sequence. A timestamp that goes backwards on a sequence is written absolute
on MONOTONIC, which leaves the incremental clock as it was.

Speed: the packets of a batch are laid out column by column with numpy (one
row per packet, one column per protobuf field, field numbers taken from the
package's descriptors); Python touches each span only for dictionary
look-ups. Rare packets (descriptors, clock snapshots, metadata) are built
with the protos.

Order: trace processor sorts packets by timestamp and breaks ties by file
position, so events at equal timestamps must be written in nesting order.
cltrace assigns span ids in pre-order on each thread, so within a write
BEGIN(Y) sorts as (ts, id(Y)) and END(X) as (ts, last descendant id of X,
1, -id(X)). Across writes two things are held back so that late events can
still go first: (1) a parent arrives after its children, so for each parent
still to come the events at the earliest timestamp of its known subtree
(which its BEGIN may tie with) wait for it; (2) a span on a device queue may
arrive one write after the next command (it was still running when that
one's status was read), so each track's events at its latest timestamp wait
for the next write. Host times are distinct clock reads, so they do not tie
across writes. Held events reach the file with the write that releases them,
or at close.
"""
from __future__ import annotations

import collections
import json
import os
import threading
import time
from itertools import compress, repeat
from operator import attrgetter, is_, is_not, ne, not_
from typing import IO, Any, Sequence

import numpy as np
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

from .. import session
from ..spans import FILL, KERNEL, MARKER, REGION_CATS, STATUS_OK, TRANSFER, Span
from ..tracks import DEVICE_QUEUE, HOST_THREAD

# ---- wire format, from the package's descriptors ------------------------------
_VARINT, _FIXED64, _LEN = 0, 1, 2


def _uv(n: int) -> bytes:
    """Varint of an unsigned (or, as two's complement, a negative int64) integer."""
    n &= 0xFFFFFFFFFFFFFFFF
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _tag(msg: Any, name: str, wire: int) -> bytes:
    return _uv((msg.DESCRIPTOR.fields_by_name[name].number << 3) | wire)


def _byte(tag: bytes) -> int:
    assert len(tag) == 1, "field number too large for a one-byte tag"
    return tag[0]


_PACKET = _byte(_tag(pb.Trace, "packet", _LEN))
_P_TS = _byte(_tag(pb.TracePacket, "timestamp", _VARINT))
P_CLOCK = _tag(pb.TracePacket, "timestamp_clock_id", _VARINT)
P_SEQ = _tag(pb.TracePacket, "trusted_packet_sequence_id", _VARINT)
P_FLAGS = _tag(pb.TracePacket, "sequence_flags", _VARINT)
P_TE = _tag(pb.TracePacket, "track_event", _LEN)
P_INTERNED = _tag(pb.TracePacket, "interned_data", _LEN)
TE_TYPE = _tag(pb.TrackEvent, "type", _VARINT)
TE_CAT = _tag(pb.TrackEvent, "category_iids", _VARINT)
TE_NAME = _tag(pb.TrackEvent, "name_iid", _VARINT)
TE_UUID = _tag(pb.TrackEvent, "track_uuid", _VARINT)
TE_COUNTER = _tag(pb.TrackEvent, "counter_value", _VARINT)
TE_FLOW = _tag(pb.TrackEvent, "flow_ids", _FIXED64)
TE_TFLOW = _tag(pb.TrackEvent, "terminating_flow_ids", _FIXED64)
TE_DEBUG = _tag(pb.TrackEvent, "debug_annotations", _LEN)
DA_NAME_IID = _tag(pb.DebugAnnotation, "name_iid", _VARINT)
DA_NAME = _tag(pb.DebugAnnotation, "name", _LEN)
DA_BOOL = _tag(pb.DebugAnnotation, "bool_value", _VARINT)
DA_INT = _tag(pb.DebugAnnotation, "int_value", _VARINT)
DA_DOUBLE = _tag(pb.DebugAnnotation, "double_value", _FIXED64)
DA_STRING = _tag(pb.DebugAnnotation, "string_value", _LEN)
DA_DICT = _tag(pb.DebugAnnotation, "dict_entries", _LEN)
DA_ARRAY = _tag(pb.DebugAnnotation, "array_values", _LEN)
_TABLES = tuple(  # interned tables: (InternedData field tag, iid tag, name tag)
    (_tag(pb.InternedData, table, _LEN), _tag(entry, "iid", _VARINT), _tag(entry, "name", _LEN))
    for table, entry in (("event_categories", pb.EventCategory), ("event_names", pb.EventName),
                         ("debug_annotation_names", pb.DebugAnnotationName)))
_CATS, _NAMES, _DNAMES = 0, 1, 2

BEGIN, END, INSTANT, COUNTER = (pb.TrackEvent.TYPE_SLICE_BEGIN, pb.TrackEvent.TYPE_SLICE_END,
                                pb.TrackEvent.TYPE_INSTANT, pb.TrackEvent.TYPE_COUNTER)
SEQ_CLEARED = pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED
SEQ_NEEDS = pb.TracePacket.SEQ_NEEDS_INCREMENTAL_STATE
MONOTONIC = pb.BUILTIN_CLOCK_MONOTONIC
BOOTTIME = pb.BUILTIN_CLOCK_BOOTTIME
HOST_CLOCK = 64  # sequence-scoped, incremental; its values are perf_counter_ns
META_SEQ = 1  # descriptors, dropped-span counter and metadata; absolute MONOTONIC timestamps
SYNTHETIC_UUID = 1 << 32  # uuids of tracks the TrackRegistry does not number
METADATA_EVENT = "cltrace.metadata"
DROPPED_TRACK = "cltrace: dropped spans"

# Debug annotation names the reader takes as span fields rather than attributes.
A_SPAN, A_PARENT, A_STATUS, A_ERROR = "span", "parent", "status", "error"
A_DEV_START, A_DEV_END = "device.start", "device.end"
_STANDARD_ANNS = (A_SPAN, A_PARENT, A_DEV_START, A_DEV_END)

# Spans that never have children, so never a parent that events wait for.
_LEAF_CATS = frozenset({KERNEL, TRANSFER, MARKER, FILL})
_ARRIVED_WINDOW = 1 << 16
_MAX_HELD_GROUPS = 4096

# Columns of a batch's packet rows.
(C_TRACK, C_TS, C_K1, C_K2, C_K3, C_G, C_PRE, C_FLOW, C_SID, C_SPANANN, C_PARENT, C_EXTRA,
 C_RAW, C_RAWS, C_RAWE) = range(15)
_NCOLS = 15
_FLOW_OUT, _FLOW_IN = 1, 2
_FLOW_TAGS = np.frombuffer(b"\0\0" + TE_FLOW + TE_TFLOW, np.uint8).reshape(3, 2)  # by C_FLOW
_TYPES = np.array([BEGIN, END, COUNTER], np.uint8)  # by C_K2
_ABS_CLOCK = P_CLOCK + _uv(MONOTONIC)

# Columns are read one attribute at a time: lists of ints and strings are not tracked by the
# garbage collector, whereas a tuple per span would trigger collections on every batch.
_SPAN_FIELDS = tuple(map(attrgetter, ("id", "parent", "thread", "host_begin", "host_end", "cat", "name",
                                      "device_track", "attrs", "status", "error")))
_DEVICE_FIELDS = tuple(map(attrgetter, ("device_track", "dev_start", "dev_end", "raw_start", "raw_end")))


def _frame(body: bytes) -> bytes:
    return bytes((_PACKET,)) + _uv(len(body)) + body


def _proto_packet(p: Any) -> bytes:
    return _frame(p.SerializeToString())


def _mono_offset() -> int:
    """MONOTONIC - perf_counter_ns: zero where both read CLOCK_MONOTONIC (Linux)."""
    if time.get_clock_info("perf_counter").implementation == time.get_clock_info("monotonic").implementation:
        return 0
    samples = []
    for _ in range(9):
        p0 = time.perf_counter_ns()
        m = time.monotonic_ns()
        p1 = time.perf_counter_ns()
        samples.append((p1 - p0, m - (p0 + p1) // 2))
    return min(samples)[1]


def _value(v: Any) -> bytes:
    """The value fields of a DebugAnnotation for a Python attribute value."""
    if isinstance(v, (np.generic, np.ndarray)):
        v = v.tolist()
    if isinstance(v, bool):
        return DA_BOOL + (b"\x01" if v else b"\x00")
    if isinstance(v, int) and -(1 << 63) <= v < (1 << 63):
        return DA_INT + _uv(v)
    if isinstance(v, float):
        return DA_DOUBLE + np.float64(v).tobytes()
    if isinstance(v, (list, tuple)) and v:
        out = bytearray()
        for x in v:
            inner = _value(x)
            out += DA_ARRAY + _uv(len(inner)) + inner
        return bytes(out)
    if isinstance(v, dict) and v:
        out = bytearray()
        for k, x in v.items():
            key = str(k).encode("utf-8", "replace")
            inner = DA_NAME + _uv(len(key)) + key + _value(x)
            out += DA_DICT + _uv(len(inner)) + inner
        return bytes(out)
    raw = str(v).encode("utf-8", "replace")
    return DA_STRING + _uv(len(raw)) + raw


# ---- columnar packet layout -----------------------------------------------------
_U64 = np.uint64
_VLEN_EDGES = np.array([1 << (7 * k) for k in range(1, 10)], dtype=_U64)


def _vlen(u: np.ndarray) -> np.ndarray:
    """Varint byte counts of uint64 values."""
    if len(u) < 1024:
        return np.searchsorted(_VLEN_EDGES, u, side="right") + 1
    n = np.ones(len(u), np.int64)
    for edge in _VLEN_EDGES:
        more = u >= edge
        if not more.any():
            break
        n += more
    return n


class _Pool:
    """Byte strings that packet rows refer to by index."""

    def __init__(self, items: list[bytes] | None = None) -> None:
        self.items: list[bytes] = [] if items is None else items
        self._arrays: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None

    def add(self, b: bytes) -> int:
        self.items.append(b)
        self._arrays = None
        return len(self.items) - 1

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if self._arrays is None:
            lens = np.fromiter(map(len, self.items), np.int64, len(self.items))
            buf = np.frombuffer(b"".join(self.items) or b"\x00", np.uint8)
            self._arrays = (buf, np.cumsum(lens) - lens, lens)
        return self._arrays


class _Layout:
    """Rows of protobuf fields (constants, varints, per-row fixed bytes, pooled byte strings), laid out
    column by column: each field is one vectorized pass over the rows that have it (``rows``: an index
    array, or None for all rows)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.fields: list[list[Any]] = []

    def _add(self, kind: str, rows: np.ndarray | None, data: Any, extra: Any, ln: np.ndarray) -> np.ndarray:
        self.fields.append([kind, rows, data, extra, ln])
        return ln

    def const(self, data: bytes, rows: np.ndarray | None = None) -> np.ndarray:
        ln = np.full(self.n if rows is None else len(rows), len(data), np.int64)
        return self._add("c", rows, np.frombuffer(data, np.uint8), None, ln)

    def fixed(self, rec: np.ndarray, rows: np.ndarray | None = None) -> np.ndarray:
        """Per-row bytes of one width: ``rec`` has shape (rows, width)."""
        return self._add("f", rows, rec, None, np.full(len(rec), rec.shape[1], np.int64))

    def varint(self, values: np.ndarray, rows: np.ndarray | None = None) -> np.ndarray:
        u = values.view(_U64)
        return self._add("v", rows, u, None, _vlen(u))

    def length(self) -> int:
        """A varint over all rows whose values are given later with ``set_length``."""
        self._add("v", None, None, None, np.zeros(self.n, np.int64))
        return len(self.fields) - 1

    def set_length(self, at: int, values: np.ndarray) -> np.ndarray:
        u = values.view(_U64)
        self.fields[at][2] = u
        self.fields[at][4] = ln = _vlen(u)
        return ln

    def pooled(self, ids: np.ndarray, pool: _Pool, rows: np.ndarray | None = None) -> np.ndarray:
        buf, off, lens = pool.arrays()
        return self._add("p", rows, ids, (buf, off), lens[ids])

    def annotation(self, headers: np.ndarray, values: np.ndarray, pool: _Pool, rows: np.ndarray) -> None:
        """An int debug annotation: the pooled header for the value's varint length, then the varint.

        ``headers`` are pool ids of each row's header for a one-byte value; the next nine ids hold the
        headers for longer values.
        """
        u = values.view(_U64)
        ln = _vlen(u)
        self.pooled(headers + ln - 1, pool, rows)
        self._add("v", rows, u, None, ln)

    def total(self, first: int = 0) -> np.ndarray:
        """Bytes per row of the fields from index ``first`` on."""
        total = np.zeros(self.n, np.int64)
        for _, rows, _, _, ln in self.fields[first:]:
            if rows is None:
                total += ln
            else:
                total[rows] += ln
        return total

    def bytes(self) -> bytes:
        total = self.total()
        end = np.cumsum(total)
        out = np.empty(int(end[-1]) if self.n else 0, np.uint8)
        pos = end - total
        for kind, rows, data, extra, ln in self.fields:
            if rows is None:
                p = pos
            elif len(rows):
                p = pos[rows]
            else:
                continue
            if kind == "v":
                _put_varints(out, p, data, ln)
            elif kind == "p":
                buf, off = extra
                _put_ragged(out, p, buf, off[data], ln)
            else:
                w = data.shape[-1]
                if w == 1:
                    out[p] = data[..., 0] if data.ndim == 2 else data[0]
                else:
                    out[p[:, None] + np.arange(w)] = data
            if rows is None:
                pos += ln
            else:
                pos[rows] += ln
        return out.tobytes()


def _put_varints(out: np.ndarray, pos: np.ndarray, u: np.ndarray, ln: np.ndarray) -> None:
    width = int(ln.max())
    if width == 1:
        out[pos] = u.astype(np.uint8)
        return
    k = np.arange(width)
    groups = ((u[:, None] >> (k * 7).astype(_U64)) & _U64(0x7F)).astype(np.uint8)
    groups |= (k < (ln - 1)[:, None]).view(np.uint8) << 7  # continuation bit on all but the last byte
    used = k < ln[:, None]
    out[(pos[:, None] + k)[used]] = groups[used]


def _put_ragged(out: np.ndarray, dst: np.ndarray, buf: np.ndarray, src: np.ndarray, ln: np.ndarray) -> None:
    """Copies buf[src[i]:src[i]+ln[i]] to out[dst[i]:], one pass per distinct length (there are few)."""
    if not len(ln):
        return
    lo, hi = int(ln.min()), int(ln.max())
    for width in range(lo, hi + 1) if hi - lo < 16 else np.unique(ln).tolist():
        if lo == hi:
            d, s_ = dst, src
        else:
            m = ln == width
            if not m.any():
                continue
            d, s_ = dst[m], src[m]
        step = np.arange(width)
        out[d[:, None] + step] = buf[s_[:, None] + step]


# ---- per-track sequences ------------------------------------------------------------
class _Seq:
    """One packet sequence (one track): interning tables, incremental clock, row templates."""

    __slots__ = ("id", "uuid", "track", "last", "iids", "pending", "tail", "anns", "counter", "counter_prefix",
                 "extras")

    def __init__(self, seq_id: int, uuid: int, track: int) -> None:
        self.id = seq_id
        self.uuid = uuid
        self.track = track
        self.last: int | None = None  # None until the sequence's first packet is written
        self.iids: list[dict[str, int]] = [{}, {}, {}]
        self.pending = bytearray()  # interned entries not yet written
        self.tail = -1  # pool id: the fields between the timestamp and the TrackEvent
        self.anns: dict[str, int] = {}  # annotation name -> pool id of its header for a 1-byte value
        self.counter: int | None = None  # uuid of this track's bytes counter
        self.counter_prefix = -1
        self.extras: dict[Any, bytes] = {}

    def intern(self, table: int, text: str) -> int:
        ids = self.iids[table]
        iid = ids.get(text)
        if iid is None:
            iid = ids[text] = len(ids) + 1
            t_table, t_iid, t_name = _TABLES[table]
            raw = text.encode("utf-8", "replace")
            entry = t_iid + _uv(iid) + t_name + _uv(len(raw)) + raw
            self.pending += t_table + _uv(len(entry)) + entry
        return iid

    def dname(self, name: str) -> bytes:
        return DA_NAME_IID + _uv(self.intern(_DNAMES, name))

    def annotation(self, name: str, value: bytes) -> bytes:
        inner = self.dname(name) + value
        return TE_DEBUG + _uv(len(inner)) + inner


class PerfettoTraceSink:
    """Streams spans to a Perfetto ``.pftrace`` file (layout: see the module docstring)."""

    def __init__(self, path: str | os.PathLike[str], flush_every: int = 65536) -> None:
        self.path = os.fspath(path)
        self.flush_every = flush_every
        self._fh: IO[bytes] | None = None
        self._recorder: Any = None
        self._seqs: dict[int, _Seq] = {}
        self._pool = _Pool()
        self._prefixes: dict[tuple[int, str, str], int] = {}  # (track, cat, name) -> pool id
        self._device_uuids: dict[str, int] = {}
        self._next_uuid = SYNTHETIC_UUID + 1
        self._process_uuid = SYNTHETIC_UUID
        self._dropped_uuid = 0
        self._dropped_written = -1
        self._mono = 0
        self._pend_md: dict[int, int] = {}  # parent still to come -> last descendant id seen
        self._held: dict[int, dict[int, tuple[np.ndarray, list[bytes | None]]]] = {}  # parent -> track -> rows
        self._tail: tuple[np.ndarray, list[bytes | None]] | None = None  # each track's latest-timestamp rows
        self._arrived: set[int] = set()
        self._arrived_order: collections.deque[int] = collections.deque()
        self._bytes: dict[int, int] = {}  # track -> cumulative bytes transferred
        self._since_flush = 0
        self.bytes_written = 0
        self.packets_written = 0

    # -- SpanSink ---------------------------------------------------------------
    def start(self, recorder: Any) -> None:
        if self._fh is not None:
            return
        self._recorder = recorder
        self._mono = _mono_offset()
        d = os.path.dirname(self.path)
        if d:
            os.makedirs(d, exist_ok=True)
        self._fh = open(self.path, "wb", buffering=1 << 20)
        snap = pb.ClockSnapshot(primary_trace_clock=MONOTONIC)
        boot = getattr(time, "CLOCK_BOOTTIME", None)
        if boot is not None:  # lets the trace line up with system traces (BOOTTIME)
            m0 = time.monotonic_ns()
            b = time.clock_gettime_ns(boot)
            m1 = time.monotonic_ns()
            snap.clocks.add(clock_id=MONOTONIC, timestamp=(m0 + m1) // 2)
            snap.clocks.add(clock_id=BOOTTIME, timestamp=b)
        else:
            snap.clocks.add(clock_id=MONOTONIC, timestamp=time.monotonic_ns())
        out = [_proto_packet(pb.TracePacket(
            trusted_packet_sequence_id=META_SEQ, sequence_flags=SEQ_CLEARED,
            trace_packet_defaults=pb.TracePacketDefaults(timestamp_clock_id=MONOTONIC),
            clock_snapshot=snap))]
        pid = recorder.tracks.pid
        out.append(self._descriptor(pb.TrackDescriptor(
            uuid=self._process_uuid, process=pb.ProcessDescriptor(pid=pid, process_name=f"host (pid {pid})"))))
        self._dropped_uuid = self._new_uuid()
        out.append(self._descriptor(pb.TrackDescriptor(
            uuid=self._dropped_uuid, parent_uuid=self._process_uuid, name=DROPPED_TRACK,
            counter=pb.CounterDescriptor(unit=pb.CounterDescriptor.UNIT_COUNT))))
        early = {k: v for k, v in recorder.metadata().items() if k not in ("dropped_spans", "recorded_spans")}
        out.append(self._metadata_packet(early))
        self._emit(b"".join(out))
        self._fh.flush()

    def write(self, spans: Sequence[Span]) -> None:
        if self._fh is None or not spans:
            return
        head: list[bytes] = []
        rows, extras, arrivals = self._rows(list(spans), head)
        rows, now = self._hold_back(rows, extras, arrivals)
        self._emit(b"".join(head) + self._encode(rows, extras, now))
        self._since_flush += len(spans)
        if self._since_flush >= self.flush_every:
            self._since_flush = 0
            self._fh.flush()

    def flush(self, meta: dict[str, Any]) -> None:
        if self._fh is None:
            return
        self._emit(self._dropped(int(meta.get("dropped_spans", 0))))
        self._since_flush = 0
        self._fh.flush()

    def close(self, meta: dict[str, Any]) -> None:
        fh = self._fh
        if fh is None:
            return
        parts = [(r, x) for per_track in self._held.values() for r, x in per_track.values()]
        if self._tail is not None:
            parts.append(self._tail)
            self._tail = None
        self._held.clear()
        self._pend_md.clear()
        if parts:
            extras: list[bytes] = []
            self._emit(self._encode(np.concatenate([self._readd(r, x, extras) for r, x in parts]), extras))
        self._emit(self._dropped(int(meta.get("dropped_spans", 0))) + self._metadata_packet(meta))
        fh.flush()
        try:
            os.fsync(fh.fileno())
        except OSError:
            pass
        fh.close()
        self._fh = None

    # -- rows -----------------------------------------------------------------------
    def _rows(self, spans: list[Span], head: list[bytes]) -> tuple[np.ndarray, list[bytes], list[tuple[int, int]]]:
        """One row per packet (BEGIN/END per placement, counters) for a batch of spans.

        Also returns (id, group) of the spans that may be parents, for ``_hold_back``.
        """
        n = len(spans)
        (sids, parents, threads, hbs, hes, cats, names, dts, attrs, statuses, errors) = [
            list(map(f, spans)) for f in _SPAN_FIELDS]
        ids = np.array(sids, np.int64)
        par = np.array(parents, np.int64)
        for t in set(threads).union(dts):
            if t is not None and t not in self._seqs:
                self._open_sequence(t, head)
        group, md, arrivals = self._groups(cats, ids, par)
        placed = list(map(is_not, dts, repeat(None)))
        flows = np.array(placed) & ~np.array(list(map(REGION_CATS.__contains__, cats)))
        thr = np.array(threads, np.int64)
        need = np.array(list(map(bool, attrs)))
        if statuses.count(STATUS_OK) != n:
            need |= np.array(list(map(STATUS_OK.__ne__, statuses)))
        changed = np.ones(n, bool)  # launches repeat their attributes: encode each run of equal ones once
        if n > 1:
            changed[1:] = (_differs(attrs) | (thr[1:] != thr[:-1]) | _differs(statuses) | _differs(errors))
        new = need & changed
        extras = [self._extra(spans[i], threads[i]) for i in np.flatnonzero(new).tolist()]
        xid = np.where(need, np.cumsum(new) - 1, -1)
        dv = list(compress(range(n), placed))
        m = len(dv)
        rows = np.zeros((2 * n + 2 * m, _NCOLS), np.int64)
        h0, h1 = rows[:n], rows[n:2 * n]
        h0[:, C_TRACK] = thr
        h1[:, C_TRACK] = h0[:, C_TRACK]
        h0[:, C_TS] = np.array(hbs, np.int64)
        h1[:, C_TS] = np.array(hes, np.int64)
        h0[:, C_K1] = h0[:, C_SID] = ids
        h1[:, C_K1] = md
        h1[:, C_K2] = 1
        h1[:, C_K3] = -ids
        h0[:, C_G] = h1[:, C_G] = group
        h0[:, C_PRE] = self._prefix_ids(threads, cats, names)
        h1[:, C_PRE] = -1
        h0[:, C_FLOW] = flows * _FLOW_OUT
        h0[:, C_SPANANN] = ~flows
        h0[:, C_PARENT] = par
        h0[:, C_EXTRA] = xid
        h1[:, C_EXTRA] = -1
        if m:
            dsp = list(compress(spans, placed))
            dtrack, dstart, dend, raws, rawe = [list(map(f, dsp)) for f in _DEVICE_FIELDS]
            idx = np.array(dv, np.int64)
            d0, d1 = rows[2 * n:2 * n + m], rows[2 * n + m:]
            d0[:, C_TRACK] = np.array(dtrack, np.int64)
            d1[:, C_TRACK] = d0[:, C_TRACK]
            d0[:, C_TS] = np.array(dstart, np.int64)
            d1[:, C_TS] = np.array(dend, np.int64)
            d0[:, C_K1] = d0[:, C_SID] = ids[idx]
            d1[:, C_K1] = md[idx]
            d1[:, C_K2] = 1
            d1[:, C_K3] = -ids[idx]
            d0[:, C_G] = d1[:, C_G] = group[idx]
            d0[:, C_PRE] = self._prefix_ids(dtrack, list(compress(cats, placed)), list(compress(names, placed)))
            d1[:, C_PRE] = -1
            f = flows[idx]
            d0[:, C_FLOW] = f * _FLOW_IN
            d0[:, C_SPANANN] = ~f
            d0[:, C_EXTRA] = d1[:, C_EXTRA] = -1
            if None in raws or None in rawe:  # device placement without raw stamps: no annotations
                d0[:, C_RAW] = [a is not None and b is not None for a, b in zip(raws, rawe)]
                raws = [a or 0 for a in raws]
                rawe = [b or 0 for b in rawe]
            else:
                d0[:, C_RAW] = 1
            d0[:, C_RAWS] = np.array(raws, np.int64)
            d0[:, C_RAWE] = np.array(rawe, np.int64)
        counters = self._counter_rows(spans, cats, attrs, group, md, head, extras)
        if counters is not None:
            rows = np.concatenate([rows, counters])
        return rows, extras, arrivals

    def _prefix_ids(self, tracks: list[int], cats: list[str], names: list[str]) -> np.ndarray:
        """Pool ids of the BEGIN templates (category and name iids) of rows on the given tracks."""
        ids = list(map(self._prefixes.get, zip(tracks, cats, names)))  # zip's tuples are transient
        if None in ids:
            for key in set(compress(zip(tracks, cats, names), map(is_, ids, repeat(None)))):
                self._prefix(*key)
            ids = list(map(self._prefixes.__getitem__, zip(tracks, cats, names)))
        return np.array(ids, np.int64)

    def _counter_rows(self, spans: list[Span], cats: list[str], attrs: list[Any], group: np.ndarray, md: np.ndarray,
                      head: list[bytes], extras: list[bytes]) -> np.ndarray | None:
        """Cumulative bytes-transferred samples, at the end of each transfer that says its size."""
        if TRANSFER not in cats:
            return None
        out = []
        for i, (c, a) in enumerate(zip(cats, attrs)):
            if c != TRANSFER or not a:
                continue
            nbytes = a.get("bytes")
            if not isinstance(nbytes, int) or isinstance(nbytes, bool):
                continue
            s = spans[i]
            track = s.device_track if s.device_track is not None else s.thread
            seq = self._seqs[track]
            if seq.counter is None:
                seq.counter = self._counter_track(track, head)
            total = self._bytes[track] = self._bytes.get(track, 0) + nbytes
            row = np.zeros(_NCOLS, np.int64)
            row[[C_TRACK, C_TS, C_K1, C_K2, C_K3, C_G]] = (
                track, s.dev_end if s.device_track is not None else s.host_end, md[i], 2, -s.id, group[i])
            row[C_PRE] = self._prefix_counter(seq)
            row[C_EXTRA] = len(extras)
            extras.append(TE_COUNTER + _uv(total))
            out.append(row)
        return np.array(out) if out else None

    def _groups(self, cats: Sequence[str], ids: np.ndarray,
                par: np.ndarray) -> tuple[np.ndarray, np.ndarray, list[tuple[int, int]]]:
        """Per span: the parent still to come that its events wait for (0: none) and its last descendant id.

        Also (id, group) of each span that may be a parent.
        """
        n = len(ids)
        order = np.argsort(ids, kind="stable")
        sorted_ids = ids[order]
        at = np.minimum(np.searchsorted(sorted_ids, par), n - 1)
        inside = (sorted_ids[at] == par) & (par != 0)
        up = np.where(inside, order[at], np.arange(n))  # in-batch parent, or self
        arrived = self._arrived
        outside, inverse = np.unique(np.where(inside, 0, par), return_inverse=True)
        waits = np.array([p if p and p not in arrived else 0 for p in outside.tolist()], np.int64)
        top = up
        for _ in range(64):  # topmost in-batch ancestor, by pointer doubling
            nxt = top[top]
            if np.array_equal(nxt, top):
                break
            top = nxt
        else:
            raise ValueError("spans whose parents form a cycle")
        group = waits[inverse][top]
        md = ids.copy()
        pend = self._pend_md
        arrivals = []
        for i in compress(range(n), map(not_, map(_LEAF_CATS.__contains__, cats))):
            sid = int(ids[i])
            arrivals.append((sid, int(group[i])))
            m = pend.pop(sid, 0)
            if m > md[i]:
                md[i] = m
        if inside.any():
            child, parent = np.nonzero(inside)[0], up[inside]
            while True:  # each pass carries last-descendant ids one level up (ids only grow: it ends)
                before = md[parent].copy()
                np.maximum.at(md, parent, md[child])
                if np.array_equal(before, md[parent]):
                    break
        waiting = ~inside & (waits[inverse] != 0)
        if waiting.any():
            ps, pinv = np.unique(par[waiting], return_inverse=True)
            best = np.zeros(len(ps), np.int64)
            np.maximum.at(best, pinv, md[waiting])
            for p, v in zip(ps.tolist(), best.tolist()):
                if pend.get(p, 0) < v:
                    pend[p] = v
        return group, md, arrivals

    def _hold_back(self, rows: np.ndarray, extras: list[bytes],
                   arrivals: list[tuple[int, int]]) -> tuple[np.ndarray, np.ndarray]:
        """Rows, with the indices of those to write now; stashes the rest (see "Order" in the module
        docstring) and brings back earlier stashed rows. ``extras`` may grow."""
        held = self._held
        parts = [rows]
        if self._tail is not None:
            parts.append(self._readd(*self._tail, extras))
            self._tail = None
        for sid, g in arrivals:
            mine = held.pop(sid, None)
            if mine:
                for r, x in mine.values():
                    r = self._readd(r, x, extras)
                    r[:, C_G] = g
                    parts.append(r)
            self._arrived.add(sid)
            self._arrived_order.append(sid)
        while len(self._arrived_order) > _ARRIVED_WINDOW:
            self._arrived.discard(self._arrived_order.popleft())
        if held:
            for g in np.unique(rows[:, C_G]).tolist():
                mine = held.pop(g, None) if g else None
                if mine:
                    parts.extend(self._readd(r, x, extras) for r, x in mine.values())
        rows = np.concatenate(parts) if len(parts) > 1 else rows
        now = np.ones(len(rows), bool)
        waiting = np.flatnonzero(rows[:, C_G])
        if len(waiting):
            w = rows[waiting][:, [C_TRACK, C_G, C_TS]]
            o = np.lexsort((w[:, 2], w[:, 1], w[:, 0]))
            w, waiting = w[o], waiting[o]
            start = np.ones(len(w), bool)
            start[1:] = (w[1:, 0] != w[:-1, 0]) | (w[1:, 1] != w[:-1, 1])
            first = w[np.maximum.accumulate(np.where(start, np.arange(len(w)), 0)), 2]
            keep = waiting[w[:, 2] == first]
            now[keep] = False
            kept = rows[keep]
            for (track, g), lo, hi in _runs(kept[:, [C_TRACK, C_G]]):
                held.setdefault(g, {})[track] = self._stash(kept[lo:hi], extras)
            if len(held) > _MAX_HELD_GROUPS:  # parents that never come: write their oldest rows
                late = []
                while len(held) > _MAX_HELD_GROUPS:
                    g = next(iter(held))
                    self._pend_md.pop(g, None)
                    late.extend(self._readd(r, x, extras) for r, x in held.pop(g).values())
                rows = np.concatenate([rows, *late])
                now = np.concatenate([now, np.ones(len(rows) - len(now), bool)])
        sel = np.flatnonzero(now)
        if len(sel):
            track = rows[sel, C_TRACK]
            ts = rows[sel, C_TS]
            latest = np.full(int(track.max()) + 1, np.iinfo(np.int64).min)
            np.maximum.at(latest, track, ts)
            edge = ts == latest[track]
            tail = rows[sel[edge]]
            tail[:, C_G] = 0
            self._tail = self._stash(tail, extras)
            sel = sel[~edge]
        return rows, sel

    @staticmethod
    def _stash(r: np.ndarray, extras: list[bytes]) -> tuple[np.ndarray, list[bytes | None]]:
        """Rows kept for a later write, with their extras (the batch's extras list goes away)."""
        return r, [extras[i] if i >= 0 else None for i in r[:, C_EXTRA].tolist()]

    @staticmethod
    def _readd(r: np.ndarray, x: list[bytes | None], extras: list[bytes]) -> np.ndarray:
        """Stashed rows back into a batch whose extras list is ``extras``."""
        r = r.copy()
        for j, b in enumerate(x):
            if b is not None:
                r[j, C_EXTRA] = len(extras)
                extras.append(b)
        return r

    # -- encoding -------------------------------------------------------------------
    def _encode(self, rows: np.ndarray, extras: list[bytes], select: np.ndarray | None = None) -> bytes:
        """Packets for ``rows`` (or the rows at ``select``), in the order trace processor needs."""
        if select is None:
            select = np.arange(len(rows))
        if not len(select):
            return b""
        rows = rows[select[_order(rows, select)]]
        n = len(rows)
        ts = rows[:, C_TS]
        prev = np.empty(n, np.int64)
        head: list[bytes] = []
        tails = np.empty(n, np.int64)
        hdrs = np.empty((len(_STANDARD_ANNS), n), np.int64)
        for track, lo, hi in _runs(rows[:, [C_TRACK]]):
            seq = self._seqs[track[0]]
            if seq.last is None:
                head.append(self._sequence_header(seq, int(ts[lo])))
                seq.last = int(ts[lo])
            if seq.pending:
                head.append(_frame(P_SEQ + _uv(seq.id) + P_INTERNED + _uv(len(seq.pending)) + bytes(seq.pending)))
                seq.pending.clear()
            prev[lo] = seq.last
            prev[lo + 1:hi] = np.maximum(ts[lo:hi - 1], seq.last)  # rows are sorted by time per track
            seq.last = max(seq.last, int(ts[hi - 1]))
            tails[lo:hi] = seq.tail
            hdrs[:, lo:hi] = np.array([seq.anns[a] for a in _STANDARD_ANNS])[:, None]
        absolute = np.flatnonzero(ts < prev)
        tsv = ts - prev
        tsv[absolute] = ts[absolute] + self._mono
        typed = np.empty((n, 2), np.uint8)
        typed[:, 0] = TE_TYPE[0]
        typed[:, 1] = _TYPES[rows[:, C_K2]]

        lay = _Layout(n)
        lay.const(bytes((_PACKET,)))
        body_at = lay.length()
        lay.const(bytes((_P_TS,)))
        lay.varint(tsv)
        lay.const(_ABS_CLOCK, absolute)
        lay.pooled(tails, self._pool)
        te_at = lay.length()
        lay.fixed(typed)
        named = np.flatnonzero(rows[:, C_PRE] >= 0)
        lay.pooled(rows[named, C_PRE], self._pool, named)
        flowing = np.flatnonzero(rows[:, C_FLOW])
        if len(flowing):
            rec = np.empty((len(flowing), 10), np.uint8)  # tag, then the span id as fixed64
            rec[:, :2] = _FLOW_TAGS[rows[flowing, C_FLOW]]
            rec[:, 2:] = rows[flowing, C_SID].astype("<u8").reshape(-1, 1).view(np.uint8)
            lay.fixed(rec, flowing)
        for k, (col, has) in enumerate(((C_SID, C_SPANANN), (C_PARENT, C_PARENT), (C_RAWS, C_RAW), (C_RAWE, C_RAW))):
            sel = np.flatnonzero(rows[:, has])
            if len(sel):
                lay.annotation(hdrs[k, sel], rows[sel, col], self._pool, sel)
        extra = np.flatnonzero(rows[:, C_EXTRA] >= 0)
        if len(extra):
            lay.pooled(rows[extra, C_EXTRA], _Pool(extras), extra)
        te = lay.total(te_at + 1)
        lay.set_length(te_at, te)
        lay.set_length(body_at, lay.total(body_at + 1))
        self.packets_written += n + len(head)
        return b"".join(head) + lay.bytes()

    # -- tracks and templates ---------------------------------------------------------
    def _new_uuid(self) -> int:
        u = self._next_uuid
        self._next_uuid += 1
        return u

    def _descriptor(self, desc: Any) -> bytes:
        return _proto_packet(pb.TracePacket(trusted_packet_sequence_id=META_SEQ, track_descriptor=desc))

    def _open_sequence(self, track_id: int, head: list[bytes]) -> None:
        track = self._recorder.tracks.get(track_id)
        if track.kind == HOST_THREAD:
            pid = self._recorder.tracks.pid
            desc = pb.TrackDescriptor(uuid=track.id, thread=pb.ThreadDescriptor(
                pid=pid, tid=_native_tid(track.attrs.get("thread.id")) or track.id, thread_name=track.name))
        elif track.kind == DEVICE_QUEUE:
            parent = self._device_uuids.get(track.process)
            if parent is None:
                parent = self._device_uuids[track.process] = self._new_uuid()
                head.append(self._descriptor(pb.TrackDescriptor(
                    uuid=parent, name=track.process, child_ordering=pb.TrackDescriptor.EXPLICIT)))
            desc = pb.TrackDescriptor(uuid=track.id, parent_uuid=parent, name=track.name,
                                      sibling_order_rank=track.id)
        else:  # the compile track, or any other host-side track
            desc = pb.TrackDescriptor(uuid=track.id, parent_uuid=self._process_uuid, name=track.name)
        head.append(self._descriptor(desc))
        seq = self._seqs[track_id] = _Seq(track_id + 1, track.id, track_id)
        seq.tail = self._pool.add(P_SEQ + _uv(seq.id) + P_FLAGS + _uv(SEQ_NEEDS) + P_TE)
        for name in _STANDARD_ANNS:
            dn = seq.dname(name)
            seq.anns[name] = len(self._pool.items)
            for vlen in range(1, 11):
                self._pool.add(TE_DEBUG + _uv(len(dn) + len(DA_INT) + vlen) + dn + DA_INT)

    def _sequence_header(self, seq: _Seq, t0: int) -> bytes:
        snap = pb.ClockSnapshot(primary_trace_clock=MONOTONIC)
        snap.clocks.add(clock_id=HOST_CLOCK, timestamp=t0, is_incremental=True)
        snap.clocks.add(clock_id=MONOTONIC, timestamp=t0 + self._mono)
        return _proto_packet(pb.TracePacket(
            trusted_packet_sequence_id=seq.id, sequence_flags=SEQ_CLEARED, first_packet_on_sequence=True,
            trace_packet_defaults=pb.TracePacketDefaults(
                timestamp_clock_id=HOST_CLOCK, track_event_defaults=pb.TrackEventDefaults(track_uuid=seq.uuid)),
            clock_snapshot=snap))

    def _prefix(self, track: int, cat: str, name: str) -> int:
        seq = self._seqs[track]
        pid = self._prefixes[(track, cat, name)] = self._pool.add(
            TE_CAT + _uv(seq.intern(_CATS, cat)) + TE_NAME + _uv(seq.intern(_NAMES, name)))
        return pid

    def _prefix_counter(self, seq: _Seq) -> int:
        if seq.counter_prefix < 0:
            seq.counter_prefix = self._pool.add(TE_UUID + _uv(seq.counter))
        return seq.counter_prefix

    def _extra(self, s: Span, track: int) -> bytes:
        """Annotations for status, error and attributes (cached when the values are hashable)."""
        seq = self._seqs[track]
        a = s.attrs
        try:
            key = (s.status, s.error, tuple(a.items()) if a else ())
            hit = seq.extras.get(key)
        except TypeError:
            key, hit = None, None
        if hit is not None:
            return hit
        parts = []
        if s.status != STATUS_OK:
            parts.append(seq.annotation(A_STATUS, _value(s.status)))
            parts.append(seq.annotation(A_ERROR, _value(s.error or "")))
        for k, v in (a or {}).items():
            if v is not None:
                parts.append(seq.annotation(str(k), _value(v)))
        out = b"".join(parts)
        if key is not None and len(seq.extras) < 4096:
            seq.extras[key] = out
        return out

    def _counter_track(self, track_id: int, head: list[bytes]) -> int:
        track = self._recorder.tracks.get(track_id)
        uuid = self._new_uuid()
        parent = (self._device_uuids.get(track.process, self._process_uuid) if track.kind == DEVICE_QUEUE
                  else self._process_uuid)
        head.append(self._descriptor(pb.TrackDescriptor(
            uuid=uuid, parent_uuid=parent, name=f"{track.name} · bytes transferred",
            counter=pb.CounterDescriptor(unit=pb.CounterDescriptor.UNIT_SIZE_BYTES))))
        return uuid

    # -- metadata -------------------------------------------------------------------
    def _now(self) -> int:
        return time.perf_counter_ns() + self._mono

    def _dropped(self, n: int) -> bytes:
        if n == self._dropped_written:
            return b""
        self._dropped_written = n
        return _proto_packet(pb.TracePacket(
            timestamp=self._now(), trusted_packet_sequence_id=META_SEQ,
            track_event=pb.TrackEvent(type=COUNTER, track_uuid=self._dropped_uuid, counter_value=n)))

    def _metadata_packet(self, meta: dict[str, Any]) -> bytes:
        text = json.dumps(meta, default=str, ensure_ascii=False)
        return _proto_packet(pb.TracePacket(
            timestamp=self._now(), trusted_packet_sequence_id=META_SEQ,
            track_event=pb.TrackEvent(
                type=INSTANT, track_uuid=self._process_uuid, name=METADATA_EVENT, categories=["cltrace"],
                debug_annotations=[pb.DebugAnnotation(name="json", string_value=text)])))

    def _emit(self, data: bytes) -> None:
        if data:
            self._fh.write(data)  # type: ignore[union-attr]
            self.bytes_written += len(data)


def _order(rows: np.ndarray, select: np.ndarray) -> np.ndarray:
    """Order of the rows at ``select`` for writing: by track and time, rows tied on both by the nesting
    keys (see the module docstring). Only the key columns are gathered."""
    ts = rows[select, C_TS]
    _, rank = np.unique(rows[select, C_TRACK], return_inverse=True)
    rank = rank.astype(np.int64)
    rel = ts - ts.min()
    if int(rel.max()) < (1 << 40) and int(rank.max()) < (1 << 22):
        key = (rank << 40) | rel
        order = np.argsort(key, kind="stable")
        key = key[order]
        tied = key[1:] == key[:-1]
    else:  # a held row from long ago: sort on two keys
        order = np.lexsort((ts, rank))
        tied = (ts[order][1:] == ts[order][:-1]) & (rank[order][1:] == rank[order][:-1])
    if tied.any():
        in_tie = np.zeros(len(order), bool)
        in_tie[1:] |= tied
        in_tie[:-1] |= tied
        pos = np.flatnonzero(in_tie)
        run = np.cumsum(np.concatenate(([True], ~tied)))[pos]
        r = select[order[pos]]
        order[pos] = order[pos][np.lexsort((rows[r, C_K3], rows[r, C_K2], rows[r, C_K1], run))]
    return order


def _differs(values: list[Any]) -> np.ndarray:
    """values[i + 1] != values[i], for each i (all True where values do not compare, e.g. arrays)."""
    try:
        return np.array(list(map(ne, values[1:], values[:-1])), bool)
    except (TypeError, ValueError):
        return np.ones(len(values) - 1, bool)


def _runs(keys: np.ndarray) -> list[tuple[tuple[int, ...], int, int]]:
    """(key, lo, hi) of each run of equal rows in a sorted 2-D key array."""
    n = len(keys)
    if not n:
        return []
    cut = np.nonzero((keys[1:] != keys[:-1]).any(axis=1))[0] + 1
    bounds = [0, *cut.tolist(), n]
    return [(tuple(keys[lo].tolist()), lo, hi) for lo, hi in zip(bounds[:-1], bounds[1:])]


def _native_tid(ident: Any) -> int | None:
    for t in threading.enumerate():
        if t.ident == ident:
            return t.native_id
    return None


session.register_format("pftrace", ".pftrace", PerfettoTraceSink)
