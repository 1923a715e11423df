"""LaunchProfile on real OpenCL (PoCL): first and later launches, compile kept apart from kernel
time, accumulation over reused profiles, launches nested in regions (Chrome JSON), and traced
launches from another thread under the recorder's back-pressure."""
from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pyopencl as cl
import pytest

import cltrace
from cltrace.record import regions
from cltrace.programs.compiler import ProgramCache, default_cache
from cltrace.errors import CltraceError, ProfilingNotEnabledError
from cltrace.record.recorder import RECORDER

from conftest import KERNEL_SOURCE as SOURCE  # noqa: E402  (tests/ is on sys.path under pytest)
N = 1024


@pytest.fixture(autouse=True)
def cache_dir(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLTRACE_CACHE_DIR", str(tmp_path / "cache"))
    default_cache().clear()


@pytest.fixture()
def bufs(cl_ctx: Any) -> tuple[Any, Any]:
    mf = cl.mem_flags
    host = np.ones(N, np.float32)
    return (cl.Buffer(cl_ctx, mf.READ_WRITE | mf.COPY_HOST_PTR, hostbuf=host),
            cl.Buffer(cl_ctx, mf.READ_WRITE | mf.COPY_HOST_PTR, hostbuf=host))


def stamps(ev: Any) -> tuple[int, int, int, int]:
    ev.wait()
    p = ev.profile
    return p.queued, p.submit, p.start, p.end


def test_first_launch_carries_compile_apart_from_kernel_time(cl_ctx: Any, queue: Any, bufs: Any,
                                                             tmp_path: Any) -> None:
    a, b = bufs
    with cltrace.trace():
        prg = cltrace.compile(SOURCE, context=cl_ctx, cache=ProgramCache(tmp_path / "p"))
        first = cltrace.LaunchProfile()
        ev = prg.add[N, 64, queue](a, b, profile=first)
        later = cltrace.LaunchProfile()
        ev2 = prg.add[N, 64, queue](a, b, profile=later)
    assert first.event is ev and later.event is ev2
    assert prg.cache_hit == "miss" and first.from_cache is False and later.from_cache is False
    # The compile is reported apart: charged to the first launch only, never inside kernel time.
    assert first.compile_ns >= prg.compile_ns > 0
    assert later.compile_ns == 0
    for p, e in ((first, ev), (later, ev2)):
        q, s, st, en = stamps(e)
        assert p.device_stamps == (q, s, st, en)
        assert p.kernel_ns == en - st
        assert p.queued_ns <= p.submit_ns <= p.start_ns <= p.end_ns
        assert p.end_ns - p.start_ns == p.kernel_ns
        assert p.enqueue_ns == p.host_end_ns - p.host_begin_ns > 0
        assert p.count == 1 and p.total_ns == p.kernel_ns
    spans = RECORDER.spans()
    compile_top = next(s for s in spans if s.cat == "compile" and s.name.startswith("compile "))
    kernel = [s for s in spans if s.cat == "kernel"]
    assert [k.device_ns for k in kernel] == [first.kernel_ns, later.kernel_ns]
    # Host timeline: the compile ended before the first launch's enqueue began, and the
    # profile's mapped stamps are the span's device placement.
    assert compile_top.host_end <= first.host_begin_ns
    assert (kernel[0].dev_start, kernel[0].dev_end) == (first.start_ns, first.end_ns)
    assert kernel[0].host_begin == first.host_begin_ns and kernel[0].host_end == first.host_end_ns


def test_cache_hit_launch_reports_from_cache(cl_ctx: Any, queue: Any, bufs: Any) -> None:
    cltrace.compile(SOURCE, context=cl_ctx)
    prg = cltrace.compile(SOURCE, context=cl_ctx)
    p = cltrace.LaunchProfile()
    prg.add(queue, (N,), None, *bufs, profile=p)
    assert prg.cache_hit == "memory" and p.from_cache is True
    assert p.compile_ns >= prg.compile_ns and p.kernel_ns > 0


def test_reused_profile_accumulates_and_keeps_last_launch_fields(cl_ctx: Any, queue: Any, bufs: Any) -> None:
    prg = cltrace.compile(SOURCE, context=cl_ctx)
    a, _ = bufs
    p = cltrace.LaunchProfile()
    assert p.count == 0 and p.total_ns == 0 and p.mean_ns is None and p.min_ns is None
    with pytest.raises(CltraceError, match="no launch recorded"):
        p.kernel_ns
    events = []
    for iters in (10, 400, 50, 2000, 5):
        events.append(prg.spin[N, None, queue](a, np.int32(iters), profile=p))
        if iters == 50:
            assert p.count == 3 and p.kernel_ns == stamps(events[-1])[3] - stamps(events[-1])[2]
    ns = [stamps(e)[3] - stamps(e)[2] for e in events]
    assert p.count == 5
    assert p.total_ns == sum(ns)
    assert p.min_ns == min(ns) and p.max_ns == max(ns)
    assert p.mean_ns == pytest.approx(sum(ns) / 5)
    assert p.event is events[-1] and p.kernel_ns == ns[-1]
    assert p.compile_ns == 0, "only a kernel's first launch carries the compile"
    d = p.as_dict()
    assert d["count"] == 5 and d["total_ns"] == sum(ns) and d["kernel_ns"] == ns[-1]
    p.reset()
    assert p.count == 0 and p.total_ns == 0 and p.event is None
    prg.spin[N, None, queue](a, np.int32(3), profile=p)
    assert p.count == 1 and p.total_ns == p.kernel_ns


def test_reading_a_field_waits_for_that_launch_only(cl_ctx: Any, queue: Any, bufs: Any) -> None:
    prg = cltrace.compile(SOURCE, context=cl_ctx)
    a, b = bufs
    p = cltrace.LaunchProfile()
    prg.add[N, None, queue](a, b, profile=p)
    gate = cl.UserEvent(cl_ctx)  # holds what follows on the in-order queue, however fast the device
    cl.enqueue_marker(queue, wait_for=[gate])
    slow = prg.spin[N, None, queue](a, np.int32(200_000))
    safety = threading.Timer(30, gate.set_status, (cl.command_execution_status.COMPLETE,))
    safety.start()  # a read that waited for the queue fails the test instead of hanging it
    try:
        assert p.kernel_ns > 0
        assert slow.command_execution_status != cl.command_execution_status.COMPLETE
    finally:
        safety.cancel()
        gate.set_status(cl.command_execution_status.COMPLETE)
    slow.wait()


def test_profile_needs_a_profiling_queue(cl_ctx: Any, plain_queue: Any, bufs: Any) -> None:
    prg = cltrace.compile(SOURCE, context=cl_ctx)
    p = cltrace.LaunchProfile()
    with pytest.raises(ProfilingNotEnabledError, match="PROFILING_ENABLE"):
        prg.add[N, None, plain_queue](*bufs, profile=p)
    with pytest.raises(ProfilingNotEnabledError):
        prg.add(plain_queue, (N,), None, *bufs, profile=p)
    assert p.count == 0
    prg.add[N, None, plain_queue](*bufs).wait()  # no profile asked: fine


def test_launches_nest_in_regions_with_flows(cl_ctx: Any, queue: Any, bufs: Any, tmp_path: Any,
                                             chrome: Any) -> None:
    prg = cltrace.compile(SOURCE, context=cl_ctx)
    a, b = bufs
    out = tmp_path / "t.json"
    p = cltrace.LaunchProfile()
    with cltrace.trace(str(out)):
        with cltrace.region("step", queue):
            with cltrace.region("fwd", queue):
                prg.add[N, 64, queue](a, b, profile=p)
                prg.spin[N, None, queue](a, np.int32(100))
            prg.add(queue, (N,), None, a, b)
    tr = chrome.read(out)
    assert not tr.misnested()
    assert not tr.children_outside_parents()
    pl = tr.placements()
    by_name: dict[str, list[int]] = {}
    for sid, where in pl.items():
        by_name.setdefault(where["host"]["name"], []).append(sid)
    (step,), (fwd,) = by_name["step"], by_name["fwd"]
    adds, (spin,) = sorted(by_name["add"]), by_name["spin"]
    assert pl[fwd]["host"]["args"]["parent"] == step
    assert [pl[s]["host"]["args"]["parent"] for s in adds] == [fwd, step]
    assert pl[spin]["host"]["args"]["parent"] == fwd
    for sid in (*adds, spin):
        assert pl[sid]["device"]["args"]["source"] == "device"
        assert pl[sid]["host"]["cat"] == "kernel"
    # One flow per launch, from the host slice to the device slice; none for regions.
    starts = {e["id"]: e for e in tr.events if e.get("ph") == "s"}
    ends = {e["id"]: e for e in tr.events if e.get("ph") == "f"}
    assert set(starts) == set(ends) == {*adds, spin}
    for sid in starts:
        assert (starts[sid]["pid"], starts[sid]["tid"]) == (pl[sid]["host"]["pid"], pl[sid]["host"]["tid"])
        assert (ends[sid]["pid"], ends[sid]["tid"]) == (pl[sid]["device"]["pid"], pl[sid]["device"]["tid"])
    # The profile's device interval is the first add's device slice.
    dev = pl[adds[0]]["device"]
    b0, e0 = tr.interval(dev)
    assert abs((e0 - b0) - p.kernel_ns) <= 1
    assert abs(b0 - (p.start_ns - RECORDER.start_ns)) <= 1


def test_traced_launches_keep_back_pressure_and_their_thread(cl_ctx: Any, queue: Any, plain_queue: Any,
                                                            bufs: Any) -> None:
    """The launcher appends its records to the recorder itself: same cap, same thread, same fields."""
    prg = cltrace.compile(SOURCE, context=cl_ctx)
    a, b = bufs
    RECORDER.configure(max_pending=16)
    outstanding = 0
    worker: list[int] = []

    def launch_many() -> None:
        nonlocal outstanding
        worker.append(regions.thread_key())
        with cltrace.region("batch"):
            for _ in range(40):
                prg.add[N, 64, queue](a, b)
                prg.add[N, 64, plain_queue](a, b)
                outstanding = max(outstanding, len(RECORDER.pending) + len(RECORDER.resolver.waiting))

    with cltrace.trace():
        t = threading.Thread(target=launch_many, name="launch-worker")
        t.start()
        t.join()
    assert outstanding <= RECORDER.hard_cap and RECORDER.lost == 0
    spans = RECORDER.spans()
    (batch,) = [s for s in spans if s.cat == "region"]
    kernels = [s for s in spans if s.cat == "kernel"]
    assert len(kernels) == 80 and len({s.id for s in kernels}) == 80
    assert RECORDER.tracks.get(batch.thread).name == "launch-worker"
    assert RECORDER.tracks.host_thread(worker[0]) == batch.thread
    for s in kernels:
        assert (s.name, s.parent, s.path, s.thread) == ("add", batch.id, ("batch", "add"), batch.thread)
        assert s.attrs["global_size"] == [N] and s.attrs["local_size"] == [64]
    device = [s for s in kernels if s.source == "device"]
    host = [s for s in kernels if s.source == "host"]
    assert len(device) == len(host) == 40
    assert all(s.attrs["cltrace.device_time"].startswith("unavailable") for s in host)
    assert not any("cltrace.device_time" in s.attrs for s in device)


def test_launcher_held_from_before_the_first_launch(cl_ctx: Any, queue: Any, bufs: Any, tmp_path: Any) -> None:
    """``launch = knl[gs, ls, q]`` taken before any launch: only its first call carries the compile,
    and a first launch made untraced and unprofiled still uses the charge up."""
    a, b = bufs
    prg = cltrace.compile(SOURCE, context=cl_ctx, cache=ProgramCache(tmp_path / "p"))
    held, other = prg.add[N, 64, queue], prg.add[N, None, queue]
    profiles = [cltrace.LaunchProfile() for _ in range(3)]
    for p in profiles:
        held(a, b, profile=p)
    assert profiles[0].compile_ns >= prg.compile_ns > 0
    assert [p.compile_ns for p in profiles[1:]] == [0, 0]
    p = cltrace.LaunchProfile()
    other(a, b, profile=p)
    assert p.compile_ns == 0

    prg2 = cltrace.compile(SOURCE.replace("add", "add2"), context=cl_ctx, cache=ProgramCache(tmp_path / "q"))
    first, second = prg2.add2[N, None, queue], prg2.add2[N, 64, queue]
    first(a, b)  # untraced, unprofiled: the compile is charged here, to no one
    p = cltrace.LaunchProfile()
    second(a, b, profile=p)
    queue.finish()
    assert p.compile_ns == 0 and p.kernel_ns > 0


def test_traced_launches_bind_changing_arguments_every_time_and_skip_only_repeats(
        cl_ctx: Any, queue: Any, tmp_path: Any) -> None:
    """A traced kernel launched on other buffers each time (a training step's GEMM) binds every launch
    and, after enough misses, stops remembering arguments it never sees again; one whose arguments repeat
    skips the rebinding, before and after such a phase. The device's results prove the binding."""
    mf = cl.mem_flags
    outs = [cl.Buffer(cl_ctx, mf.READ_WRITE | mf.COPY_HOST_PTR, hostbuf=np.zeros(N, np.float32)) for _ in range(3)]
    ones = cl.Buffer(cl_ctx, mf.READ_WRITE | mf.COPY_HOST_PTR, hostbuf=np.ones(N, np.float32))
    knl = cltrace.compile(SOURCE, context=cl_ctx).add
    binds = []
    real = knl._set
    knl._set = lambda k, *a: (binds.append(a), real(k, *a))[1]
    cltrace.start(str(tmp_path / "t.json"), quiet=True)
    try:
        for _ in range(3):
            knl(queue, (N,), None, outs[0], ones)
        assert len(binds) == 1  # repeats skip the binding
        for i in range(60):  # changing arguments: each launch binds, whatever is remembered
            knl(queue, (N,), None, outs[i % 3], ones)
        assert len(binds) == 60  # (the first is a repeat of outs[0])
        assert knl._last is None  # gave up remembering them
        for _ in range(70):  # the same arguments again: remembered at the next 64th bind at the latest
            knl(queue, (N,), None, outs[1], ones)
        assert 60 + 2 <= len(binds) <= 60 + 64
        assert knl._last is not None
    finally:
        cltrace.stop()
    got = [np.empty(N, np.float32) for _ in outs]
    for o, h in zip(outs, got):
        cl.enqueue_copy(queue, h, o)
    queue.finish()
    assert [h[0] for h in got] == [3 + 20, 20 + 70, 20]
