"""The .pftrace writer: the C pass (``cltrace._ext.writer``, driven by ``fused``) and the numpy path write the
same bytes, on batches traced on real PoCL and on generated ones, and the files read back exactly.

The native tests fail, not skip, when the extension is not active: CI must exercise both paths.
Only ``CLTRACE_NATIVE=0`` (the fallback-only run) skips them.
"""
from __future__ import annotations

import os
import random
import subprocess
import sys
import threading
import time
from typing import Any, Sequence

import numpy as np
import pyopencl as cl
import pytest
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

import cltrace
from cltrace.export.perfetto import META_SEQ, PerfettoTraceSink, encoder
from cltrace.read.perfetto import iter_packets, load_pftrace
from cltrace.record.recorder import RECORDER, Recorder
from cltrace.timeline.batch import NAMES, SpanBatch
from cltrace.timeline.sites import CallSite
from cltrace.timeline.spans import Span

DISABLED = os.environ.get("CLTRACE_NATIVE", "").strip() == "0"


def native() -> Any:
    if DISABLED:
        pytest.skip("CLTRACE_NATIVE=0: fallback-only run")
    if encoder.NATIVE is None:
        pytest.fail(f"the C extension is not active ({encoder.WHY}): reinstall with "
                    "`pip install -e .` where a C compiler exists, or run with CLTRACE_NATIVE=0")
    return encoder.NATIVE


class Capture:
    """A sink that keeps the batches the recorder hands over, as it hands them over."""

    def __init__(self) -> None:
        self.batches: list[SpanBatch] = []

    def start(self, recorder: Any) -> None:
        pass

    def write(self, spans: Sequence[Span]) -> None:
        self.batches.append(spans)  # type: ignore[arg-type]

    def flush(self, meta: dict[str, Any]) -> None:
        pass

    def close(self, meta: dict[str, Any]) -> None:
        pass


def write_with(impl: Any, recorder: Any, batches: Sequence[Any], path: str, monkeypatch: Any) -> bytes:
    """The file a PerfettoTraceSink writes from ``batches``: through the C writer ``impl``, or the numpy path (None)."""
    with monkeypatch.context() as m:
        m.setattr(encoder, "NATIVE", impl)
        sink = PerfettoTraceSink(path)
        sink.start(recorder)
        for b in batches:
            sink.write(b)
        meta = recorder.metadata()
        sink.flush(meta)
        sink.close(meta)
    with open(path, "rb") as fh:
        return fh.read()


def timeless(data: bytes) -> list[bytes]:
    """The file's packets less those stamped with the wall clock when written (the opening clock
    snapshot, the dropped-spans counter and the metadata, all on sequence 1)."""
    out = []
    for _, raw in iter_packets(data):
        p = pb.TracePacket.FromString(raw)
        if p.trusted_packet_sequence_id == META_SEQ and (p.HasField("clock_snapshot") or p.HasField("track_event")):
            continue
        out.append(raw)
    return out


def assert_same_files(recorder: Any, batches: Sequence[Any], tmp_path: Any, monkeypatch: Any) -> bytes:
    fast = write_with(native(), recorder, batches, str(tmp_path / "native.pftrace"), monkeypatch)
    slow = write_with(None, recorder, batches, str(tmp_path / "python.pftrace"), monkeypatch)
    a, b = timeless(fast), timeless(slow)
    assert len(a) == len(b)
    first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
    assert first is None, f"packet {first} differs:\n{pb.TracePacket.FromString(a[first])}\n" \
                          f"{pb.TracePacket.FromString(b[first])}"
    return fast


# ---- the active path ---------------------------------------------------------------------------
def test_the_active_path_is_native_unless_disabled() -> None:
    if DISABLED:
        assert (encoder.PATH, encoder.NATIVE) == ("python", None)
        assert encoder.DETAIL == "python (fallback: CLTRACE_NATIVE=0)"
    else:
        assert native() is sys.modules["cltrace._ext"].writer
        assert (encoder.PATH, encoder.DETAIL) == ("native", "native (C extension)")


def test_cltrace_native_0_forces_the_fallback() -> None:
    env = {k: v for k, v in os.environ.items() if k != "CLTRACE_NATIVE"}
    code = "from cltrace.export.perfetto import encoder; print(encoder.PATH, encoder.DETAIL)"
    out = subprocess.run([sys.executable, "-c", code], env=dict(env, CLTRACE_NATIVE="0"), capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "python python (fallback: CLTRACE_NATIVE=0)"


# ---- real PoCL batches -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def real_batches(reset: Any, kernels: Any, queue: Any, cl_ctx: Any) -> list[SpanBatch]:
    """Batches as the recorder delivers them for regions with queues, kernels, transfers with byte
    counts, a failed region, an out-of-order queue's lanes, a second thread, and a region still open
    at a flush, so its children come a batch before it."""
    reset()
    cap = Capture()
    host = np.ones(kernels.n, dtype=np.float32)
    # The resolver knows queues by address: a new queue at the address of a freed in-order one would
    # be taken for that one (no lanes). Take one at a fresh address, keeping the others alive meanwhile.
    tried = [cltrace.profiling_queue(cl_ctx, out_of_order=True)]
    while any(k[0] == tried[-1].int_ptr for k in RECORDER.resolver._queues) and len(tried) < 16:
        tried.append(cltrace.profiling_queue(cl_ctx, out_of_order=True))
    ooo = tried[-1]
    spin = kernels.kernel("spin")
    bufs = [cl.Buffer(cl_ctx, cl.mem_flags.READ_WRITE, 4 * kernels.n) for _ in range(4)]

    def worker() -> None:
        k = kernels.kernel("add")
        q2 = cltrace.profiling_queue(kernels.ctx)
        for _ in range(3):
            with cltrace.region("worker", q2):
                cltrace.launch(k, q2, (kernels.n,), None, kernels.a, kernels.b)
        q2.finish()

    with cltrace.trace():
        RECORDER.add_sink(cap)
        for _ in range(3):
            with cltrace.region("step", queue):
                with cltrace.region("fwd", queue):
                    kernels.launch_add(queue)
                    kernels.launch_spin(queue, iters=50)
                cltrace.copy(queue, kernels.a, host, "upload", is_blocking=True)  # named: pyopencl's hook leaves it
        with pytest.raises(ValueError):
            with cltrace.region("bad", queue):
                kernels.launch_add(queue)
                raise ValueError("boom")
        with cltrace.region("lanes", ooo):
            for i, buf in enumerate(bufs):
                cltrace.launch(spin, ooo, (kernels.n,), None, buf, np.int32(40 + 30 * i))
        ooo.finish()
        t = threading.Thread(target=worker, name="native-worker")
        t.start()
        t.join()
        with cltrace.region("open", queue):
            for _ in range(4):
                kernels.launch_add(queue)
            queue.finish()
            RECORDER.flush(block=True)  # the children go out now, their region with a later batch
            kernels.launch_add(queue)
    RECORDER.remove_sink(cap)
    return cap.batches


def test_native_and_python_write_the_same_file_for_real_batches(real_batches: list[SpanBatch], tmp_path: Any,
                                                                monkeypatch: Any) -> None:
    spans = [s for b in real_batches for s in b]
    by_id = {s.id: s for s in spans}
    batch_of = {s.id: i for i, b in enumerate(real_batches) for s in b}
    # The workload holds what it says it does.
    assert len(real_batches) >= 2
    assert {"step", "fwd", "add", "spin", "upload", "bad", "lanes", "worker", "open"} <= {s.name for s in spans}
    assert any(s.status == "error" for s in spans)
    assert len({s.thread for s in spans}) >= 2
    names = {t.id: t.name for t in RECORDER.tracks.tracks()}
    assert any("lane" in names[s.device_track] for s in spans if s.device_track)
    assert any(batch_of[s.parent] > batch_of[s.id] for s in spans if s.parent in by_id)
    data = assert_same_files(RECORDER, real_batches, tmp_path, monkeypatch)
    back = {s.id: s for s in load_pftrace(tmp_path / "native.pftrace")[0]}
    assert back.keys() == by_id.keys()
    for sid, s in by_id.items():
        b = back[sid]
        assert (b.name, b.cat, b.parent, b.status, b.error, b.host_begin, b.host_end) == (
            s.name, s.cat, s.parent, s.status, s.error, s.host_begin, s.host_end)
        assert (b.device_track, b.dev_start, b.dev_end, b.raw_start, b.raw_end) == (
            s.device_track, s.dev_start, s.dev_end, s.raw_start, s.raw_end)
    counters = [p for p in map(pb.TracePacket.FromString, timeless(data))
                if p.HasField("track_event") and p.track_event.type == pb.TrackEvent.TYPE_COUNTER]
    assert [p.track_event.counter_value for p in counters] == [4 * 4096 * k for k in (1, 2, 3)]


def test_native_writes_the_whole_file_python_writes_for_real_batches(real_batches: list[SpanBatch], tmp_path: Any,
                                                                     monkeypatch: Any) -> None:
    """A byte pin of whole files from real PoCL spans: with the sink's clocks frozen, the C pass and the numpy
    path (the writer as it was before the C pass) write the same file, every byte of it: clock snapshots,
    descriptors, interned data, packets, held rows written at close, counters and metadata."""
    meta = RECORDER.metadata()
    files = []
    for impl in (native(), None):
        with monkeypatch.context() as m:
            m.setattr(encoder, "NATIVE", impl)
            m.setattr(time, "monotonic_ns", lambda: 5 * 10**9)
            m.setattr(time, "clock_gettime_ns", lambda clock: 6 * 10**9)
            m.setattr(RECORDER, "now_ns", lambda: 7 * 10**9, raising=False)  # the sink reads it where it exists
            path = tmp_path / f"{len(files)}.pftrace"
            sink = PerfettoTraceSink(path)
            sink.start(RECORDER)
            for b in real_batches:
                sink.write(b)
            sink.flush(meta)
            sink.close(meta)
            files.append((path.read_bytes(), sink.packets_written, sink.bytes_written))
    (fast, fast_packets, fast_bytes), (slow, slow_packets, slow_bytes) = files
    assert fast == slow
    assert (fast_packets, fast_bytes) == (slow_packets, slow_bytes) == (fast_packets, len(fast))
    assert sum(1 for _ in iter_packets(fast)) > fast_packets > 4 * sum(b.n for b in real_batches) // 2


def test_the_sink_writes_through_the_c_pass_unless_disabled(tmp_path: Any) -> None:
    """Natively the sink makes no packet rows at all (``fused``); the numpy path runs whole otherwise."""
    sink = PerfettoTraceSink(tmp_path / "t.pftrace")
    sink.start(Recorder())
    assert (sink._fused is not None) == (not DISABLED)
    sink.close({})


# ---- generated batches: what PoCL rarely shows --------------------------------------------------
def generated(queue: Any, seed: int) -> tuple[Recorder, list[list[Span]]]:
    """Trees of regions and kernels on two threads and two queues, children delivered before parents
    in shuffled batches, raw - mapped offsets that change (recalibrations) and ENDs that do not follow,
    attributes of every kind, failures, equal timestamps and zero-length slices."""
    rng = random.Random(seed)
    rec = Recorder()
    ident = threading.get_ident()
    threads = [rec.tracks.host_thread(ident), rec.tracks.host_thread(ident + 1)]
    queues = [rec.tracks.device_queue(queue, ident), rec.tracks.device_queue(queue, ident + 1)]
    spans: list[Span] = []
    ids = iter(range(1, 10**7))
    clock = [10**12]
    offset = [rng.randrange(-10**6, 10**15)]

    def tick(hi: int = 40_000) -> int:
        clock[0] += rng.choice((0, 1, rng.randint(2, 200), rng.randint(200, hi)))
        return clock[0]

    def attrs() -> Any:
        return rng.choice((None, None, {"global_size": (4096,), "local_size": None}, {"bytes": rng.randint(1, 10**9)},
                           {"note": "é" * rng.randint(0, 300), "f": rng.random(), "big": -(1 << 62), "ok": True},
                           {"nested": {"a": [1, 2.5, "x"]}}))

    def tree(parent: int, depth: int, w: int) -> None:
        sid = next(ids)
        hb, ds = tick(), tick()
        if rng.random() < 0.1:
            offset[0] += rng.randint(-5_000, 5_000)
        off = offset[0]
        kids = len(spans)
        if depth < 3:
            for _ in range(rng.randint(0, 4)):
                tree(sid, depth + 1, w)
        he, de = tick(), tick()
        mine = [s for s in spans[kids:] if s.parent == sid and s.dev_start is not None]
        if mine:
            ds = min(ds, min(k.dev_start for k in mine))
            de = max(de, max(k.dev_end for k in mine))
        cat = "region" if depth < 3 else rng.choice(("kernel", "kernel", "transfer"))
        s = Span(sid, parent, f"n{depth}-{rng.randint(0, 2)}", cat, threads[w], hb, he, attrs=attrs())
        if rng.random() < 0.9:
            s.device_track = queues[w]
            s.dev_queued = s.dev_submit = s.dev_start = ds
            s.dev_end = de
            s.raw_start = ds + off
            s.raw_end = de + off + (rng.randint(-3, 3) if rng.random() < 0.2 else 0)
        if rng.random() < 0.05:
            s.status, s.error = "error", rng.choice(("", "ValueError: boom", "x" * 200))
        spans.append(s)

    for _ in range(60):
        tree(0, 0, rng.randrange(2))
    batches = []
    pos = 0
    while pos < len(spans):
        n = rng.randint(1, 40)
        b = spans[pos:pos + n]
        rng.shuffle(b)
        batches.append(b)
        pos += n
    return rec, batches


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_native_and_python_write_the_same_file_for_generated_batches(seed: int, queue: Any, tmp_path: Any,
                                                                     monkeypatch: Any) -> None:
    rec, batches = generated(queue, seed)
    data = assert_same_files(rec, batches, tmp_path, monkeypatch)
    assert any(pb.TracePacket.FromString(raw).timestamp_clock_id for raw in timeless(data)), \
        "a parent written after its children needs an absolute timestamp"
    spans = [s for b in batches for s in b]
    back = {s.id: s for s in load_pftrace(tmp_path / "native.pftrace")[0]}
    assert back.keys() == {s.id for s in spans}
    for s in spans:
        b = back[s.id]
        assert (b.host_begin, b.host_end, b.dev_start, b.dev_end, b.raw_start, b.raw_end, b.status) == (
            s.host_begin, s.host_end, s.dev_start, s.dev_end, s.raw_start, s.raw_end, s.status), s


def test_native_and_python_agree_on_call_sites_odd_attributes_and_parents_that_never_come(
        queue: Any, tmp_path: Any, monkeypatch: Any) -> None:
    """What the generated trees lack: call sites, some with callers (an interned source location in the
    name template, a "code.stacktrace" annotation); attribute values that neither hash nor compare
    (arrays); and more parents that never come than held groups are kept for (4096), so the oldest
    groups' rows go out early, in the order they were held."""
    rec, batches = generated(queue, 4)
    rng = random.Random(4)
    here = CallSite("app.py", 10, "main")
    sites = [here, CallSite("lib.py", 3, "f", callers=(here,)),
             CallSite("lib.py", 7, "g", callers=(here, CallSite("x.py", 1, "h")))]
    for b in batches:
        for s in b:
            if rng.random() < 0.5:
                s.site = rng.choice(sites)
            if rng.random() < 0.05:
                s.attrs = {"arr": np.arange(rng.randint(1, 4)), "n": 1}
    spans = [s for b in batches for s in b]
    th = spans[0].thread
    t = max(s.host_end for s in spans) + 1000
    orphans = [Span(10**8 + i, 10**9 + i, "orphan", "region", th, t + 10 * i, t + 10 * i + 5,
                    attrs={"k": i % 3} if i % 2 else None) for i in range(6000)]
    batches += [orphans[i:i + 1000] for i in range(0, len(orphans), 1000)]
    # neighbours with equal attributes in distinct dicts: one run of annotation bytes on both paths
    # (compared with ``!=``, as ``rows._extras`` does), {"flag": 1} after {"flag": True} included
    t += 10 * len(orphans)
    flags = [{"flag": True}, {"flag": 1}, {"flag": 1.0}, {"flag": 2}, {"flag": 2}, None, {"flag": 1}]
    batches.append([Span(2 * 10**8 + i, 0, "k", "kernel", th, t + 10 * i, t + 10 * i + 5, attrs=dict(f) if f else f)
                    for i, f in enumerate(flags)])
    assert_same_files(rec, batches, tmp_path, monkeypatch)
    back = {s.id for s in load_pftrace(tmp_path / "native.pftrace")[0]}
    assert back == {s.id for b in batches for s in b}


def test_native_and_python_agree_on_batches_of_strided_columns(queue: Any, tmp_path: Any, monkeypatch: Any) -> None:
    """Columns that are views with a stride (as a merged or sliced batch may hold) are read as they are."""
    rec, spans = generated(queue, 5)
    batches = []
    for part in spans:
        b = SpanBatch.from_spans(rec.tables, part)
        for name in NAMES:
            setattr(b, name, np.repeat(getattr(b, name), 2)[::2])
        assert not b.thread.flags.c_contiguous or b.n < 2
        batches.append(b)
    assert_same_files(rec, batches, tmp_path, monkeypatch)
    assert len(load_pftrace(tmp_path / "native.pftrace")[0]) == sum(len(p) for p in spans)


@pytest.mark.parametrize("length", [2, 3, 4])
def test_parents_in_a_cycle_go_as_the_numpy_path_takes_them(length: int, queue: Any, tmp_path: Any,
                                                            monkeypatch: Any) -> None:
    """Spans whose parents form a cycle (never from cltrace's own records): the numpy path's pointer
    doubling settles where the cycle's length is a power of 2 (the spans wait for nobody) and refuses
    the others; the C pass does the same, writing the same file or refusing on both paths."""
    rec, _ = generated(queue, 1)
    th = rec.tracks.host_thread(threading.get_ident())
    loop = [Span(i, i % length + 1, f"s{i}", "region", th, 10 + i, 30 - i) for i in range(1, length + 1)]
    batches = [[Span(99, 1, "child", "kernel", th, 15, 16)] + loop]
    if length & (length - 1):
        for impl in (native(), None):
            with pytest.raises(ValueError, match="cycle"):
                write_with(impl, rec, batches, str(tmp_path / "t.pftrace"), monkeypatch)
    else:
        assert_same_files(rec, batches, tmp_path, monkeypatch)


# ---- bytes per span ---------------------------------------------------------------------------------
def plain_kernels(queue: Any, n: int) -> tuple[Recorder, list[Span]]:
    """Launches back to back on one queue, timed like a busy device (as benchmarks/bench_perfetto.py)."""
    rec = Recorder()
    ident = threading.get_ident()
    th, dt = rec.tracks.host_thread(ident), rec.tracks.device_queue(queue, ident)
    rng = np.random.default_rng(1)
    t, d = 10**12, 10**12 + 20_000
    out = []
    for sid in range(1, n + 1):
        hb = t
        he = hb + int(rng.integers(2_000, 6_000))
        t = he + int(rng.integers(500, 3_000))
        ds = max(d, hb + 15_000)
        de = ds + int(rng.integers(5_000, 40_000))
        d = de + int(rng.integers(100, 1_000))
        out.append(Span(sid, 0, "saxpy", "kernel", th, hb, he, dt, ds - 3_000, ds - 1_000, ds, de,
                        ds + 1_234, de + 1_234))
    return rec, out


@pytest.mark.parametrize("path", ["native", "python"])
def test_a_plain_kernel_span_costs_at_most_60_bytes(path: str, queue: Any, tmp_path: Any, monkeypatch: Any) -> None:
    """Host and device slices and their flow, no attributes: 4 packets. Span ids below 2**14 (most of
    these) take 2-byte varints in the two flow ids; each later power of 2**7 adds 2 bytes per span
    (bench_perfetto.py's 200 000 spans: 60.5 B). It was 92 B with fixed64 flows, sequence flags on
    every packet, a category and "device.start" on every device slice."""
    impl = native() if path == "native" else None
    rec, spans = plain_kernels(queue, 20_000)
    empty = len(write_with(impl, rec, [], str(tmp_path / "empty.pftrace"), monkeypatch))
    full = write_with(impl, rec, [spans[i:i + 4096] for i in range(0, len(spans), 4096)],
                      str(tmp_path / "full.pftrace"), monkeypatch)
    per_span = (len(full) - empty) / len(spans)
    assert per_span <= 60, per_span
    back = load_pftrace(tmp_path / "full.pftrace")[0]
    assert [(s.raw_start, s.raw_end, s.dev_start, s.dev_end) for s in back] == [
        (s.raw_start, s.raw_end, s.dev_start, s.dev_end) for s in spans]


# ---- the C interface refuses what would read out of bounds ---------------------------------------
def test_native_writer_rejects_inconsistent_calls() -> None:
    """``_writer.Writer`` refuses, with a ValueError naming the cause, what would read out of bounds or
    against a batch it was not prepared for."""
    native()
    from cltrace._ext import writer as _writer
    from cltrace.export.perfetto.layout import strings
    from cltrace.export.perfetto.wire import ROW_CONSTANTS

    w = _writer.Writer()
    n = 3
    i64, z = np.arange(1, n + 1, dtype=np.int64), np.zeros(n, np.int64)
    cols = ([None, None, None], np.full(n, 1, np.int64), np.zeros(n, np.int8), np.full(n, -1, np.int32),
            np.zeros(n, np.int16), np.zeros(n, np.int32), z)
    pool = strings([*ROW_CONSTANTS, b"\x50\x02\x5a", *[b"\x22"] * 40, b"\x10\x01"])
    consts = np.arange(8, dtype=np.int64)
    lut = np.zeros(2, np.uint8)

    def write(hp: np.ndarray, **kw: Any) -> Any:
        args = dict(id=i64, parent=z, cat=np.zeros(n, np.int16), thread=np.full(n, 1, np.int64), host_begin=i64,
                    host_end=i64 + 1, track=z, dev_start=z, dev_end=z, raw_start=z, raw_end=z, leaf=lut, region=lut,
                    hpids=hp, dpids=np.zeros(0, np.int64), extras=[], counters=np.zeros((0, 5), np.int64))
        args.update(kw)
        return w.write(**args, pool=pool[0], pool_off=pool[1], pool_len=pool[2], consts=consts, mono=0)

    with pytest.raises(ValueError, match="prepare first"):
        write(np.zeros(1, np.int64))
    with pytest.raises(TypeError, match="missing keyword argument 'id'"):
        w.write()
    with pytest.raises(TypeError, match="missing keyword argument 'mono'"):
        w.write(id=i64, parent=z, cat=np.zeros(n, np.int16), thread=z, host_begin=z,
                host_end=z, track=z, dev_start=z, dev_end=z, raw_start=z, raw_end=z, leaf=lut, region=lut, hpids=z,
                dpids=z, extras=[], counters=np.zeros((0, 5), np.int64), pool=pool[0], pool_off=pool[1],
                pool_len=pool[2], consts=consts)
    with pytest.raises(TypeError):  # keyword-only
        w.write(i64)
    with pytest.raises(ValueError, match="thread must hold"):
        w.prepare(cols[0], np.ones(2, np.int64), *cols[2:], None, None)
    with pytest.raises(ValueError, match="out of range"):
        w.prepare(cols[0], np.full(n, 1 << 30, np.int64), *cols[2:], None, None)
    firsts, new, hmiss, dmiss = w.prepare(*cols, None, None)
    assert (firsts, new, len(hmiss), dmiss) == ([], [1], 1, [])
    w.track(1, 8, 9, 19, 29, 39)
    with pytest.raises(ValueError, match="hpids must hold"):
        write(np.zeros(2, np.int64))
    w.prepare(*cols, None, None)
    with pytest.raises(ValueError, match="pool id is out of range"):
        write(np.array([10**6], np.int64))
    w.prepare(*cols, None, None)
    data, runs, opened, rows = write(np.array([len(pool[2]) - 1], np.int64))
    assert (runs, opened, rows) == ([1], {1: 1}, 2 * n - 1)  # the latest END waits for the next write
    assert sum(1 for _ in iter_packets(data)) == rows


# ---- interned string values ---------------------------------------------------------------------
def test_repeated_string_attributes_are_interned_and_read_back_by_both_readers(queue: Any, tmp_path: Any,
                                                                               monkeypatch: Any) -> None:
    """A launch's program hash, error texts and other string attributes repeat on every span: each is
    written once per sequence (InternedData.debug_annotation_string_values) and referenced by
    ``string_value_iid``, as trace processor reads it; past ``MAX_STRING_VALUES`` distinct ones per
    sequence they are written inline. The general and the columnar reader give back the same values."""
    from cltrace.export.perfetto import tracks
    from cltrace.read import scan
    from cltrace.read.perfetto_columns import load_pftrace_columns

    monkeypatch.setattr(tracks, "MAX_STRING_VALUES", 8)
    rec, spans = plain_kernels(queue, 600)
    digest = "0c97f0f385cec1126bbf46209a69d57d0d092f8c446fc9f973099b1195af20d8"
    for i, s in enumerate(spans):
        s.attrs = {"program": digest, "global_size": [64, 64], "cache": "disk", "note": f"n{i % 20}"}
        if i % 7 == 0:
            s.status, s.error = "error", "ValueError: boom"
    plain = write_with(encoder.NATIVE, rec, [], str(tmp_path / "empty.pftrace"), monkeypatch)
    data = write_with(encoder.NATIVE, rec, [spans[i:i + 128] for i in range(0, len(spans), 128)],
                      str(tmp_path / "t.pftrace"), monkeypatch)
    packets = [pb.TracePacket.FromString(raw) for _, raw in iter_packets(data)]
    interned = [e.str for p in packets for e in p.interned_data.debug_annotation_string_values]
    assert interned.count(digest.encode()) == 1 and len(interned) == 8  # the cap, then inline
    anns = [a for p in packets if p.trusted_packet_sequence_id != META_SEQ for a in p.track_event.debug_annotations]
    assert sum(a.HasField("string_value_iid") for a in anns) >= 2 * len(spans)
    assert {a.string_value for a in anns if a.HasField("string_value")} == {f"n{i}" for i in range(20)} - {
        e.decode() for e in interned}
    assert (len(data) - len(plain)) / len(spans) < 60 + 13 + 3 * 7 + 5  # slices, shape, 3 interned strings, note

    general, _ = load_pftrace(tmp_path / "t.pftrace")
    assert [(s.attrs, s.status, s.error) for s in general] == [(s.attrs, s.status, s.error) for s in spans]
    if scan.NATIVE is None:
        return
    got = load_pftrace_columns(str(tmp_path / "t.pftrace"), scan.NATIVE)
    assert got is not None, "the scanner did not read a file in cltrace's layout"
    assert [(s.attrs, s.status, s.error) for s in got[0].spans()] == [(s.attrs, s.status, s.error) for s in spans]
