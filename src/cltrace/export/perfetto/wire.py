"""Protobuf wire format of the packets cltrace writes: field tags (numbers taken from the ``perfetto``
package's descriptors), the enum values and names the writer and reader share, and the encoding of
single values."""
from __future__ import annotations

from typing import Any

import numpy as np
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

from ..protowire import varint

VARINT, FIXED64, LEN = 0, 1, 2
uv = varint  # unsigned, or a negative int64 as two's complement


def _tag(msg: Any, name: str, wire: int) -> bytes:
    return uv((msg.DESCRIPTOR.fields_by_name[name].number << 3) | wire)


def _byte(tag: bytes) -> int:
    assert len(tag) == 1, "field number too large for a one-byte tag"
    return tag[0]


PACKET = _byte(_tag(pb.Trace, "packet", LEN))
P_TS = _byte(_tag(pb.TracePacket, "timestamp", VARINT))
P_CLOCK = _tag(pb.TracePacket, "timestamp_clock_id", VARINT)
P_SEQ = _tag(pb.TracePacket, "trusted_packet_sequence_id", VARINT)
P_FLAGS = _tag(pb.TracePacket, "sequence_flags", VARINT)
P_TE = _tag(pb.TracePacket, "track_event", LEN)
P_INTERNED = _tag(pb.TracePacket, "interned_data", LEN)
TE_TYPE = _tag(pb.TrackEvent, "type", VARINT)
TE_CAT = _tag(pb.TrackEvent, "category_iids", VARINT)
TE_NAME = _tag(pb.TrackEvent, "name_iid", VARINT)
TE_UUID = _tag(pb.TrackEvent, "track_uuid", VARINT)
TE_COUNTER = _tag(pb.TrackEvent, "counter_value", VARINT)
# Flow ids as varints (the span id, a few bytes) rather than fixed64 ``flow_ids``: trace processor reads both.
TE_FLOW = _tag(pb.TrackEvent, "flow_ids_old", VARINT)
TE_TFLOW = _tag(pb.TrackEvent, "terminating_flow_ids_old", VARINT)
TE_DEBUG = _tag(pb.TrackEvent, "debug_annotations", LEN)
DA_NAME_IID = _tag(pb.DebugAnnotation, "name_iid", VARINT)
DA_NAME = _tag(pb.DebugAnnotation, "name", LEN)
DA_BOOL = _tag(pb.DebugAnnotation, "bool_value", VARINT)
DA_INT = _tag(pb.DebugAnnotation, "int_value", VARINT)
DA_DOUBLE = _tag(pb.DebugAnnotation, "double_value", FIXED64)
DA_STRING = _tag(pb.DebugAnnotation, "string_value", LEN)
DA_STRING_IID = _tag(pb.DebugAnnotation, "string_value_iid", VARINT)
DA_DICT = _tag(pb.DebugAnnotation, "dict_entries", LEN)
DA_ARRAY = _tag(pb.DebugAnnotation, "array_values", LEN)
TE_SITE = _tag(pb.TrackEvent, "source_location_iid", VARINT)
I_SITES = _tag(pb.InternedData, "source_locations", LEN)
SL_IID, SL_FILE, SL_FUNCTION, SL_LINE = (_tag(pb.SourceLocation, f, w) for f, w in (
    ("iid", VARINT), ("file_name", LEN), ("function_name", LEN), ("line_number", VARINT)))
TABLES = tuple(  # interned tables: (InternedData field tag, iid tag, name tag)
    (_tag(pb.InternedData, table, LEN), _tag(entry, "iid", VARINT), _tag(entry, text, LEN))
    for table, entry, text in (("event_categories", pb.EventCategory, "name"), ("event_names", pb.EventName, "name"),
                               ("debug_annotation_names", pb.DebugAnnotationName, "name"),
                               ("debug_annotation_string_values", pb.InternedString, "str")))
CATS, NAMES, DNAMES, SVALUES = 0, 1, 2, 3

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

# Byte strings every packet row is built from, put first in the template pool (see ``packets``):
# the Trace.packet tag, the timestamp tag, an absolute MONOTONIC clock, the TrackEvent type of a row
# by its K2 column (BEGIN, END, COUNTER), and the flow tags by its FLOW column (out, in).
ROW_CONSTANTS = (bytes((PACKET,)), bytes((P_TS,)), P_CLOCK + uv(MONOTONIC), TE_TYPE + uv(BEGIN), TE_TYPE + uv(END),
                 TE_TYPE + uv(COUNTER), TE_FLOW, TE_TFLOW)


def frame(body: bytes) -> bytes:
    """``body`` as one ``Trace.packet`` field."""
    return bytes((PACKET,)) + uv(len(body)) + body


def proto_packet(p: Any) -> bytes:
    return frame(p.SerializeToString())


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
