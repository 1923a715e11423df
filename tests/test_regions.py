"""Regions on real OpenCL: nesting (one thread and many), failures, tracing off, decorators."""
from __future__ import annotations

import threading
import time

import pytest

import cltrace
from cltrace.record import regions
from cltrace import read as tracefile
from cltrace.record.recorder import RECORDER


def _by_name(spans):
    out = {}
    for s in spans:
        out.setdefault(s.name, []).append(s)
    return out


def test_nested_regions_and_kernels_nest_on_host_and_device(tmp_path, queue, kernels, chrome):
    path = tmp_path / "t.json"
    with cltrace.trace(path):
        for _ in range(3):
            with cltrace.region("step", queue):
                with cltrace.region("fwd", queue):
                    kernels.launch_add(queue)
                    kernels.launch_spin(queue)
                with cltrace.region("bwd"):
                    kernels.launch_add(queue)
    tr = chrome.read(path)
    assert len(tr.placements()) == 3 * 6
    assert tr.misnested() == []
    assert tr.children_outside_parents() == []
    spans = _by_name(tracefile.load(path)[0])
    assert [s.source for s in spans["bwd"]] == ["host"] * 3
    assert all(s.source == "device" for name in ("step", "fwd", "add", "spin") for s in spans[name])
    assert {s.path for s in spans["add"]} == {("step", "fwd", "add"), ("step", "bwd", "add")}


def test_threads_get_own_host_tracks_and_nothing_misnests(tmp_path, cl_ctx, queue, kernels, chrome):
    n_threads, steps = 4, 3
    path = tmp_path / "threads.json"
    barrier = threading.Barrier(n_threads)
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            own = cltrace.profiling_queue(cl_ctx)
            add, spin = kernels.kernel("add"), kernels.kernel("spin")
            barrier.wait()
            for _ in range(steps):
                with cltrace.region(f"w{i}", own):
                    with cltrace.region("shared", queue):
                        kernels.launch_add(queue, add)
                        with cltrace.region("inner", queue):
                            kernels.launch_spin(queue, 50, spin)
                    with cltrace.region("own"):
                        kernels.launch_add(own, add)
                        kernels.launch_spin(own, 50, spin)
            own.finish()
        except BaseException as exc:
            errors.append(exc)

    with cltrace.trace(path):
        threads = [threading.Thread(target=work, args=(i,), name=f"worker-{i}") for i in range(n_threads)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert errors == []
    tr = chrome.read(path)
    assert tr.misnested() == []
    assert tr.children_outside_parents() == []

    placements = {k: pl for k, pl in tr.placements().items() if pl["host"]["cat"] != "sync"}  # own.finish()
    assert len(placements) == n_threads * steps * 8
    host_tids = {}
    for pl in placements.values():
        h = pl["host"]
        root = h
        while root["args"]["parent"]:
            root = placements[root["args"]["parent"]]["host"]
        host_tids.setdefault(root["name"], set()).add(h["tid"])
    assert all(len(tids) == 1 for tids in host_tids.values()), host_tids
    assert len({next(iter(t)) for t in host_tids.values()}) == n_threads

    names = tr.track_names()
    host_names = {names[(tr.host_pid, next(iter(tids)))] for tids in host_tids.values()}
    assert host_names == {f"worker-{i}" for i in range(n_threads)}

    # Work from several threads on the shared queue lands on one device track per thread.
    shared_tracks = {(placements[sid]["device"]["pid"], placements[sid]["device"]["tid"])
                     for sid, pl in placements.items() if pl["host"]["name"] == "shared"}
    assert len(shared_tracks) == n_threads
    assert len({names[t] for t in shared_tracks}) == n_threads


def test_exception_closes_region_marks_it_failed_and_propagates(tmp_path, queue, kernels):
    path = tmp_path / "fail.json"
    with cltrace.trace(path):
        with pytest.raises(ZeroDivisionError, match="division by zero"):
            with cltrace.region("outer", queue):
                with cltrace.region("bad", queue):
                    kernels.launch_add(queue)
                    1 / 0
        assert regions.current_parent() == (0, ())
        with cltrace.region("after", queue):
            kernels.launch_add(queue)
    spans = _by_name(tracefile.load(path)[0])
    for name in ("outer", "bad"):
        (s,) = spans[name]
        assert s.status == "error"
        assert s.error == "ZeroDivisionError: division by zero"
        assert s.source == "device"
    (after,) = spans["after"]
    assert after.status == "ok" and after.parent == 0 and after.path == ("after",)
    assert all(s.status == "ok" for s in spans["add"])
    stats = cltrace.PerfCounter().as_dict()
    assert stats["outer/bad"]["errors"] == 1 and stats["after"]["errors"] == 0


def test_decorated_function_failure_is_recorded_and_reraised(queue):
    @cltrace.region("decorated", queue)
    def boom() -> None:
        raise KeyError("k")

    cltrace.start()
    with pytest.raises(KeyError):
        boom()
    cltrace.stop()
    (s,) = RECORDER.spans()
    assert (s.name, s.status, s.error) == ("decorated", "error", "KeyError: 'k'")


def test_tracing_off_returns_shared_noop_and_records_nothing(queue, kernels):
    assert not cltrace.enabled()
    r = cltrace.timing_region("x", queue, {"size": 3})
    assert r is regions.NOOP
    assert cltrace.region("y") is regions.NOOP
    with r as inside:
        assert inside is regions.NOOP
        inside.set("k", 1)
        ev = kernels.launch_add(queue)
    ev.wait()
    assert ev.profile.end >= ev.profile.start
    with pytest.raises(RuntimeError):
        with cltrace.timing_region("z"):
            raise RuntimeError("propagates through the no-op")
    with RECORDER._lock:  # the worker cannot resolve it before it is counted
        cltrace.record_launch("manual", None, None, 1, 2)  # explicit recording still records
        assert len(RECORDER.pending) == 1
    RECORDER.clear()
    with cltrace.region("quiet", queue):
        kernels.launch_add(queue)
    assert len(RECORDER.pending) == 0
    assert RECORDER.spans() == []


@pytest.mark.parametrize("on_at_decoration", [False, True])
def test_decorator_works_whatever_the_state_at_decoration(on_at_decoration, queue, kernels):
    if on_at_decoration:
        cltrace.start()

    @cltrace.region("decorated_step")
    def step(x: int) -> int:
        kernels.launch_add(queue)
        return x + 1

    @cltrace.timing_region("decorated_dev", queue, {"tag": "t"})
    def dev_step() -> None:
        kernels.launch_add(queue)


    cltrace.stop()
    assert step(1) == 2  # off: runs, records nothing
    dev_step()
    assert RECORDER.spans() == []

    cltrace.start()
    assert step(2) == 3
    dev_step()
    cltrace.stop()
    spans = _by_name(RECORDER.spans())
    assert step.__name__ == "step"
    (s,) = spans["decorated_step"]
    assert s.source == "host" and s.path == ("decorated_step",)
    (d,) = spans["decorated_dev"]
    assert d.source == "device" and d.attrs == {"tag": "t"}
    assert sorted(k.path for k in spans["add"]) == [("decorated_dev", "add"), ("decorated_step", "add")]


def test_region_attributes_and_active_queue(tmp_path, queue, kernels, chrome):
    path = tmp_path / "attrs.json"
    cltrace.set_queue(queue)
    with cltrace.trace(path):
        with cltrace.region("r", None, {"batch": 8}) as r:
            r.set("loss", 0.5)
            kernels.launch_add(queue)
    tr_spans = _by_name(tracefile.load(path)[0])
    assert tr_spans["r"][0].source == "device"  # the active queue gave it device time
    x = [e for e in chrome.read(path).slices if e["name"] == "r"]
    assert len(x) == 2 and all(e["args"]["batch"] == 8 and e["args"]["loss"] == 0.5 for e in x)


def test_record_launch_without_queue_is_host_only(queue):
    cltrace.start()
    with cltrace.region("outer"):
        sid = cltrace.record_launch("copy", None, None, 100, 250, cat="transfer", attrs={"bytes": 4})
    cltrace.stop()
    spans = {s.id: s for s in RECORDER.spans()}
    s = spans[sid]
    assert (s.source, s.cat, s.host_ns, s.path, s.attrs) == ("host", "transfer", 150, ("outer", "copy"), {"bytes": 4})
    assert spans[s.parent].name == "outer"


def test_threads_that_reuse_an_ident_get_tracks_of_their_own(queue, kernels):
    # Threads started one after another usually get the same ident from glibc (checked here).
    def work(tag: str) -> None:
        with cltrace.region(tag):
            kernels.launch_add(queue)

    with cltrace.trace():
        for tag in ("first", "second", "third"):
            t = threading.Thread(target=work, args=(tag,), name=f"worker-{tag}")
            t.start()
            t.join()
    spans = RECORDER.spans()
    regions_by_name = {s.name: s for s in spans if s.cat == "region"}
    tracks = {name: s.thread for name, s in regions_by_name.items()}
    assert len(set(tracks.values())) == 3
    for name, track in tracks.items():
        assert RECORDER.tracks.get(track).name == f"worker-{name}"
    for k in (s for s in spans if s.cat == "kernel"):
        assert k.thread == regions_by_name[k.path[0]].thread


def test_launch_names_pyopencl_kernels_right_when_many_are_remembered_and_forgets_them_at_stop(queue):
    import pyopencl as cl

    from cltrace.record import regions

    src = "".join(f"__kernel void k{i}(__global float *x) {{ x[0] = {i}; }}\n" for i in range(70))
    prg = cl.Program(queue.context, src).build()
    buf = cl.Buffer(queue.context, cl.mem_flags.READ_WRITE, 64)
    kernels = [getattr(prg, f"k{i}") for i in range(70)]  # more than launch remembers at once
    with cltrace.trace():
        for k in kernels + kernels[::-1]:
            cltrace.launch(k, queue, (1,), None, buf)
        assert 0 < len(regions._KERNELS) <= regions._KERNELS_MAX
    names = [s.name for s in RECORDER.spans() if s.cat == "kernel"]
    assert names == [f"k{i}" for i in range(70)] + [f"k{i}" for i in reversed(range(70))]
    assert regions._KERNELS == {}


def test_a_projected_region_spans_its_commands(tmp_path, cl_ctx, queue, kernels, region_mode):
    """Projected, a region enqueues nothing: its device span runs from the START of the first command it launched
    on its queue (nested regions' included, host-only ones too) to the END of the last, exactly; commands on
    another queue do not widen it; a region that launched nothing has a host span only. With markers (the
    ``timed`` one), its span starts no later than its first command and ends no earlier than its last."""
    other = cltrace.profiling_queue(cl_ctx)
    region_mode("projected")
    with cltrace.trace(tmp_path / "p.json", quiet=True):
        with cltrace.region("step", queue):
            with cltrace.region("host-only"):
                kernels.launch_spin(queue, 200)
            with cltrace.region("fwd", queue):
                kernels.launch_spin(other, 200)
                kernels.launch_add(queue)
            kernels.launch_add(queue)
            with cltrace.region("idle", queue):
                pass
        with cltrace.region("elsewhere", queue):
            kernels.launch_add(other)
        cltrace.configure(regions="markers")
        with cltrace.timing_region("timed", queue):
            kernels.launch_spin(queue, 200)
        queue.finish()
        other.finish()
    spans = sorted(RECORDER.spans(), key=lambda s: s.host_begin)
    by = _by_name(spans)
    step, fwd = by["step"][0], by["fwd"][0]
    spin_q, spin_other, spin_timed = by["spin"]
    add_fwd, add_step, add_other = by["add"]
    assert step.dev_start == spin_q.dev_start  # its first command, launched in a host-only child
    assert step.dev_end == add_step.dev_end  # its last command on the queue, launched outside any child
    # exactly its one command on the queue: the other queue's spin did not widen it (where that spin ran, beside
    # it on a CPU device or not, is the device's business)
    assert (fwd.dev_start, fwd.dev_end) == (add_fwd.dev_start, add_fwd.dev_end) and spin_other.dev_start is not None
    assert by["idle"][0].dev_start is None and by["idle"][0].source == "host"
    elsewhere = by["elsewhere"][0]  # its thread's last command went to another queue: one marker ends it
    assert elsewhere.source == "device" and elsewhere.dev_start >= add_step.dev_end
    timed = by["timed"][0]
    assert timed.dev_start <= spin_timed.dev_start and timed.dev_end >= spin_timed.dev_end


def test_regions_project_by_default_only_where_every_enqueue_is_traced(queue, region_mode):
    """``auto``: projected while pyopencl is instrumented (every enqueue is seen), markers otherwise; a mode
    cltrace does not know is one ValueError naming the choices."""
    region_mode("auto")
    assert regions.region_mode() == "auto (markers)"
    cltrace.instrument()
    try:
        assert regions.region_mode() == "auto (projected)"
        with cltrace.trace(quiet=True):
            with cltrace.region("r", queue) as r:
                assert r.project
    finally:
        cltrace.uninstrument()
    assert regions.region_mode() == "auto (markers)"
    with pytest.raises(ValueError, match="auto, projected, markers"):
        cltrace.configure(regions="nvtx")


def test_a_region_resolves_after_every_earlier_record_of_its_thread(tmp_path, cl_ctx, queue, kernels, region_mode,
                                                                    chrome):
    """A projected region's device span is widened from its children's. Resolved before a child whose command
    completed later (on another queue here; on one queue, read a moment before the region's own last command
    was), the child's extent came too late and an outer region on the child's track began after the child:
    CI saw this once with four threads sharing a queue. A region waits for every earlier record of its thread."""
    import pyopencl as cl

    other = cltrace.profiling_queue(cl_ctx)
    gate = cl.UserEvent(cl_ctx)
    region_mode("projected")
    path = tmp_path / "gate.json"
    with cltrace.trace(path, quiet=True):
        with cltrace.region("outer", queue):
            with cltrace.region("inner", other):
                gated = kernels.kernel("add")
                gated.set_args(kernels.a, kernels.b)
                cl.enqueue_nd_range_kernel(queue, gated, (kernels.n,), None, wait_for=[gate])
                kernels.launch_add(other)
        other.finish()
        for _ in range(500):  # until inner's last command reads complete (its gated sibling cannot)
            RECORDER.flush(block=False)
            if not [r for r in RECORDER.resolver.waiting + list(RECORDER.pending) if r[1] == "add" and r[8] is other]:
                break
            time.sleep(0.01)
        gate.set_status(cl.command_execution_status.COMPLETE)
        queue.finish()
    tr = chrome.read(path)
    assert tr.children_outside_parents() == []
    assert len(RECORDER.resolver._extents) == 0  # no child's extent left behind for a region already resolved
