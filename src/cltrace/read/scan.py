"""Which scanner reads cltrace's own trace files into columns: the C extension ``_scan``, or none.

``_scan`` walks a file once, without a Python object per event, and hands back int64 columns
(``chrome``: X event lines, ``pftrace``: slice packets with their sequence's state applied, and counter
samples) that
``chrome_columns`` and ``perfetto_columns`` turn into a ``SpanBatch``. Where it is not built, or
``CLTRACE_NATIVE=0``, ``NATIVE`` is None and the general readers (``chrome``, ``perfetto``) read every
file, into ``Span`` objects. ``PATH`` says which runs ("native" or "python").
"""
from __future__ import annotations

from typing import Any

from .._native import choose, extension


# Column names of the scanner's outputs, in its order (_scan.c: X_*, P_* and C_*).
X_COLS = ("line", "sid", "parent", "name", "cat", "tid", "ts", "dur", "device", "queued", "submit", "raw_start",
          "raw_end", "extra")
P_COLS = ("index", "type", "uuid", "ts", "seq", "gen", "name", "cat", "sid_kind", "sid", "parent", "has_parent",
          "dev", "raw_start", "has_raw_end", "raw_end", "extra", "site")
C_COLS = ("index", "uuid", "ts", "value")


def _expected_fields() -> dict[str, tuple[int, ...]]:
    """The field numbers ``_scan.c`` must read, from the perfetto package's descriptors."""
    from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

    def nums(msg: Any, *names: str) -> tuple[int, ...]:
        return tuple(msg.DESCRIPTOR.fields_by_name[n].number for n in names)

    return {
        "TracePacket": nums(pb.TracePacket, "timestamp", "timestamp_clock_id", "trusted_packet_sequence_id",
                            "sequence_flags", "incremental_state_cleared", "interned_data", "clock_snapshot",
                            "trace_packet_defaults", "track_event", "track_descriptor",
                            "first_packet_on_sequence"),
        "TrackEvent": nums(pb.TrackEvent, "type", "track_uuid", "category_iids", "categories", "name_iid", "name",
                           "debug_annotations", "flow_ids_old", "terminating_flow_ids_old", "flow_ids",
                           "terminating_flow_ids", "counter_value", "double_counter_value", "source_location",
                           "source_location_iid"),
        "DebugAnnotation": nums(pb.DebugAnnotation, "name_iid", "name", "int_value"),
        "InternedData": nums(pb.InternedData, "event_categories", "event_names", "debug_annotation_names",
                             "source_locations", "debug_annotation_string_values"),
        "ClockSnapshot": nums(pb.ClockSnapshot, "clocks") + nums(pb.ClockSnapshot.Clock, "clock_id", "timestamp",
                                                                   "is_incremental"),
        "TracePacketDefaults": nums(pb.TracePacketDefaults, "timestamp_clock_id", "track_event_defaults"),
        "TrackEventDefaults": nums(pb.TrackEventDefaults, "track_uuid"),
        "SourceLocation": nums(pb.SourceLocation, "iid"),
    }


def _load_native() -> Any:
    _scan = extension("scan")
    built = {k: tuple(v) if isinstance(v, tuple) else (v,) for k, v in _scan.field_numbers().items()}
    if built != _expected_fields():
        raise ImportError("C extension built for other protobuf field numbers: reinstall cltrace")
    return _scan


_CHOICE = choose("the trace file scanner", _load_native)
NATIVE: Any = _CHOICE.native
WHY: str = _CHOICE.why
PATH: str = _CHOICE.path
DETAIL: str = _CHOICE.detail

__all__ = ["NATIVE", "PATH", "DETAIL", "WHY", "X_COLS", "P_COLS", "C_COLS"]
