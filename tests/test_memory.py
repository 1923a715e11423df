"""Device memory as a per-context counter of live bytes, its peak, and the
allocation sites of what is still alive, in both file formats and in ``cltrace analyze``."""
from __future__ import annotations

import gc
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pyopencl as cl
import pyopencl._cl as _cl
import pyopencl.array as cla
import pytest
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

import cltrace
from cltrace.read import load
from cltrace.read.perfetto import iter_packets
from cltrace.record.memory import COUNTER_PREFIX
from cltrace.record.recorder import RECORDER

MiB = 1 << 20
RW = cl.mem_flags.READ_WRITE
FLOAT4 = cl.ImageFormat(cl.channel_order.RGBA, cl.channel_type.FLOAT)


@pytest.fixture()
def ctx() -> Any:
    """A context of this test's own: objects other tests left alive (and their collection) are in others."""
    gc.collect()
    return cl.Context([cltrace.default_device()])


def label(ctx: Any) -> str:
    return f"context {RECORDER.memory.context_key(ctx)}"


def live_values(ctx: Any) -> list[int]:
    """Live bytes after each event in ``ctx``."""
    return [v for _, v in RECORDER.memory.samples_by_label().get(label(ctx), [])]


def known_pattern(ctx: Any) -> None:
    """1 MiB, +2 MiB, -1 MiB, +4 MiB (peak: 6 MiB, inside "grow"), then everything released."""
    with cltrace.region("load"):
        a = cl.Buffer(ctx, RW, MiB)
        b = cl.Buffer(ctx, RW, 2 * MiB)
    a.release()
    with cltrace.region("grow"):
        c = cl.Buffer(ctx, RW, 4 * MiB)
    b.release()
    del c  # released by garbage collection


def test_counter_returns_to_zero_after_explicit_release_and_gc(ctx: Any, instrumented: None) -> None:
    queue = cl.CommandQueue(ctx)
    with cltrace.trace():
        buf = cl.Buffer(ctx, RW, 1000)
        host = cl.Buffer(ctx, RW | cl.mem_flags.COPY_HOST_PTR, hostbuf=np.zeros(100, np.float32))
        arr = cla.zeros(queue, 250, np.float32)  # pyopencl.array allocates through cl.Buffer
        img = cl.create_image(ctx, RW, FLOAT4, shape=(16, 16))
        svm = cl.SVMAllocation(ctx, 512, 0, cl.svm_mem_flags.READ_WRITE)
        svm_ary = cl.csvm_empty(ctx, 64, np.float32)
        sub = buf.get_sub_region(0, 64)  # aliases buf: not an allocation
        RECORDER.memory.drain()
        assert RECORDER.memory.contexts[RECORDER.memory.context_key(ctx)].live == 1000 + 400 + 1000 + 4096 + 512 + 256
        buf.release()
        img.release()
        svm.release()
        del host, arr, svm_ary, sub
        gc.collect()
    values = live_values(ctx)
    assert values == [1000, 1400, 2400, 6496, 7008, 7264, 6264, 2168, 1656, 1256, 256, 0]
    mine = RECORDER.memory.metadata()["contexts"][str(RECORDER.memory.context_key(ctx))]
    assert (mine["live_bytes"], mine["allocations"], mine["releases"]) == (0, 6, 6)


def test_a_counted_object_is_the_real_pyopencl_object(ctx: Any, instrumented: None) -> None:
    queue = cl.CommandQueue(ctx)
    with cltrace.trace():
        buf = cl.Buffer(ctx, RW, 64)
        cl.enqueue_fill_buffer(queue, buf, np.float32(3), 0, 64)
        out = np.empty(16, np.float32)
        cl.enqueue_copy(queue, out, buf)
    assert isinstance(buf, _cl.Buffer) and type(buf) is cl.Buffer and (out == 3).all()
    cltrace.uninstrument()
    assert cl.Buffer is _cl.Buffer and cl.Image is _cl.Image and cl.SVMAllocation is _cl.SVMAllocation


def test_nothing_is_counted_while_tracing_is_off(ctx: Any, instrumented: None) -> None:
    before = cl.Buffer(ctx, RW, MiB)  # made untraced: its release is not counted either
    with cltrace.trace():
        during = cl.Buffer(ctx, RW, 100)
        before.release()
    assert live_values(ctx) == [100]
    during.release()
    assert live_values(ctx) == [100, 0]  # a release is counted whenever it happens


def test_peak_of_a_known_pattern_in_memory_and_both_files(ctx: Any, instrumented: None, tmp_path: Path) -> None:
    paths = [tmp_path / "m.json", tmp_path / "m.pftrace"]
    with cltrace.trace(*paths, quiet=True):
        known_pattern(ctx)
        gc.collect()
    assert live_values(ctx) == [MiB, 3 * MiB, 2 * MiB, 6 * MiB, 4 * MiB, 0]
    results = [cltrace.analyze(str(p)).memory for p in paths] + [cltrace.analyze().memory]
    mine = []
    for mem in results:
        (c,) = [c for c in mem["contexts"] if c["context"] == label(ctx)]
        assert (c["peak_bytes"], c["end_bytes"], c["during"]) == (6 * MiB, 0, "grow"), c
        assert (c["allocations"], c["releases"], c["samples"]) == (3, 3, 6)
        assert not [a for a in mem["alive"] if a["context"] == label(ctx)]
        mine.append(c)
    file_json, file_pf, in_memory = mine
    assert file_json["peak_at_ns"] == file_pf["peak_at_ns"]
    assert abs(file_json["peak_at_ns"] - in_memory["peak_at_ns"]) <= 1000


def allocate_and_keep(ctx: Any) -> tuple[Any, int]:
    line = sys._getframe().f_lineno + 1
    kept = cl.Buffer(ctx, RW, 3 * MiB)
    return kept, line


def test_alive_at_exit_names_the_users_allocating_line(ctx: Any, instrumented: None, tmp_path: Path) -> None:
    queue = cl.CommandQueue(ctx)
    path = tmp_path / "leak.json"
    with cltrace.trace(str(path), quiet=True):
        kept, line = allocate_and_keep(ctx)
        arr_line = sys._getframe().f_lineno + 1
        arr = cla.empty(queue, 1024, np.float32)  # through pyopencl.array: still the user's line
        freed = cl.Buffer(ctx, RW, MiB)
        freed.release()
    _, meta = load(path)
    alive = [a for a in meta["memory"]["alive"] if a["context"] == label(ctx)]
    assert [(a["file"], a["line"], a["function"], a["kind"], a["bytes"], a["count"]) for a in alive] == [
        (__file__, line, "allocate_and_keep", "Buffer", 3 * MiB, 1),
        (__file__, arr_line, "test_alive_at_exit_names_the_users_allocating_line", "Buffer", 4096, 1)]
    del kept, arr


def test_counter_tracks_in_json_and_pftrace(ctx: Any, instrumented: None, tmp_path: Path) -> None:
    js, pf = tmp_path / "c.json", tmp_path / "c.pftrace"
    with cltrace.trace(str(js), str(pf), quiet=True):
        known_pattern(ctx)
        gc.collect()
    expected = [MiB, 3 * MiB, 2 * MiB, 6 * MiB, 4 * MiB, 0]
    events = [json.loads(line.rstrip(",\n")) for line in js.read_text().splitlines()[1:]
              if line.startswith('{"ph":"C","cat":"memory"')]
    name = COUNTER_PREFIX + label(ctx)
    mine = sorted((e for e in events if e["name"] == name), key=lambda e: e["ts"])
    assert [e["args"]["live_bytes"] for e in mine] == expected

    packets = [pb.TracePacket.FromString(raw) for _, raw in iter_packets(pf.read_bytes())]
    (desc,) = [p.track_descriptor for p in packets
               if p.HasField("track_descriptor") and p.track_descriptor.name == name]
    assert desc.HasField("counter") and desc.counter.unit == pb.CounterDescriptor.UNIT_SIZE_BYTES
    counts = sorted((p.timestamp, p.track_event.counter_value) for p in packets
                    if p.HasField("track_event") and p.track_event.track_uuid == desc.uuid)
    assert all(p.track_event.type == pb.TrackEvent.TYPE_COUNTER for p in packets
               if p.HasField("track_event") and p.track_event.track_uuid == desc.uuid)
    assert [v for _, v in counts] == expected
    # the same samples, at the same times, read back from both files
    json_samples = load(js)[1]["memory_samples"][label(ctx)]
    pf_samples = load(pf)[1]["memory_samples"][label(ctx)]
    assert [v for _, v in json_samples] == [v for _, v in pf_samples] == expected
    start = load(js)[1]["start_ns"]
    assert [t + start for t, _ in json_samples] == [t for t, _ in pf_samples]


def test_analyze_memory_section_text_and_json(ctx: Any, instrumented: None, tmp_path: Path) -> None:
    path = tmp_path / "a.pftrace"
    with cltrace.trace(str(path), quiet=True):
        known_pattern(ctx)
        gc.collect()
        kept, line = allocate_and_keep(ctx)
    run = [sys.executable, "-m", "cltrace", "analyze"]
    text = subprocess.run(run + [str(path)], capture_output=True, text=True, check=True).stdout
    section = text[text.index("Device memory"):]
    (mine,) = [ln for ln in section.splitlines() if ln.startswith(f"  {label(ctx)} (")]
    assert "peak 6.00 MiB at +" in mine and " in grow; 3.00 MiB live at the end (4 allocations, 3 releases)" in mine
    assert f"{__file__}:{line} (allocate_and_keep)" in section
    doc = json.loads(subprocess.run(run + ["--json", str(path)], capture_output=True, text=True, check=True).stdout)
    (c,) = [c for c in doc["memory"]["contexts"] if c["context"] == label(ctx)]
    assert (c["peak_bytes"], c["end_bytes"], c["during"]) == (6 * MiB, 3 * MiB, "grow")
    assert [a["line"] for a in doc["memory"]["alive"] if a["context"] == label(ctx)] == [line]
    del kept


def test_a_trace_without_allocations_has_no_memory_section(tmp_path: Path) -> None:
    path = tmp_path / "none.json"
    code = ("import cltrace\n"
            f"with cltrace.trace({str(path)!r}, quiet=True):\n"
            "    with cltrace.region('r', cltrace.profiling_queue()):\n"
            "        pass\n")
    subprocess.run([sys.executable, "-c", code], check=True)  # a process of its own: nothing else is alive
    a = cltrace.analyze(str(path))
    assert a.memory == {} and "Device memory" not in a.report(width=120)
    assert "memory" not in load(path)[1]


def test_cltraces_own_buffer_is_counted_without_instrument(ctx: Any, leave_pyopencl: None) -> None:
    with cltrace.trace():
        buf = cltrace.Buffer(ctx, RW, 4096)
        plain = cl.Buffer(ctx, RW, 4096)  # pyopencl left alone: not seen
        del buf, plain
        gc.collect()
    assert live_values(ctx) == [4096, 0]


def test_pyopencls_buffers_are_counted_while_tracing_by_default(ctx: Any) -> None:
    with cltrace.trace():
        buf = cltrace.Buffer(ctx, RW, 4096)
        plain = cl.Buffer(ctx, RW, 4096)  # pyopencl's own: hooked while tracing
        del buf, plain
        gc.collect()
    assert live_values(ctx) == [4096, 8192, 4096, 0]


def test_migration_is_a_transfer_that_says_where_to(ctx: Any, instrumented: None) -> None:
    q = cl.CommandQueue(ctx)
    buf = cl.Buffer(ctx, RW, 4096)
    with cltrace.trace():
        cl.enqueue_migrate_mem_objects(q, [buf], cl.mem_migration_flags.HOST)
        cl.enqueue_migrate_mem_objects(q, [buf], 0)
        q.finish()
    spans = [s for s in RECORDER.spans() if s.cat == "transfer"]
    assert [(s.name, s.attrs["bytes"], s.attrs["to"]) for s in spans] == [("migrate", 4096, "host"),
                                                                          ("migrate", 4096, "device")]
    assert all(s.device_track is not None for s in spans)


def test_memory_pool_level_is_counted(ctx: Any, instrumented: None) -> None:
    import pyopencl.tools as cl_tools

    queue = cl.CommandQueue(ctx)
    with cltrace.trace():
        pool = cl_tools.MemoryPool(cl_tools.ImmediateAllocator(queue))
        a = cla.zeros(queue, MiB // 4, np.float32, allocator=pool)  # 1 MiB from the driver
        level = pool.managed_bytes
        del a
        b = cla.zeros(queue, MiB // 4, np.float32, allocator=pool)  # reuses the held block: no change
        assert pool.managed_bytes == level
        del b
        pool.free_held()  # back to the driver
        c = cla.zeros(queue, MiB // 4, np.float32, allocator=pool)
        del pool, c  # the pool's collection releases what it held
        gc.collect()
    assert level >= MiB and live_values(ctx) == [level, 0, level, 0]


def test_a_later_trace_starts_from_the_live_level(ctx: Any, instrumented: None, tmp_path: Path) -> None:
    with cltrace.trace(str(tmp_path / "first.json"), quiet=True):
        kept = cl.Buffer(ctx, RW, MiB)
        gone = cl.Buffer(ctx, RW, MiB)
        gone.release()
    second = tmp_path / "second.pftrace"
    with cltrace.trace(str(second), quiet=True):
        more = cl.Buffer(ctx, RW, 2 * MiB)
    late = tmp_path / "late.json"
    RECORDER.export(cltrace.export.chrome.ChromeTraceSink(str(late)))  # what memory holds: both sessions
    assert [v for _, v in load(second)[1]["memory_samples"][label(ctx)]] == [MiB, 3 * MiB]
    assert [v for _, v in load(late)[1]["memory_samples"][label(ctx)]] == [MiB, 2 * MiB, MiB, 3 * MiB]
    del kept, more


def test_sinks_of_one_start_begin_from_one_sample(ctx: Any, tmp_path: Path) -> None:
    """Two files of one run say the same thing: the level memory starts from is one sample, not one
    per sink taken a few microseconds apart (CI once saw a packed and a plain pftrace disagree)."""
    from cltrace.export.perfetto import PerfettoTraceSink

    with cltrace.trace():
        held = cl.Buffer(ctx, RW, 4096)  # alive when the next run starts
    packed, plain = tmp_path / "a.pftrace", tmp_path / "b.pftrace"
    with cltrace.trace(PerfettoTraceSink(packed), PerfettoTraceSink(plain, compress=False)):
        cl.Buffer(ctx, RW, 1024).release()
    a, b = (load(p)[1]["memory_samples"][label(ctx)] for p in (packed, plain))
    assert a == b and [v for _, v in a] == [4096, 5120, 4096]
    del held
