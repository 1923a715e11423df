"""The packets a trace holds besides span rows: sequence openings (defaults and a clock snapshot),
track descriptors, counter values and the metadata instant.

Each is built by hand, fields in field-number order: the bytes ``SerializeToString`` gives for the same
message (tests compare them over a range of values), without importing protobuf, which costs a
``start()`` more than 100 ms and thousands of objects for the cyclic GC. A field given as None is left
out, as the ``perfetto`` package's constructors leave it.
"""
from __future__ import annotations

from typing import Sequence

from ..protowire import LEN, VARINT, nested, tag, text
from .wire import (COUNTER, DA_NAME, DA_STRING, INSTANT, META_SEQ, P_FLAGS, P_SEQ, P_TE, P_TS, SEQ_CLEARED,
                   TE_COUNTER, TE_DEBUG, TE_TYPE, TE_UUID, frame, uv)

P_CLOCK_SNAPSHOT = tag(6, LEN)  # TracePacket.clock_snapshot
P_DEFAULTS = tag(59, LEN)  # TracePacket.trace_packet_defaults
P_DESCRIPTOR = tag(60, LEN)  # TracePacket.track_descriptor
P_FIRST = tag(87, VARINT)  # TracePacket.first_packet_on_sequence
CS_CLOCK = tag(1, LEN)  # ClockSnapshot.clocks
CS_PRIMARY = tag(2, VARINT)  # ClockSnapshot.primary_trace_clock
CL_ID = tag(1, VARINT)  # ClockSnapshot.Clock.clock_id
CL_TS = tag(2, VARINT)  # ClockSnapshot.Clock.timestamp
CL_INCREMENTAL = tag(3, VARINT)  # ClockSnapshot.Clock.is_incremental
DF_EVENT = tag(11, LEN)  # TracePacketDefaults.track_event_defaults
DF_CLOCK = tag(58, VARINT)  # TracePacketDefaults.timestamp_clock_id
TED_UUID = tag(11, VARINT)  # TrackEventDefaults.track_uuid
TD_UUID = tag(1, VARINT)  # TrackDescriptor.uuid
TD_NAME = tag(2, LEN)  # TrackDescriptor.name
TD_PROCESS = tag(3, LEN)  # TrackDescriptor.process
TD_THREAD = tag(4, LEN)  # TrackDescriptor.thread
TD_PARENT = tag(5, VARINT)  # TrackDescriptor.parent_uuid
TD_COUNTER = tag(8, LEN)  # TrackDescriptor.counter
TD_ORDERING = tag(11, VARINT)  # TrackDescriptor.child_ordering
TD_RANK = tag(12, VARINT)  # TrackDescriptor.sibling_order_rank
PD_PID = tag(1, VARINT)  # ProcessDescriptor.pid
PD_NAME = tag(6, LEN)  # ProcessDescriptor.process_name
TH_PID = tag(1, VARINT)  # ThreadDescriptor.pid
TH_TID = tag(2, VARINT)  # ThreadDescriptor.tid
TH_NAME = tag(5, LEN)  # ThreadDescriptor.thread_name
CD_UNIT = tag(3, VARINT)  # CounterDescriptor.unit
TE_CATEGORIES = tag(22, LEN)  # TrackEvent.categories
TE_NAME_TEXT = tag(23, LEN)  # TrackEvent.name

UNIT_COUNT, UNIT_SIZE_BYTES = 2, 3  # CounterDescriptor.Unit
EXPLICIT = 3  # TrackDescriptor.ChildTracksOrdering

Clock = tuple[int, int, bool]  # (clock id, timestamp, incremental)


def sequence_start(seq_id: int, clocks: Sequence[Clock], primary: int, clock_id: int,
                   track_uuid: int | None = None, first: bool = False) -> bytes:
    """The packet that opens (clears) a sequence: a ClockSnapshot of ``clocks``, the sequence's
    default clock and track, and with ``first`` the first_packet_on_sequence flag."""
    snapshot = b"".join(nested(CS_CLOCK, CL_ID + uv(cid) + CL_TS + uv(ts) + (CL_INCREMENTAL + b"\x01" if inc else b""))
                        for cid, ts, inc in clocks) + CS_PRIMARY + uv(primary)
    defaults = (b"" if track_uuid is None else nested(DF_EVENT, TED_UUID + uv(track_uuid))) + DF_CLOCK + uv(clock_id)
    body = (nested(P_CLOCK_SNAPSHOT, snapshot) + P_SEQ + uv(seq_id) + P_FLAGS + uv(SEQ_CLEARED)
            + nested(P_DEFAULTS, defaults))
    return frame(body + P_FIRST + b"\x01" if first else body)


def process(pid: int, name: str | None) -> bytes:
    """A ProcessDescriptor, for ``descriptor``."""
    return PD_PID + uv(pid) + (b"" if name is None else text(PD_NAME, name))


def thread(pid: int, tid: int, name: str | None) -> bytes:
    """A ThreadDescriptor, for ``descriptor``."""
    return TH_PID + uv(pid) + TH_TID + uv(tid) + (b"" if name is None else text(TH_NAME, name))


def descriptor(uuid: int, *, name: str | None = None, process: bytes | None = None, thread: bytes | None = None,
               parent: int | None = None, unit: int | None = None, ordering: int | None = None,
               rank: int | None = None) -> bytes:
    """A TrackDescriptor packet on ``META_SEQ``: a process or thread track (``process``/``thread``
    descriptors), a named child of ``parent``, or a counter track (with ``unit``)."""
    body = TD_UUID + uv(uuid)
    if name is not None:
        body += text(TD_NAME, name)
    if process is not None:
        body += nested(TD_PROCESS, process)
    if thread is not None:
        body += nested(TD_THREAD, thread)
    if parent is not None:
        body += TD_PARENT + uv(parent)
    if unit is not None:
        body += nested(TD_COUNTER, CD_UNIT + uv(unit))
    if ordering is not None:
        body += TD_ORDERING + uv(ordering)
    if rank is not None:
        body += TD_RANK + uv(rank)
    return frame(P_SEQ + uv(META_SEQ) + nested(P_DESCRIPTOR, body))


def counter(ts: int, uuid: int, value: int) -> bytes:
    """A counter's value at ``ts`` (absolute, on ``META_SEQ``'s MONOTONIC clock)."""
    event = TE_TYPE + uv(COUNTER) + TE_UUID + uv(uuid) + TE_COUNTER + uv(value)
    return frame(bytes((P_TS,)) + uv(ts) + P_SEQ + uv(META_SEQ) + nested(P_TE, event))


def instant(ts: int, uuid: int, name: str, category: str, annotations: Sequence[tuple[str, str]]) -> bytes:
    """An instant event on ``META_SEQ`` with string-valued debug annotations (names inline, not interned)."""
    event = b"".join(nested(TE_DEBUG, text(DA_STRING, v) + text(DA_NAME, k)) for k, v in annotations)
    event += TE_TYPE + uv(INSTANT) + TE_UUID + uv(uuid) + text(TE_CATEGORIES, category) + text(TE_NAME_TEXT, name)
    return frame(bytes((P_TS,)) + uv(ts) + P_SEQ + uv(META_SEQ) + nested(P_TE, event))
