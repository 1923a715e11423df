"""Protobuf wire format of the packets cltrace writes: field tags (``perfetto/trace/**.proto``; the
tests check each against the ``perfetto`` package's descriptors), the enum values and names the writer
and reader share, and the encoding of single values. Written out here so the writer imports no protobuf."""
from __future__ import annotations

from typing import Any

import numpy as np

from ..protowire import FIXED64, LEN, VARINT, tag, varint

uv = varint  # unsigned, or a negative int64 as two's complement


def _byte(key: bytes) -> int:
    assert len(key) == 1, "field number too large for a one-byte tag"
    return key[0]


PACKET = _byte(tag(1, LEN))  # Trace.packet
P_TS = _byte(tag(8, VARINT))  # TracePacket.timestamp
P_CLOCK = tag(58, VARINT)  # TracePacket.timestamp_clock_id
P_SEQ = tag(10, VARINT)  # TracePacket.trusted_packet_sequence_id
P_FLAGS = tag(13, VARINT)  # TracePacket.sequence_flags
P_TE = tag(11, LEN)  # TracePacket.track_event
P_INTERNED = tag(12, LEN)  # TracePacket.interned_data
P_COMPRESSED = tag(50, LEN)  # TracePacket.compressed_packets: a zlib stream of Trace.packet entries
TE_TYPE = tag(9, VARINT)  # TrackEvent.type
TE_CAT = tag(3, VARINT)  # TrackEvent.category_iids
TE_NAME = tag(10, VARINT)  # TrackEvent.name_iid
TE_UUID = tag(11, VARINT)  # TrackEvent.track_uuid
TE_COUNTER = tag(30, VARINT)  # TrackEvent.counter_value
# Flow ids as varints (the span id, a few bytes) rather than fixed64 ``flow_ids``: trace processor reads both.
TE_FLOW = tag(36, VARINT)  # TrackEvent.flow_ids_old
TE_TFLOW = tag(42, VARINT)  # TrackEvent.terminating_flow_ids_old
TE_DEBUG = tag(4, LEN)  # TrackEvent.debug_annotations
DA_NAME_IID = tag(1, VARINT)  # DebugAnnotation.name_iid
DA_NAME = tag(10, LEN)  # DebugAnnotation.name
DA_BOOL = tag(2, VARINT)  # DebugAnnotation.bool_value
DA_INT = tag(4, VARINT)  # DebugAnnotation.int_value
DA_DOUBLE = tag(5, FIXED64)  # DebugAnnotation.double_value
DA_STRING = tag(6, LEN)  # DebugAnnotation.string_value
DA_STRING_IID = tag(17, VARINT)  # DebugAnnotation.string_value_iid
DA_DICT = tag(11, LEN)  # DebugAnnotation.dict_entries
DA_ARRAY = tag(12, LEN)  # DebugAnnotation.array_values
TE_SITE = tag(34, VARINT)  # TrackEvent.source_location_iid
I_SITES = tag(4, LEN)  # InternedData.source_locations
SL_IID, SL_FILE, SL_FUNCTION, SL_LINE = (  # SourceLocation: iid, file_name, function_name, line_number
    tag(1, VARINT), tag(2, LEN), tag(3, LEN), tag(4, VARINT))
# Interned tables: (InternedData field tag, iid tag, name tag) of event_categories (EventCategory),
# event_names (EventName), debug_annotation_names (DebugAnnotationName) and
# debug_annotation_string_values (InternedString: iid, str).
TABLES = tuple((tag(table, LEN), tag(1, VARINT), tag(2, LEN)) for table in (1, 2, 3, 29))
CATS, NAMES, DNAMES, SVALUES = 0, 1, 2, 3

BEGIN, END, INSTANT, COUNTER = 1, 2, 3, 4  # TrackEvent.Type: TYPE_SLICE_BEGIN, _END, TYPE_INSTANT, TYPE_COUNTER
SEQ_CLEARED = 1  # TracePacket.SEQ_INCREMENTAL_STATE_CLEARED
SEQ_NEEDS = 2  # TracePacket.SEQ_NEEDS_INCREMENTAL_STATE
MONOTONIC = 3  # BuiltinClock.BUILTIN_CLOCK_MONOTONIC
BOOTTIME = 6  # BuiltinClock.BUILTIN_CLOCK_BOOTTIME
HOST_CLOCK = 64  # sequence-scoped, incremental; its values are perf_counter_ns
META_SEQ = 1  # descriptors, dropped-span counter and metadata; absolute MONOTONIC timestamps
SYNTHETIC_UUID = 1 << 32  # uuids of tracks the TrackRegistry does not number
METADATA_EVENT = "cltrace.metadata"
DROPPED_TRACK = "cltrace: dropped spans"

# Debug annotation names the reader takes as span fields rather than attributes.
A_SPAN, A_PARENT, A_STATUS, A_ERROR = "span", "parent", "status", "error"
A_DEV_START, A_DEV_END = "device.start", "device.end"

# Byte strings every packet row is built from, put first in the template pool (see ``packets``):
# the Trace.packet tag, the timestamp tag, an absolute MONOTONIC clock, the TrackEvent type of a row
# by its K2 column (BEGIN, END, COUNTER), and the flow tags by its FLOW column (out, in).
ROW_CONSTANTS = (bytes((PACKET,)), bytes((P_TS,)), P_CLOCK + uv(MONOTONIC), TE_TYPE + uv(BEGIN), TE_TYPE + uv(END),
                 TE_TYPE + uv(COUNTER), TE_FLOW, TE_TFLOW)


def frame(body: bytes) -> bytes:
    """``body`` as one ``Trace.packet`` field."""
    return bytes((PACKET,)) + uv(len(body)) + body


def value(v: Any) -> bytes:
    """The value fields of a DebugAnnotation for a Python attribute value."""
    if isinstance(v, (np.generic, np.ndarray)):
        v = v.tolist()
    if isinstance(v, bool):
        return DA_BOOL + (b"\x01" if v else b"\x00")
    if isinstance(v, int) and -(1 << 63) <= v < (1 << 63):
        return DA_INT + uv(v)
    if isinstance(v, float):
        return DA_DOUBLE + np.float64(v).tobytes()
    if isinstance(v, (list, tuple)) and v:
        out = bytearray()
        for x in v:
            inner = value(x)
            out += DA_ARRAY + uv(len(inner)) + inner
        return bytes(out)
    if isinstance(v, dict) and v:
        out = bytearray()
        for k, x in v.items():
            key = str(k).encode("utf-8", "replace")
            inner = DA_NAME + uv(len(key)) + key + value(x)
            out += DA_DICT + uv(len(inner)) + inner
        return bytes(out)
    raw = str(v).encode("utf-8", "replace")
    return DA_STRING + uv(len(raw)) + raw
