"""The .pftrace writer without protobuf: its hand-built packets against the ``perfetto`` package's.

Every packet kind ``export.perfetto.messages`` builds equals ``SerializeToString()`` of the same message
(field order included) over generated values; every tag in ``wire`` and ``messages`` equals the one the
real descriptors give; whole files of a real traced run (and of a merge) are unchanged when each of
those packets is replaced by protobuf's encoding of it; and tracing to a .pftrace never imports protobuf.
"""
from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pyopencl as cl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

import cltrace
from cltrace.export.perfetto import messages, wire
from cltrace.export.protowire import FIXED64, LEN, VARINT
from cltrace.merge.merge import merge
from cltrace.read.inflate import expand
from cltrace.read.perfetto import iter_packets, load_pftrace

U64 = st.integers(0, 2**64 - 1)
I64 = st.integers(-2**63, 2**63 - 1)
I32 = st.integers(-2**31, 2**31 - 1)
TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40)  # protobuf refuses lone surrogates
NAME = st.none() | TEXT
EXAMPLES = settings(max_examples=150, deadline=None)


def _tag(msg: Any, name: str, wire_type: int) -> bytes:
    """A field's tag from the real descriptors (how ``wire`` computed its tags before it wrote them out)."""
    n = (msg.DESCRIPTOR.fields_by_name[name].number << 3) | wire_type
    out = bytearray()
    while n > 127:
        out.append((n & 127) | 128)
        n >>= 7
    return bytes(out + bytes((n,)))


TE, TP, DA = pb.TrackEvent, pb.TracePacket, pb.DebugAnnotation
WIRE_TAGS = {
    "P_CLOCK": (TP, "timestamp_clock_id", VARINT), "P_SEQ": (TP, "trusted_packet_sequence_id", VARINT),
    "P_FLAGS": (TP, "sequence_flags", VARINT), "P_TE": (TP, "track_event", LEN),
    "P_INTERNED": (TP, "interned_data", LEN),
    "P_COMPRESSED": (TP, "compressed_packets", LEN),
    "TE_TYPE": (TE, "type", VARINT), "TE_CAT": (TE, "category_iids", VARINT), "TE_NAME": (TE, "name_iid", VARINT),
    "TE_UUID": (TE, "track_uuid", VARINT), "TE_COUNTER": (TE, "counter_value", VARINT),
    "TE_FLOW": (TE, "flow_ids_old", VARINT), "TE_TFLOW": (TE, "terminating_flow_ids_old", VARINT),
    "TE_DEBUG": (TE, "debug_annotations", LEN), "TE_SITE": (TE, "source_location_iid", VARINT),
    "DA_NAME_IID": (DA, "name_iid", VARINT), "DA_NAME": (DA, "name", LEN), "DA_BOOL": (DA, "bool_value", VARINT),
    "DA_INT": (DA, "int_value", VARINT), "DA_DOUBLE": (DA, "double_value", FIXED64),
    "DA_STRING": (DA, "string_value", LEN), "DA_STRING_IID": (DA, "string_value_iid", VARINT),
    "DA_DICT": (DA, "dict_entries", LEN), "DA_ARRAY": (DA, "array_values", LEN),
    "I_SITES": (pb.InternedData, "source_locations", LEN), "SL_IID": (pb.SourceLocation, "iid", VARINT),
    "SL_FILE": (pb.SourceLocation, "file_name", LEN), "SL_FUNCTION": (pb.SourceLocation, "function_name", LEN),
    "SL_LINE": (pb.SourceLocation, "line_number", VARINT),
}
TD, CS = pb.TrackDescriptor, pb.ClockSnapshot
MESSAGE_TAGS = {
    "P_CLOCK_SNAPSHOT": (TP, "clock_snapshot", LEN), "P_DEFAULTS": (TP, "trace_packet_defaults", LEN),
    "P_DESCRIPTOR": (TP, "track_descriptor", LEN), "P_FIRST": (TP, "first_packet_on_sequence", VARINT),
    "CS_CLOCK": (CS, "clocks", LEN), "CS_PRIMARY": (CS, "primary_trace_clock", VARINT),
    "CL_ID": (CS.Clock, "clock_id", VARINT), "CL_TS": (CS.Clock, "timestamp", VARINT),
    "CL_INCREMENTAL": (CS.Clock, "is_incremental", VARINT),
    "DF_EVENT": (pb.TracePacketDefaults, "track_event_defaults", LEN),
    "DF_CLOCK": (pb.TracePacketDefaults, "timestamp_clock_id", VARINT),
    "TED_UUID": (pb.TrackEventDefaults, "track_uuid", VARINT),
    "TD_UUID": (TD, "uuid", VARINT), "TD_NAME": (TD, "name", LEN), "TD_PROCESS": (TD, "process", LEN),
    "TD_THREAD": (TD, "thread", LEN), "TD_PARENT": (TD, "parent_uuid", VARINT), "TD_COUNTER": (TD, "counter", LEN),
    "TD_ORDERING": (TD, "child_ordering", VARINT), "TD_RANK": (TD, "sibling_order_rank", VARINT),
    "PD_PID": (pb.ProcessDescriptor, "pid", VARINT), "PD_NAME": (pb.ProcessDescriptor, "process_name", LEN),
    "TH_PID": (pb.ThreadDescriptor, "pid", VARINT), "TH_TID": (pb.ThreadDescriptor, "tid", VARINT),
    "TH_NAME": (pb.ThreadDescriptor, "thread_name", LEN), "CD_UNIT": (pb.CounterDescriptor, "unit", VARINT),
    "TE_CATEGORIES": (TE, "categories", LEN), "TE_NAME_TEXT": (TE, "name", LEN),
}


@pytest.mark.parametrize("module, tags", [(wire, WIRE_TAGS), (messages, MESSAGE_TAGS)], ids=["wire", "messages"])
def test_tags_equal_the_descriptors(module: Any, tags: dict[str, tuple[Any, str, int]]) -> None:
    for name, (msg, field, wire_type) in tags.items():
        assert getattr(module, name) == _tag(msg, field, wire_type), name
    own = {n for n, v in vars(module).items() if isinstance(v, bytes) and n.isupper()
           and (module is wire or n not in vars(wire))}  # messages' own, not those it imports from wire
    assert own == set(tags), "every tag constant is checked here"


def test_one_byte_tags_tables_and_enums_equal_the_descriptors() -> None:
    assert bytes((wire.PACKET,)) == _tag(pb.Trace, "packet", LEN)
    assert bytes((wire.P_TS,)) == _tag(TP, "timestamp", VARINT)
    assert wire.TABLES == tuple(
        (_tag(pb.InternedData, table, LEN), _tag(entry, "iid", VARINT), _tag(entry, text, LEN))
        for table, entry, text in (("event_categories", pb.EventCategory, "name"),
                                   ("event_names", pb.EventName, "name"),
                                   ("debug_annotation_names", pb.DebugAnnotationName, "name"),
                                   ("debug_annotation_string_values", pb.InternedString, "str")))
    assert (wire.BEGIN, wire.END, wire.INSTANT, wire.COUNTER) == (
        TE.TYPE_SLICE_BEGIN, TE.TYPE_SLICE_END, TE.TYPE_INSTANT, TE.TYPE_COUNTER)
    assert (wire.SEQ_CLEARED, wire.SEQ_NEEDS) == (TP.SEQ_INCREMENTAL_STATE_CLEARED, TP.SEQ_NEEDS_INCREMENTAL_STATE)
    assert (wire.MONOTONIC, wire.BOOTTIME) == (pb.BUILTIN_CLOCK_MONOTONIC, pb.BUILTIN_CLOCK_BOOTTIME)
    assert (messages.UNIT_COUNT, messages.UNIT_SIZE_BYTES) == (
        pb.CounterDescriptor.UNIT_COUNT, pb.CounterDescriptor.UNIT_SIZE_BYTES)
    assert messages.EXPLICIT == TD.EXPLICIT


# ---- each packet kind against protobuf, over generated values --------------------------------
def packet(p: Any) -> bytes:
    return wire.frame(p.SerializeToString())


@EXAMPLES
@given(mono=U64, boot=st.none() | U64)
def test_trace_start(mono: int, boot: int | None) -> None:
    clocks = [(wire.MONOTONIC, mono, False)] + ([] if boot is None else [(wire.BOOTTIME, boot, False)])
    snap = pb.ClockSnapshot(primary_trace_clock=wire.MONOTONIC)
    for cid, ts, _ in clocks:
        snap.clocks.add(clock_id=cid, timestamp=ts)
    want = packet(pb.TracePacket(trusted_packet_sequence_id=wire.META_SEQ, sequence_flags=wire.SEQ_CLEARED,
                                 trace_packet_defaults=pb.TracePacketDefaults(timestamp_clock_id=wire.MONOTONIC),
                                 clock_snapshot=snap))
    assert messages.sequence_start(wire.META_SEQ, clocks, wire.MONOTONIC, wire.MONOTONIC) == want


@EXAMPLES
@given(seq=st.integers(1, 2**32 - 1), uuid=U64, t0=st.integers(0, 2**62), mono=st.integers(0, 2**62))
def test_sequence_header(seq: int, uuid: int, t0: int, mono: int) -> None:
    snap = pb.ClockSnapshot(primary_trace_clock=wire.MONOTONIC)
    snap.clocks.add(clock_id=wire.HOST_CLOCK, timestamp=t0, is_incremental=True)
    snap.clocks.add(clock_id=wire.MONOTONIC, timestamp=t0 + mono)
    want = packet(pb.TracePacket(
        trusted_packet_sequence_id=seq, sequence_flags=wire.SEQ_CLEARED, first_packet_on_sequence=True,
        trace_packet_defaults=pb.TracePacketDefaults(
            timestamp_clock_id=wire.HOST_CLOCK, track_event_defaults=pb.TrackEventDefaults(track_uuid=uuid)),
        clock_snapshot=snap))
    got = messages.sequence_start(seq, [(wire.HOST_CLOCK, t0, True), (wire.MONOTONIC, t0 + mono, False)],
                                  wire.MONOTONIC, wire.HOST_CLOCK, uuid, first=True)
    assert got == want


def descriptor_packet(desc: Any) -> bytes:
    return packet(pb.TracePacket(trusted_packet_sequence_id=wire.META_SEQ, track_descriptor=desc))


@EXAMPLES
@given(uuid=U64, pid=I32, name=NAME, ordered=st.booleans())
def test_process_descriptor(uuid: int, pid: int, name: str | None, ordered: bool) -> None:
    extra = {"child_ordering": TD.EXPLICIT} if ordered else {}
    want = descriptor_packet(pb.TrackDescriptor(uuid=uuid, process=pb.ProcessDescriptor(pid=pid, process_name=name),
                                                **extra))
    got = messages.descriptor(uuid, process=messages.process(pid, name),
                              ordering=messages.EXPLICIT if ordered else None)
    assert got == want


@EXAMPLES
@given(uuid=U64, pid=I32, tid=I64, name=NAME, rank=st.none() | I32)
def test_thread_descriptor(uuid: int, pid: int, tid: int, name: str | None, rank: int | None) -> None:
    thread = pb.ThreadDescriptor(pid=pid, tid=tid, thread_name=name)
    want = descriptor_packet(pb.TrackDescriptor(uuid=uuid, thread=thread, sibling_order_rank=rank))
    assert messages.descriptor(uuid, thread=messages.thread(pid, tid, name), rank=rank) == want


@EXAMPLES
@given(uuid=U64, parent=U64, name=TEXT, unit=st.sampled_from([None, messages.UNIT_COUNT, messages.UNIT_SIZE_BYTES]))
def test_child_and_counter_descriptors(uuid: int, parent: int, name: str, unit: int | None) -> None:
    counter = None if unit is None else pb.CounterDescriptor(unit=unit)
    want = descriptor_packet(pb.TrackDescriptor(uuid=uuid, parent_uuid=parent, name=name, counter=counter))
    assert messages.descriptor(uuid, name=name, parent=parent, unit=unit) == want


@EXAMPLES
@given(ts=U64, uuid=U64, value=I64)
def test_counter_value(ts: int, uuid: int, value: int) -> None:
    want = packet(pb.TracePacket(timestamp=ts, trusted_packet_sequence_id=wire.META_SEQ, track_event=pb.TrackEvent(
        type=wire.COUNTER, track_uuid=uuid, counter_value=value)))
    assert messages.counter(ts, uuid, value) == want


@EXAMPLES
@given(ts=U64, uuid=U64, name=TEXT, cat=TEXT, text=TEXT)
def test_metadata_instant(ts: int, uuid: int, name: str, cat: str, text: str) -> None:
    want = packet(pb.TracePacket(timestamp=ts, trusted_packet_sequence_id=wire.META_SEQ, track_event=pb.TrackEvent(
        type=wire.INSTANT, track_uuid=uuid, name=name, categories=[cat],
        debug_annotations=[pb.DebugAnnotation(name="json", string_value=text)])))
    assert messages.instant(ts, uuid, name, cat, [("json", text)]) == want


def test_a_lone_surrogate_in_a_name_is_written_replaced() -> None:
    raw = messages.descriptor(7, thread=messages.thread(1, 2, "worker \ud800"))
    (_, body), = iter_packets(raw)
    assert pb.TracePacket.FromString(body).track_descriptor.thread.thread_name == "worker ?"


# ---- whole files: each hand-built packet as protobuf writes it leaves the file unchanged ------
def kinds_and_rebuilt(data: bytes) -> tuple[set[str], bytes]:
    """The kinds of hand-built packets in ``data``, and ``data`` with each of them re-encoded by
    protobuf (span rows and interned data, the encoder's, left as they are)."""
    kinds: set[str] = set()
    out = bytearray()
    for _, raw in iter_packets(data):
        p = pb.TracePacket.FromString(raw)
        if p.trusted_packet_sequence_id == wire.META_SEQ or p.HasField("clock_snapshot"):
            kinds.add(_kind(p))
            raw = p.SerializeToString()
        out += wire.frame(raw)
    return kinds, bytes(out)


def _kind(p: Any) -> str:
    if p.HasField("clock_snapshot"):
        return "sequence header" if p.first_packet_on_sequence else "trace start"
    if p.HasField("track_descriptor"):
        d = p.track_descriptor
        if d.HasField("counter"):
            return f"counter track {d.counter.unit}"
        if d.HasField("process"):
            return "ordered process" if d.child_ordering else "process"
        if d.HasField("thread"):
            return "ranked thread" if d.HasField("sibling_order_rank") else "thread"
        return "child track"
    return {wire.COUNTER: "counter", wire.INSTANT: "metadata"}[p.track_event.type]


ALL_KINDS = {"trace start", "sequence header", "process", "ordered process", "thread", "ranked thread", "child track",
             f"counter track {messages.UNIT_COUNT}", f"counter track {messages.UNIT_SIZE_BYTES}", "counter", "metadata"}


def test_whole_files_are_what_protobuf_writes(tmp_path: Path, kernels: Any, queue: Any, instrumented: None) -> None:
    paths = [str(tmp_path / f"run{i}.pftrace") for i in range(2)]
    host = np.ones(kernels.n, dtype=np.float32)
    for path in paths:
        with cltrace.trace(path):
            buf = cl.Buffer(queue.context, cl.mem_flags.READ_WRITE, 4096)  # a device-memory counter sample
            prg = cltrace.compile("__kernel void z(__global float *a) { a[get_global_id(0)] = 0.0f; }",
                                  context=kernels.ctx)
            with cltrace.region("step ü", queue):
                kernels.launch_add(queue)
                cl.enqueue_copy(queue, kernels.a, host).wait()
            thread = threading.Thread(target=lambda: kernels.launch_add(queue), name="другой поток")
            thread.start()
            thread.join()
            prg.kernel("z")[(kernels.n,), None, queue](kernels.a)
            buf.release()
    merged = str(tmp_path / "merged.pftrace")
    merge(paths, merged)
    seen: set[str] = set()
    for path in [*paths, merged]:
        data = Path(path).read_bytes()
        kinds, rebuilt = kinds_and_rebuilt(data)
        assert rebuilt == expand(data).data, path
        seen |= kinds
        spans, meta = load_pftrace(path)
        assert {"step ü", "add", "z"} <= {s.name for s in spans} and "recorded_spans" in meta
    assert seen == ALL_KINDS


# ---- tracing to .pftrace never imports protobuf ----------------------------------------------
NO_PROTOBUF = """
import sys
if sys.argv[2] == "blocked":  # as where neither package is installed
    sys.modules["perfetto"] = sys.modules["google.protobuf"] = None
import pyopencl as cl
import cltrace
q = cltrace.profiling_queue()
k = cl.Kernel(cl.Program(q.context, "__kernel void k(__global float *x) { x[get_global_id(0)] += 1.0f; }").build(), "k")
buf = cl.Buffer(q.context, cl.mem_flags.READ_WRITE, 4096)
cltrace.start(sys.argv[1])
with cltrace.region("outer", q):
    for _ in range(100):
        cltrace.launch(k, q, (1024,), None, buf)
cltrace.stop()
print(sorted(m for m in sys.modules if m.split(".")[0] in ("google", "perfetto")))
"""


@pytest.mark.parametrize("packages", ["installed", "blocked"])
def test_tracing_to_pftrace_imports_no_protobuf(tmp_path: Path, packages: str) -> None:
    path = str(tmp_path / "x.pftrace")
    run = subprocess.run([sys.executable, "-c", NO_PROTOBUF, path, packages], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr
    assert "error" not in run.stderr.lower()
    if packages == "installed":
        assert run.stdout.strip() == "[]"
    spans, meta = load_pftrace(path)
    assert sum(s.name == "k" for s in spans) == 100 and "recorded_spans" in meta
    packets = [pb.TracePacket.FromString(raw) for _, raw in iter_packets(Path(path).read_bytes())]
    assert any(p.HasField("track_descriptor") and p.track_descriptor.thread.thread_name == "MainThread"
               for p in packets)
