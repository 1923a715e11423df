"""The Perfetto exporter (.pftrace) and its reader, on real OpenCL (PoCL).

The trace is decoded here with the ``perfetto`` package's protos and replayed the
way trace processor does it: per-sequence clocks and interning, then per track a
stable sort by timestamp (ties keep file order) and BEGIN/END paired on a stack.
Flow ids are read from both ``flow_ids`` and the varint ``flow_ids_old``, as trace processor
does; a device slice without "device.start" gets its start plus the sequence's last offset.
"""
from __future__ import annotations

import os
import random
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

import cltrace
from cltrace.errors import TraceFileError
from cltrace.export.processes import program_name
from cltrace.export.perfetto import PerfettoTraceSink
from cltrace.read.perfetto import _varint, iter_packets, load_pftrace
from cltrace.record.recorder import RECORDER, Recorder
from cltrace.export.formats import format_for
from cltrace.timeline.spans import Span
from cltrace.read import load
from cltrace.read.chrome import load_chrome

TE = pb.TrackEvent
MONOTONIC = pb.BUILTIN_CLOCK_MONOTONIC


# ---- an independent decoder with trace processor's semantics ----------------------------
@dataclass
class Slice:
    track: int
    begin: int
    end: int
    name: str
    cat: str
    ann: dict[str, Any]
    flow: list[int]
    tflow: list[int]
    under: int  # span id of the slice it nests in on its track, as trace processor nests it (0: none)


@dataclass
class Decoded:
    packets: list[Any]
    descriptors: dict[int, Any] = field(default_factory=dict)
    slices: list[Slice] = field(default_factory=list)
    unmatched_ends: int = 0
    open_begins: int = 0
    counters: dict[int, list[tuple[int, int]]] = field(default_factory=dict)


def _ann_value(a: Any) -> Any:
    kind = a.WhichOneof("value")
    if kind is None and a.array_values:
        return [_ann_value(x) for x in a.array_values]
    return getattr(a, kind) if kind else None


def decode(path: str) -> Decoded:
    with open(path, "rb") as fh:
        data = fh.read()
    packets = [pb.TracePacket.FromString(raw) for _, raw in iter_packets(data)]
    out = Decoded(packets)
    state: dict[int, dict[str, Any]] = {}
    events: dict[int, list[tuple[int, int, int, Any]]] = {}
    for i, p in enumerate(packets):
        st = state.setdefault(p.trusted_packet_sequence_id, {"names": {}, "cats": {}, "dnames": {}, "clock": 0,
                                                             "uuid": 0, "inc": {}, "mono": 0, "dev_offset": None})
        if p.sequence_flags & pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED:
            st["names"], st["cats"], st["dnames"] = {}, {}, {}
        if p.HasField("trace_packet_defaults"):
            st["clock"] = p.trace_packet_defaults.timestamp_clock_id
            st["uuid"] = p.trace_packet_defaults.track_event_defaults.track_uuid
        if p.HasField("interned_data"):
            st["names"].update({e.iid: e.name for e in p.interned_data.event_names})
            st["cats"].update({e.iid: e.name for e in p.interned_data.event_categories})
            st["dnames"].update({e.iid: e.name for e in p.interned_data.debug_annotation_names})
        if p.HasField("clock_snapshot"):
            clocks = {c.clock_id: c for c in p.clock_snapshot.clocks}
            for cid, c in clocks.items():
                if c.is_incremental:
                    st["inc"][cid] = c.timestamp
                    st["mono"] = clocks[MONOTONIC].timestamp - c.timestamp
            continue
        if p.HasField("track_descriptor"):
            out.descriptors[p.track_descriptor.uuid] = p.track_descriptor
            continue
        if not p.HasField("track_event"):
            continue
        clock = p.timestamp_clock_id or st["clock"]
        if clock in st["inc"]:
            st["inc"][clock] += p.timestamp
            ts = st["inc"][clock]
        else:
            assert clock == MONOTONIC
            ts = p.timestamp - st["mono"]
        te = p.track_event
        uuid = te.track_uuid if te.HasField("track_uuid") else st["uuid"]
        if te.type == TE.TYPE_COUNTER:
            out.counters.setdefault(uuid, []).append((ts, te.counter_value))
        elif te.type in (TE.TYPE_SLICE_BEGIN, TE.TYPE_SLICE_END):
            payload = None
            if te.type == TE.TYPE_SLICE_BEGIN:
                ann = {st["dnames"][a.name_iid]: _ann_value(a) for a in te.debug_annotations}
                if "device.start" in ann:
                    st["dev_offset"] = ann["device.start"] - ts
                elif st["dev_offset"] is not None:
                    ann["device.start"] = ts + st["dev_offset"]
                cat = st["cats"][te.category_iids[0]] if te.category_iids else None
                payload = (st["names"][te.name_iid], cat, ann, list(te.flow_ids) + list(te.flow_ids_old),
                           list(te.terminating_flow_ids) + list(te.terminating_flow_ids_old))
            events.setdefault(uuid, []).append((ts, i, te.type, payload))
    for uuid, evs in events.items():
        evs.sort(key=lambda e: (e[0], e[1]))
        stack: list[tuple[int, Any, int]] = []
        for ts, _, kind, payload in evs:
            if kind == TE.TYPE_SLICE_BEGIN:
                stack.append((ts, payload, _payload_id(stack[-1][1]) if stack else 0))
            elif stack:
                b, (name, cat, ann, fl, tfl), under = stack.pop()
                out.slices.append(Slice(uuid, b, ts, name, cat, ann, fl, tfl, under))
            else:
                out.unmatched_ends += 1
        out.open_begins += len(stack)
    return out


def _payload_id(payload: Any) -> int:
    _, _, ann, fl, tfl = payload
    return ann["span"] if "span" in ann else (fl or tfl)[0]


def span_id(s: Slice) -> int:
    return s.ann["span"] if "span" in s.ann else (s.flow or s.tflow)[0]


def wrong_parents(slices: list[Slice], parent_of: dict[int, int]) -> list[Slice]:
    """Slices that trace processor would nest under something other than their nearest ancestor
    placed on the same track."""
    on_track = {(s.track, span_id(s)) for s in slices}
    bad = []
    for s in slices:
        anc = parent_of.get(span_id(s), 0)
        while anc and (s.track, anc) not in on_track:
            anc = parent_of.get(anc, 0)
        if s.under != anc:
            bad.append(s)
    return bad


def misnested(slices: list[Slice]) -> list[tuple[Slice, Slice]]:
    bad = []
    by_track: dict[int, list[Slice]] = {}
    for s in slices:
        by_track.setdefault(s.track, []).append(s)
    for evs in by_track.values():
        evs.sort(key=lambda s: (s.begin, -s.end))
        stack: list[Slice] = []
        for s in evs:
            while stack and stack[-1].end <= s.begin and not (stack[-1].end == s.begin == s.end):
                stack.pop()
            if stack and s.end > stack[-1].end:
                bad.append((stack[-1], s))
            stack.append(s)
    return bad


# ---- a traced workload, written as .json and .pftrace in one session -------------------
@dataclass
class Traced:
    json: str
    pftrace: str
    decoded: Decoded
    chrome: tuple[list[Span], dict[str, Any]]
    start_ns: int


@pytest.fixture(scope="module")
def traced(tmp_path_factory: Any, reset: Any, kernels: Any, queue: Any) -> Traced:
    reset()
    d = tmp_path_factory.mktemp("pftrace")
    js, pf = str(d / "run.json"), str(d / "run.pftrace")
    host = np.ones(kernels.n, dtype=np.float32)

    def other_thread() -> None:
        k = kernels.kernel("add")
        q2 = cltrace.profiling_queue(kernels.ctx)
        with cltrace.region("worker", q2):
            cltrace.launch(k, q2, (kernels.n,), None, kernels.a, kernels.b)

    with cltrace.trace(js, pf):
        prg = cltrace.compile("__kernel void twice(__global float *a) { a[get_global_id(0)] *= 2.0f; }",
                              context=kernels.ctx)
        for _ in range(3):
            with cltrace.region("step", queue):
                with cltrace.region("fwd", queue):
                    kernels.launch_add(queue)
                    kernels.launch_spin(queue, iters=50)
                with cltrace.region("bwd"):
                    kernels.launch_add(queue)
        cltrace.copy(queue, kernels.a, host, "upload", is_blocking=True)  # named: pyopencl's hook leaves it
        with pytest.raises(ValueError):
            with cltrace.region("bad", queue):
                kernels.launch_add(queue)
                raise ValueError("boom")
        t = threading.Thread(target=other_thread, name="worker-thread")
        t.start()
        t.join()
        with cltrace.region("after-compile", queue):
            prg.kernel("twice")[(kernels.n,), None, queue](kernels.a)
        start_ns = RECORDER.start_ns
    return Traced(js, pf, decode(pf), load_chrome(js), start_ns)


def test_format_registered() -> None:
    assert format_for("out.pftrace") == "pftrace"


def test_track_descriptors(traced: Traced) -> None:
    desc = traced.decoded.descriptors
    procs = [d for d in desc.values() if d.HasField("process")]
    assert procs[0].process.pid == os.getpid()
    assert procs[0].process.process_name == program_name()
    device_procs = {p.process.pid: p for p in procs[1:]}
    assert device_procs and all(p.process.process_name.startswith("OpenCL: ") for p in device_procs.values())
    tracks = {t.id: t for t in RECORDER.tracks.tracks()}
    threads = {d.uuid: d for d in desc.values() if d.HasField("thread")}
    assert {d.thread.thread_name for d in threads.values()} >= {"MainThread", "worker-thread"}
    for uuid, d in threads.items():
        assert tracks[uuid].name == d.thread.thread_name
        if tracks[uuid].kind == "thread":
            assert d.thread.pid == os.getpid()
    used = {s.track for s in traced.decoded.slices}  # the registry also holds other tests' tracks
    device_queues = [t for t in tracks.values() if t.kind == "queue" and t.id in used]
    assert len(device_queues) >= 2  # the main queue and the worker's queue
    for t in device_queues:  # threads of their device's process, as in the Chrome JSON
        d = desc[t.id]
        assert d.thread.thread_name == t.name and d.thread.tid == t.id
        assert "queue" in t.name
        assert device_procs[d.thread.pid].process.process_name == t.process  # "OpenCL: <device>"
    compile_tracks = [t for t in tracks.values() if t.kind == "compile"]
    assert compile_tracks
    d = desc[compile_tracks[0].id]
    assert d.name == compile_tracks[0].name
    assert d.parent_uuid == procs[0].uuid
    counters = {d.name for d in desc.values() if d.HasField("counter")}
    assert "cltrace: dropped spans" in counters
    assert any(name.endswith("bytes transferred") for name in counters)


def test_slices_nest_and_match_chrome(traced: Traced) -> None:
    dec = traced.decoded
    assert dec.unmatched_ends == 0 and dec.open_begins == 0
    assert not misnested(dec.slices)
    names = {s.name for s in dec.slices}
    assert {"step", "fwd", "bwd", "add", "spin", "bad", "upload", "worker", "after-compile", "twice"} <= names
    chrome_spans, _ = traced.chrome
    by_id = {s.id: s for s in chrome_spans}
    host = [s for s in dec.slices if "device.start" not in s.ann]
    device = [s for s in dec.slices if "device.start" in s.ann]
    assert len(host) == len(chrome_spans)
    assert len(device) == sum(1 for s in chrome_spans if s.dev_start is not None)
    for s in host:
        c = by_id[span_id(s)]
        assert (s.begin - traced.start_ns, s.end - traced.start_ns) == (c.host_begin, c.host_end)
        assert (s.name, s.cat, s.track) == (c.name, c.cat, c.thread)
    for s in device:
        c = by_id[span_id(s)]
        assert (s.begin - traced.start_ns, s.end - traced.start_ns) == (c.dev_start, c.dev_end)
        assert s.ann["device.start"] == c.raw_start
        if c.cat in ("region", "autotune", "trial"):  # a region's edges may fall either side of a placement step
            assert ("device.end" in s.ann) == (c.raw_end - c.raw_start != c.dev_end - c.dev_start)
        else:  # a command is drawn with one offset: the raw END - START is the slice's length
            assert "device.end" not in s.ann
            assert c.raw_end - c.raw_start == c.dev_end - c.dev_start
        assert s.track == c.device_track


def test_children_inside_parents(traced: Traced) -> None:
    dec = traced.decoded
    assert not wrong_parents(dec.slices, {s.id: s.parent for s in traced.chrome[0]})
    host = {span_id(s): s for s in dec.slices if "device.start" not in s.ann}
    device = {span_id(s): s for s in dec.slices if "device.start" in s.ann}
    nested = 0
    for sid, s in host.items():
        parent = s.ann.get("parent", 0)
        if not parent:
            continue
        p = host[parent]
        if p.track == s.track:
            assert p.begin <= s.begin and s.end <= p.end, (s, p)
            nested += 1
        anc = parent
        while sid in device and anc:  # nearest ancestor with a device slice on the same track
            if anc in device and device[anc].track == device[sid].track:
                a, c = device[anc], device[sid]
                assert a.begin <= c.begin and c.end <= a.end, (c, a)
                nested += 1
                break
            anc = host[anc].ann.get("parent", 0)
    assert nested >= 20


def test_flows_join_each_launch_to_its_device_slice(traced: Traced) -> None:
    dec = traced.decoded
    out_flows = [f for s in dec.slices for f in s.flow]
    in_flows = [f for s in dec.slices for f in s.tflow]
    chrome_spans, _ = traced.chrome
    launches = {s.id for s in chrome_spans if s.dev_start is not None and s.cat != "region"}
    assert sorted(out_flows) == sorted(in_flows) == sorted(launches)
    for s in dec.slices:
        if s.flow:
            assert "device.start" not in s.ann and s.cat in ("kernel", "transfer")
        if s.tflow:
            assert "device.start" in s.ann
    regions = [s for s in dec.slices if s.cat == "region"]
    assert regions and not any(s.flow or s.tflow for s in regions)


def test_interning_and_incremental_timestamps(traced: Traced) -> None:
    packets = traced.decoded.packets
    events = [p for p in packets if p.HasField("track_event")
              and p.track_event.type in (TE.TYPE_SLICE_BEGIN, TE.TYPE_SLICE_END)]
    assert events
    begins = [p.track_event for p in events if p.track_event.type == TE.TYPE_SLICE_BEGIN]
    assert all(te.name_iid and not te.HasField("name") for te in begins)
    # Device slices carry no category (their span's is on the host slice): only host BEGINs have one.
    device_seqs = {p.trusted_packet_sequence_id for p in events if p.track_event.terminating_flow_ids_old}
    host_begins = [p.track_event for p in events
                   if p.track_event.type == TE.TYPE_SLICE_BEGIN and p.trusted_packet_sequence_id not in device_seqs]
    assert host_begins and all(te.category_iids and not te.categories for te in host_begins)
    assert not any(te.category_iids or te.categories for p in events if p.trusted_packet_sequence_id in device_seqs
                   for te in [p.track_event])
    assert all(a.name_iid and not a.HasField("name") for te in begins for a in te.debug_annotations)
    # No SEQ_NEEDS_INCREMENTAL_STATE on events: trace processor uses it only to skip packets after a
    # data loss, which a file cltrace writes never has; interning and clocks work without it.
    assert not any(p.sequence_flags for p in events)
    interned = [p.interned_data for p in packets if p.HasField("interned_data")]
    assert sum(len(i.event_names) for i in interned) >= 5
    assert sum(len(i.debug_annotation_names) for i in interned) >= 3
    seqs = {p.trusted_packet_sequence_id for p in events}
    for seq in seqs:
        first = next(p for p in packets if p.trusted_packet_sequence_id == seq)
        assert first.sequence_flags & pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED
        clocks = {c.clock_id: c for c in first.clock_snapshot.clocks}
        inc = [c for c in clocks.values() if c.is_incremental]
        assert len(inc) == 1 and MONOTONIC in clocks
        assert first.trace_packet_defaults.timestamp_clock_id == inc[0].clock_id
    # A timestamp is absolute exactly where time goes back on its sequence (a parent written after
    # its children, in a later batch); every other one is a delta on the incremental clock.
    for seq in seqs:
        first = next(p for p in packets if p.trusted_packet_sequence_id == seq)
        clocks = {c.clock_id: c for c in first.clock_snapshot.clocks}
        inc0 = next(c.timestamp for c in clocks.values() if c.is_incremental)
        mono0 = clocks[MONOTONIC].timestamp
        inc = inc0
        for p in (p for p in events if p.trusted_packet_sequence_id == seq):
            if p.timestamp_clock_id:
                assert p.timestamp_clock_id == MONOTONIC
                assert p.timestamp < inc - inc0 + mono0
            else:
                inc += p.timestamp
    assert sum(1 for p in events if not p.timestamp_clock_id) > 0.5 * len(events)
    assert max(p.timestamp for p in events if not p.timestamp_clock_id) < 10**10


def test_counters(traced: Traced) -> None:
    dec = traced.decoded
    names = {d.uuid: d.name for d in dec.descriptors.values() if d.HasField("counter")}
    dropped = [v for uuid, vals in dec.counters.items() if names.get(uuid) == "cltrace: dropped spans"
               for _, v in vals]
    assert dropped and dropped[-1] == 0
    moved = [vals for uuid, vals in dec.counters.items() if names.get(uuid, "").endswith("bytes transferred")]
    assert len(moved) == 1 and [v for _, v in moved[0]] == [4 * 4096]  # one upload of 4096 float32


def test_reader_matches_chrome(traced: Traced) -> None:
    pf_spans, pf_meta = load_pftrace(traced.pftrace)
    ch_spans, ch_meta = traced.chrome
    assert len(pf_spans) == len(ch_spans)
    ch = {s.id: s for s in ch_spans}
    off = traced.start_ns
    for s in pf_spans:
        c = ch[s.id]
        assert (s.parent, s.name, s.cat, s.thread, s.status, s.error, s.path) == (
            c.parent, c.name, c.cat, c.thread, c.status, c.error, c.path)
        assert (s.host_begin - off, s.host_end - off) == (c.host_begin, c.host_end)
        if c.dev_start is None:
            assert s.dev_start is None
        else:
            assert (s.dev_start - off, s.dev_end - off, s.device_track) == (c.dev_start, c.dev_end, c.device_track)
            assert (s.raw_start, s.raw_end) == (c.raw_start, c.raw_end)
            assert s.device_ns == c.device_ns
    bad = next(s for s in pf_spans if s.name == "bad")
    assert bad.status == "error" and bad.error == "ValueError: boom"
    kernel = next(s for s in pf_spans if s.cat == "kernel")
    assert kernel.attrs["global_size"] == [4096]
    for key in ("start_ns", "pid", "clocks", "devices", "dropped_spans", "recorded_spans"):
        assert pf_meta[key] == ch_meta[key], key
    summary_spans, _ = load(traced.pftrace)
    assert len(summary_spans) == len(pf_spans)


def test_truncated_file_reads_up_to_last_complete_packet(traced: Traced, tmp_path: Any) -> None:
    data = open(traced.pftrace, "rb").read()
    full = {s.id: s for s in load_pftrace(traced.pftrace)[0]}
    frames = []  # the file's own packets, compressed ones as one: (end, packets it holds)
    pos = 0
    while pos < len(data):
        size, start = _varint(data, pos + 1)
        frames.append((start + size, len(iter_packets(data[pos:start + size]))))
        pos = start + size
    assert any(n > 1 for _, n in frames), "the spans are written compressed"
    bounds = [0] + [end for end, _ in frames]
    meta_end = next(end for end, _ in frames if b"cltrace.metadata" in data[:end])
    rng = random.Random(7)
    cuts = sorted(rng.sample(range(1, len(data)), 25) + [bounds[1] - 1, bounds[1], bounds[len(bounds) // 2] + 1])
    cut_path = tmp_path / "cut.pftrace"
    for cut in cuts:
        cut_path.write_bytes(data[:cut])
        complete = sum(n for end, n in frames if end <= cut)
        if complete == 0:
            with pytest.raises(TraceFileError, match="first complete packet"):
                load_pftrace(cut_path)
            continue
        assert len(iter_packets(data[:cut])) == complete
        spans, meta = load_pftrace(cut_path)
        for s in spans:
            f = full[s.id]
            assert (s.name, s.parent, s.host_begin, s.host_end) == (f.name, f.parent, f.host_begin, f.host_end)
            assert s.dev_start is None or (s.dev_start, s.dev_end, s.raw_start) == (f.dev_start, f.dev_end,
                                                                                    f.raw_start)
        assert ("start_ns" in meta) == (cut >= meta_end)  # metadata written at start survives later cuts
    assert len(load_pftrace(traced.pftrace)[0]) == len(full)


def test_garbage_and_non_traces_raise(tmp_path: Any) -> None:
    cases = {
        "empty.pftrace": b"",
        "random.pftrace": bytes(random.Random(1).randrange(256) for _ in range(4096)),
        "json.pftrace": b'[{"ph": "X"}]',
        "framed-garbage.pftrace": b"\x0a\x05\xff\xff\xff\xff\xff" * 3,
    }
    for name, data in cases.items():
        p = tmp_path / name
        p.write_bytes(data)
        with pytest.raises(TraceFileError) as err:
            load_pftrace(p)
        assert "\n" not in str(err.value)
    with pytest.raises(TraceFileError):
        load_pftrace(tmp_path / "missing.pftrace")
    good = tmp_path / "good-then-garbage.pftrace"
    good.write_bytes(b"\x0a\x02\x50\x01" + b"\x99garbage")
    with pytest.raises(TraceFileError, match="byte 4"):
        load_pftrace(good)
    p = tmp_path / "random2.pftrace"
    p.write_bytes(b"\x0a" + bytes(random.Random(2).randrange(256) for _ in range(300)))
    with pytest.raises(TraceFileError):
        load(p)


def test_load_names_a_missing_perfetto_package_and_nothing_else(traced: Traced) -> None:
    def load_with(blocked: str) -> subprocess.CompletedProcess[str]:
        code = ("import sys\n"
                f"sys.modules[{blocked!r}] = None\n"
                "from cltrace.errors import TraceFileError\n"
                "from cltrace.read import load\n"
                "try:\n"
                f"    load({traced.pftrace!r})\n"
                "except TraceFileError as exc:\n"
                "    print('TraceFileError:', exc)\n")
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)

    missing = load_with("perfetto")
    assert missing.returncode == 0, missing.stderr
    assert missing.stdout.strip() == (f"TraceFileError: {traced.pftrace}: reading .pftrace needs the perfetto "
                                      "package (pip install perfetto)")
    broken = load_with("google.protobuf")  # what the reader needs besides perfetto: a real error, shown as it is
    assert broken.returncode == 1 and "TraceFileError" not in broken.stdout
    assert "ModuleNotFoundError" in broken.stderr and "google.protobuf" in broken.stderr


def test_flushed_file_is_readable_before_close(tmp_path: Any, kernels: Any, queue: Any) -> None:
    path = str(tmp_path / "live.pftrace")
    cltrace.start(path)
    try:
        with cltrace.region("outer", queue):
            kernels.launch_add(queue)
        with cltrace.region("open", queue):  # still open at the flush: its rows wait for it
            kernels.launch_add(queue)
            RECORDER.flush(block=True)
            spans, _ = load_pftrace(path + ".partial")  # its name until it is closed
    finally:
        cltrace.stop()
    assert {s.name for s in spans} >= {"outer", "add"}
    assert "open" not in {s.name for s in spans}
    final, _ = load_pftrace(path)
    assert {s.name for s in final} >= {"outer", "open", "add"}


# ---- ordering of hand-made spans: ties, zero lengths, parents in later batches ------------
def _sink_for(tmp_path: Any, queue: Any) -> tuple[PerfettoTraceSink, Recorder, int, int, str]:
    rec = Recorder()
    ident = threading.get_ident()
    th = rec.tracks.host_thread(ident)
    dt = rec.tracks.device_queue(queue, ident)
    path = str(tmp_path / "made.pftrace")
    sink = PerfettoTraceSink(path)
    sink.start(rec)
    return sink, rec, th, dt, path


def _expect(decoded: Decoded, spans: list[Span]) -> None:
    assert decoded.unmatched_ends == 0 and decoded.open_begins == 0
    got = {("device" if "device.start" in s.ann else "host", span_id(s)): (s.begin, s.end, s.ann.get("parent", 0))
           for s in decoded.slices}
    want = {}
    for s in spans:
        want[("host", s.id)] = (s.host_begin, s.host_end, s.parent)
        if s.dev_start is not None:
            want[("device", s.id)] = (s.dev_start, s.dev_end, 0)
    assert {k: v[:2] for k, v in got.items()} == {k: v[:2] for k, v in want.items()}
    assert not misnested(decoded.slices)
    assert not wrong_parents(decoded.slices, {s.id: s.parent for s in spans})


def test_ties_and_zero_length_slices_nest_across_batches(tmp_path: Any, queue: Any) -> None:
    sink, rec, th, dt, path = _sink_for(tmp_path, queue)
    t = 10**12
    off = 777

    def sp(sid: int, parent: int, name: str, cat: str, h: tuple[int, int], d: tuple[int, int] | None) -> Span:
        s = Span(sid, parent, name, cat, th, t + h[0], t + h[1])
        if d is not None:
            s.device_track = dt
            s.dev_queued = s.dev_submit = s.dev_start = t + d[0]
            s.dev_end = t + d[1]
            s.raw_start, s.raw_end = s.dev_start + off, s.dev_end + off
        return s

    # On the device, region 1 is widened to its children (same start as 2, same end as 4), 3 ends where
    # 4 ends, 5 is zero length at 3's end and 6, the next command, is zero length at 1's end. Writes
    # deliver children before parents, and 6 one write before 1, as the recorder can; host times are
    # distinct clock reads except within a write.
    spans = [
        sp(1, 0, "R", "region", (0, 100), (1000, 2000)),
        sp(2, 1, "k", "kernel", (10, 20), (1000, 1500)),
        sp(3, 1, "inner", "region", (30, 60), (1500, 2000)),
        sp(4, 3, "k", "kernel", (40, 50), (1500, 2000)),
        sp(5, 3, "z", "kernel", (55, 55), (2000, 2000)),
        sp(6, 0, "z2", "kernel", (101, 102), (2000, 2000)),
        sp(7, 0, "after", "region", (103, 150), None),
    ]
    by_id = {s.id: s for s in spans}
    for batch in ([2], [4, 5], [3, 6, 7], [1]):
        sink.write([by_id[i] for i in batch])
    sink.close(rec.metadata())
    _expect(decode(path), spans)
    spans_back, _ = load_pftrace(path)
    assert [(s.id, s.host_begin, s.host_end, s.dev_start, s.dev_end, s.raw_start, s.raw_end) for s in
            sorted(spans_back, key=lambda s: s.id)] == [
        (s.id, s.host_begin, s.host_end, s.dev_start, s.dev_end, s.raw_start, s.raw_end) for s in spans]
    packets = decode(path).packets
    assert any(p.timestamp_clock_id == MONOTONIC for p in packets if p.HasField("track_event")), \
        "a parent written after its children needs an absolute timestamp"


def test_raw_end_is_written_where_it_does_not_follow(tmp_path: Any, queue: Any) -> None:
    sink, rec, th, dt, path = _sink_for(tmp_path, queue)
    t = 10**12
    same = Span(1, 0, "k", "kernel", th, t, t + 10, dt, t + 20, t + 20, t + 20, t + 50, t + 20 - 7, t + 50 - 7)
    # A span whose raw stamps were mapped with two offsets (a recalibration between START and END).
    apart = Span(2, 0, "k", "kernel", th, t + 60, t + 70, dt, t + 80, t + 80, t + 80, t + 90, t + 80 - 7, t + 90 - 9)
    sink.write([same, apart])
    sink.close(rec.metadata())
    anns = {span_id(s): s.ann for s in decode(path).slices if "device.start" in s.ann}
    assert anns[1] == {"device.start": same.raw_start}
    assert anns[2] == {"device.start": apart.raw_start, "device.end": apart.raw_end}
    back = {s.id: s for s in load_pftrace(path)[0]}
    for s in (same, apart):
        assert (back[s.id].raw_start, back[s.id].raw_end, back[s.id].device_ns) == (s.raw_start, s.raw_end, s.device_ns)


def test_shuffled_batches_of_generated_trees_nest(tmp_path: Any, queue: Any) -> None:
    sink, rec, th, dt, path = _sink_for(tmp_path, queue)
    rng = random.Random(11)
    spans: list[Span] = []
    ids = iter(range(1, 10**6))
    clock = [10**12]

    def tick(lo: int = 0, hi: int = 3) -> int:
        clock[0] += rng.randint(lo, hi)
        return clock[0]

    def tree(parent: int, depth: int) -> None:
        sid = next(ids)
        hb = tick()
        ds = tick()
        kids_before = len(spans)
        if depth < 3:
            for _ in range(rng.randint(0, 3)):
                tree(sid, depth + 1)
        he, de = tick(), tick()
        kids = [s for s in spans[kids_before:] if s.parent == sid and s.dev_start is not None]
        if kids:  # regions bracket their children on the device, often exactly
            ds = min(ds, min(k.dev_start for k in kids))
            de = max(de, max(k.dev_end for k in kids))
        s = Span(sid, parent, f"n{depth}", "region" if depth < 3 else "kernel", th, hb, he, dt, ds, ds, ds, de,
                 ds + 5, de + 5)
        spans.append(s)  # post-order: children first, as the recorder delivers them

    for _ in range(40):
        tree(0, 0)
    pos = 0
    while pos < len(spans):
        n = rng.randint(1, 12)
        batch = spans[pos:pos + n]
        rng.shuffle(batch)
        sink.write(batch)
        pos += n
    sink.close(rec.metadata())
    _expect(decode(path), spans)
