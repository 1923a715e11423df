"""The C region (``cltrace._ext.region``) against the Python fallback (``regions._Region``): the same
scenarios give the same raw records (fields, nesting, paths, thread keys, errors, back-pressure),
and both share the thread's stack, the id counter and the recorder's deque, so they mix freely.

The native tests fail, not skip, when the extension is not active: CI must exercise both paths.
Only ``CLTRACE_NATIVE=0`` (the fallback-only run) skips them.
"""
from __future__ import annotations

import gc
import os
import subprocess
import sys
import threading
import time
from typing import Any, Callable

import pyopencl as cl
import pytest

import cltrace
from cltrace.record import regions
from cltrace.record.recorder import RECORDER, new_id
from cltrace.timeline import stamps
from cltrace.timeline.raw import (R_ATTRS, R_CAT, R_ERROR, R_EV0, R_EV1, R_HB, R_HE, R_ID, R_NAME, R_PARENT, R_PATH,
                                  R_QUEUE, R_SITE, R_STATUS, R_THREAD)
from cltrace.timeline.sites import describe
from cltrace.timeline.spans import SYNC

DISABLED = os.environ.get("CLTRACE_NATIVE", "").strip() == "0"


def native() -> Any:
    """The C region type; fails (does not skip) where it should be active and is not."""
    if DISABLED:
        pytest.skip("CLTRACE_NATIVE=0: fallback-only run")
    if regions._NativeRegion is None:
        pytest.fail(f"the C region is not active ({regions.REGION_WHY}): reinstall with "
                    "`pip install -e .` where a C compiler exists, or run with CLTRACE_NATIVE=0")
    return regions._NativeRegion


@pytest.fixture(params=["native", "python"])
def impl(request: Any, monkeypatch: pytest.MonkeyPatch) -> str:
    """Select the region implementation ``timing_region`` and friends hand out, as import would."""
    if request.param == "native":
        kind = native()
        monkeypatch.setattr(regions, "_NativeRegion", kind)
        monkeypatch.setattr(regions, "_RegionType", kind)
    else:
        monkeypatch.setattr(regions, "_NativeRegion", None)
        monkeypatch.setattr(regions, "_RegionType", regions._Region)
    return request.param


def recorded(scenario: Callable[[], Any]) -> list[tuple]:
    """Raw records a scenario appends, taken before the resolver sees them (it waits for the lock)."""
    cltrace.start()
    try:
        with RECORDER._lock:
            before = len(RECORDER.pending)
            scenario()
            return [r for r in list(RECORDER.pending)[before:] if r[R_CAT] != SYNC]  # pyopencl's finish/wait
    finally:
        cltrace.stop()


def event_kind(ev: Any) -> str:
    """"Event" for a pyopencl Event and for the reaper's ticket standing for one (native path)."""
    if type(ev) is int:
        assert stamps.REAPER is not None
        return "Event"
    return type(ev).__name__


def normal(recs: list[tuple], threads: dict[int, str] | None = None) -> list[tuple]:
    """Records with ids ranked (0 is the root), thread keys named, clocks checked and dropped; each
    call site checked to be test code (the lines themselves: test_callsite.py)."""
    rank = {0: 0}
    for rec in sorted(recs, key=lambda r: r[R_ID]):
        rank[rec[R_ID]] = len(rank)
    names = {regions.thread_key(): "main", **(threads or {})}
    out = []
    for rec in recs:
        assert len(rec) == 15
        assert isinstance(rec[R_HB], int) and isinstance(rec[R_HE], int) and rec[R_HB] <= rec[R_HE]
        out.append((rec[R_CAT], rec[R_NAME], rank[rec[R_ID]], rank[rec[R_PARENT]], rec[R_PATH],
                    names[rec[R_THREAD]], rec[R_QUEUE] is not None, event_kind(rec[R_EV0]),
                    event_kind(rec[R_EV1]), rec[R_ATTRS], rec[R_STATUS], rec[R_ERROR]))
        site = describe(rec[R_SITE])
        assert site is not None and os.path.dirname(site.file) == os.path.dirname(__file__), (rec[R_NAME], site)
    return out


def within(recs: list[tuple]) -> None:
    """Every child's host bracket lies inside its parent's."""
    by_id = {r[R_ID]: r for r in recs}
    for r in recs:
        p = by_id.get(r[R_PARENT])
        if p is not None:
            assert p[R_HB] <= r[R_HB] <= r[R_HE] <= p[R_HE], (p[R_NAME], r[R_NAME])


class Odd(Exception):
    def __str__(self) -> str:
        return "odd <text>"


def nested_failing_and_decorated() -> None:
    shared = {"a": 1}
    with cltrace.region("outer", attrs=shared) as outer:
        outer.set("b", 2)
        with cltrace.region("inner") as inner:
            inner.set("k", "v")
            t = time.perf_counter_ns()
            regions.record_launch("host-only", None, None, t, t)
        for exc in (ValueError("boom"), KeyError("key"), Odd(), OSError(2, "gone")):
            try:
                with cltrace.region("fails"):
                    with cltrace.region("deeper"):
                        raise exc
            except type(exc):
                pass
    assert shared == {"a": 1, "b": 2}  # set() writes into the caller's dict, as it always has

    @cltrace.region("decorated", attrs={"d": 1})
    def f(x: int) -> int:
        with cltrace.region("body"):
            return x + 1

    assert f(1) == 2 and f(2) == 3
    with regions.category_region("trial", cat="trial", attrs={"t": 0}):
        pass


EXPECTED_NESTED = [
    ("kernel", "host-only", 3, 2, ("outer", "inner"), "main", False, "NoneType", "NoneType", None, None, None),
    ("region", "inner", 2, 1, ("outer", "inner"), "main", False, "NoneType", "NoneType", {"k": "v"}, None, None),
    ("region", "deeper", 5, 4, ("outer", "fails", "deeper"), "main", False, "NoneType", "NoneType", None,
     "error", "ValueError: boom"),
    ("region", "fails", 4, 1, ("outer", "fails"), "main", False, "NoneType", "NoneType", None,
     "error", "ValueError: boom"),
    ("region", "deeper", 7, 6, ("outer", "fails", "deeper"), "main", False, "NoneType", "NoneType", None,
     "error", "KeyError: 'key'"),
    ("region", "fails", 6, 1, ("outer", "fails"), "main", False, "NoneType", "NoneType", None,
     "error", "KeyError: 'key'"),
    ("region", "deeper", 9, 8, ("outer", "fails", "deeper"), "main", False, "NoneType", "NoneType", None,
     "error", "Odd: odd <text>"),
    ("region", "fails", 8, 1, ("outer", "fails"), "main", False, "NoneType", "NoneType", None,
     "error", "Odd: odd <text>"),
    ("region", "deeper", 11, 10, ("outer", "fails", "deeper"), "main", False, "NoneType", "NoneType", None,
     "error", "FileNotFoundError: [Errno 2] gone"),
    ("region", "fails", 10, 1, ("outer", "fails"), "main", False, "NoneType", "NoneType", None,
     "error", "FileNotFoundError: [Errno 2] gone"),
    ("region", "outer", 1, 0, ("outer",), "main", False, "NoneType", "NoneType", {"a": 1, "b": 2}, None, None),
    ("region", "body", 13, 12, ("decorated", "body"), "main", False, "NoneType", "NoneType", None, None, None),
    ("region", "decorated", 12, 0, ("decorated",), "main", False, "NoneType", "NoneType", {"d": 1}, None, None),
    ("region", "body", 15, 14, ("decorated", "body"), "main", False, "NoneType", "NoneType", None, None, None),
    ("region", "decorated", 14, 0, ("decorated",), "main", False, "NoneType", "NoneType", {"d": 1}, None, None),
    ("trial", "trial", 16, 0, ("trial",), "main", False, "NoneType", "NoneType", {"t": 0}, None, None),
]


def test_the_active_path_is_native_unless_disabled() -> None:
    if DISABLED:
        assert (regions.REGION_PATH, regions.REGION_WHY, regions._NativeRegion) == ("python", "CLTRACE_NATIVE=0", None)
        assert regions.REGION_DETAIL == "python (fallback: CLTRACE_NATIVE=0)"
    else:
        assert native() is regions._RegionType
        assert (regions.REGION_PATH, regions.REGION_WHY, regions.REGION_DETAIL) == ("native", "", "native (C extension)")


@pytest.mark.parametrize("value, path", [("0", "python CLTRACE_NATIVE=0"), ("1", "native ")])
def test_cltrace_native_selects_the_path_at_import(value: str, path: str) -> None:
    if value == "1":
        native()
    code = "from cltrace.record import regions as r; print(r.REGION_PATH, r.REGION_WHY)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, CLTRACE_NATIVE=value))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.rstrip("\n") == path


def test_region_type_follows_the_path(impl: str) -> None:
    cltrace.start()
    r = cltrace.region("x")
    assert type(r) is (regions._Region if impl == "python" else native())
    assert (r.name, r.queue, r.attrs, r.cat) == ("x", None, None, "region")


def test_nesting_failures_attrs_and_decorators_record_the_same(impl: str) -> None:
    recs = recorded(nested_failing_and_decorated)
    assert normal(recs) == EXPECTED_NESTED
    within(recs)


def test_ids_are_unique_and_increasing_across_c_and_python_regions() -> None:
    kind = native()

    def mixed() -> None:
        with kind("c1"):
            with regions._Region("p1", None, None, "region"):
                ids.append(new_id())
                with kind("c2"):
                    t = time.perf_counter_ns()
                    regions.record_launch("launch", None, None, t, t)
            with kind("c3", None, {"x": 1}, "trial"):
                with regions._Region("p2", None, None, "region"):
                    pass

    ids: list[int] = []
    recs = recorded(mixed)
    by_name = {r[R_NAME]: r for r in recs}
    order = ["c1", "p1", "c2", "launch", "c3", "p2"]  # the order they opened in
    opened = [by_name[n][R_ID] for n in order]
    assert opened == sorted(opened) and len(set(opened)) == len(opened)
    assert by_name["p1"][R_ID] < ids[0] < by_name["c2"][R_ID]  # one counter: new_id() draws between them
    parents = {n: next((p for p in order if by_name[p][R_ID] == by_name[n][R_PARENT]), None) for n in order}
    assert parents == {"c1": None, "p1": "c1", "c2": "p1", "launch": "c2", "c3": "c1", "p2": "c3"}
    assert by_name["launch"][R_PATH] == ("c1", "p1", "c2")  # a launch carries its parent's path
    assert by_name["p2"][R_PATH] == ("c1", "c3", "p2")
    assert by_name["c3"][R_CAT] == "trial" and by_name["c3"][R_ATTRS] == {"x": 1}
    assert {r[R_THREAD] for r in recs} == {regions.thread_key()}
    within(recs)
    assert regions._tls.stack == []


def out_of_order() -> None:
    a = cltrace.region("a")
    b = cltrace.region("b")
    a.__enter__()
    b.__enter__()
    a.__exit__(None, None, None)  # closed under b: removed wherever it is
    with cltrace.region("under-b"):
        pass
    b.__exit__(ValueError, ValueError("late"), None)
    with cltrace.region("top"):
        pass
    assert regions._tls.stack == []


def test_out_of_order_close_records_the_same(impl: str) -> None:
    assert normal(recorded(out_of_order)) == [
        ("region", "a", 1, 0, ("a",), "main", False, "NoneType", "NoneType", None, None, None),
        ("region", "under-b", 3, 2, ("a", "b", "under-b"), "main", False, "NoneType", "NoneType", None, None, None),
        ("region", "b", 2, 1, ("a", "b"), "main", False, "NoneType", "NoneType", None, "error", "ValueError: late"),
        ("region", "top", 4, 0, ("top",), "main", False, "NoneType", "NoneType", None, None, None),
    ]


@pytest.mark.parametrize("kind", ["projected", "markers"])
def test_device_regions_and_launches_inside_record_the_same(impl: str, queue: Any, kernels: Any, kind: str,
                                                            region_mode: Any) -> None:
    """With markers a region brackets its work with two; projected it enqueues nothing: its record carries the
    last command it launched on its queue (its device end; the resolver widens the start to the first)."""
    region_mode(kind)
    make = cltrace.region

    def device() -> None:
        with make("step", queue):
            kernels.launch_add(queue)
            with cltrace.region("host"):
                kernels.launch_add(queue)
        with make("empty", queue):
            pass
        queue.finish()

    recs = recorded(device)
    projected = kind == "projected"
    assert normal(recs) == [
        ("kernel", "add", 2, 1, ("step",), "main", True, "Event", "NoneType",
         {"global_size": (kernels.n,), "local_size": None}, None, None),
        ("kernel", "add", 4, 3, ("step", "host"), "main", True, "Event", "NoneType",
         {"global_size": (kernels.n,), "local_size": None}, None, None),
        ("region", "host", 3, 1, ("step", "host"), "main", False, "NoneType", "NoneType", None, None, None),
        ("region", "step", 1, 0, ("step",), "main", True, "Event", "NoneType" if projected else "Event", None, None,
         None),
        ("region", "empty", 5, 0, ("empty",), "main", not projected, "NoneType" if projected else "Event",
         "NoneType" if projected else "Event", None, None, None),
    ]
    step = recs[3]
    if projected:
        assert step[R_QUEUE] is queue and step[R_EV1] is None
        assert recs[4][R_QUEUE] is None  # launched nothing: a host span only
        if type(step[R_EV0]) is not int and type(recs[1][R_EV0]) is not int:  # else tickets of their own
            assert step[R_EV0].int_ptr == recs[1][R_EV0].int_ptr  # the last kernel's own command
    elif type(step[R_EV0]) is int:  # the reaper's tickets for the two markers (resolved by stop(): freed)
        assert step[R_QUEUE] is queue and step[R_EV0] < step[R_EV1]
    else:
        assert step[R_EV0].command_type == step[R_EV1].command_type == cl.command_type.MARKER


def test_threads_record_the_same(impl: str) -> None:
    n_threads, steps = 4, 3
    barrier = threading.Barrier(n_threads)
    keys: dict[int, str] = {}
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            keys[regions.thread_key()] = f"t{i}"
            barrier.wait()
            for s in range(steps):
                with cltrace.region(f"w{i}"):
                    with cltrace.region("inner", attrs={"s": s}):
                        time.sleep(0)
        except BaseException as exc:  # reported below
            errors.append(exc)

    def threads() -> None:
        ts = [threading.Thread(target=work, args=(i,)) for i in range(n_threads)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()

    recs = recorded(threads)
    assert errors == []
    assert len(set(keys)) == n_threads
    rows = normal(recs, keys)
    for i in range(n_threads):
        mine = [(r[1], r[4], r[9]) for r in rows if r[5] == f"t{i}"]
        assert mine == [x for s in range(steps) for x in (("inner", (f"w{i}", "inner"), {"s": s}),
                                                            (f"w{i}", (f"w{i}",), None))]
    by_id = {r[R_ID]: r for r in recs}
    assert all(by_id[r[R_PARENT]][R_THREAD] == r[R_THREAD] for r in recs if r[R_PARENT])
    within(recs)


def test_backpressure_is_checked_at_every_exit(impl: str) -> None:
    RECORDER.configure(max_pending=16)

    def many() -> None:
        for i in range(40):
            with cltrace.region("r"):
                rooms.append(RECORDER.room)

    rooms: list[int] = []
    recs = recorded(many)
    assert len(recs) == 40
    # The room grows each time the backlog reaches it (the drain ran on the recording thread).
    assert rooms[15:18] == [16, 32, 32] and rooms[-1] == 48


def test_clock_is_perf_counter_ns() -> None:
    native()
    from cltrace._ext import region as _region

    for _ in range(1000):
        a = time.perf_counter_ns()
        b = _region.now()
        c = time.perf_counter_ns()
        assert a <= b <= c


def test_host_bracket_is_read_on_perf_counter_ns(impl: str) -> None:
    t0 = time.perf_counter_ns()
    recs = recorded(lambda: cltrace.region("r").__enter__().__exit__(None, None, None))
    t1 = time.perf_counter_ns()
    assert t0 <= recs[0][R_HB] <= recs[0][R_HE] <= t1


def test_records_stay_out_of_the_collector_and_cycles_they_hold_are_still_collected() -> None:
    """Waiting records are untracked (nothing refers back to a record but the pending deque, so no
    cycle runs through one); a cycle in a user's attrs is still collected once its record is gone."""
    import weakref

    class Box:
        pass

    kind = native()
    box = Box()
    box.me = box  # type: ignore[attr-defined]
    alive = weakref.ref(box)
    recs = recorded(lambda: [kind("plain").__enter__().__exit__(None, None, None),
                             kind("cyclic", None, {"box": box}).__enter__().__exit__(None, None, None)])
    plain, held = recs
    assert not gc.is_tracked(plain) and not gc.is_tracked(plain[R_PATH])
    assert not gc.is_tracked(held)
    del box, recs, plain, held
    RECORDER.clear()
    gc.collect()
    assert alive() is None


def test_native_region_api_edges() -> None:
    kind = native()
    cltrace.start()
    r = kind("x")
    assert (r.name, r.queue, r.attrs, r.cat) == ("x", None, None, "region")
    assert type(r).__enter__(r) is r  # through the class, as contextlib.ExitStack calls it
    assert type(r).__exit__(r, None, None, None) is None
    with pytest.raises(TypeError):
        r(1, 2)
    with pytest.raises(TypeError):
        kind()
    r2 = kind(name="y", attrs={"a": 1})
    r2.set("b", 2)
    assert (r2.name, r2.attrs, r2.cat) == ("y", {"a": 1, "b": 2}, "region")


def test_exit_stack_records_the_same(impl: str) -> None:
    import contextlib

    def stacked() -> None:
        with contextlib.ExitStack() as stack:
            stack.enter_context(cltrace.region("a"))
            stack.enter_context(cltrace.region("b"))

    assert normal(recorded(stacked)) == [
        ("region", "b", 2, 1, ("a", "b"), "main", False, "NoneType", "NoneType", None, None, None),
        ("region", "a", 1, 0, ("a",), "main", False, "NoneType", "NoneType", None, None, None),
    ]


def test_an_entered_region_shows_the_same_state(impl: str, queue: Any, region_mode: Any) -> None:
    region_mode("markers")
    cltrace.start()
    fresh = cltrace.region("x")
    with pytest.raises(AttributeError):
        fresh._id
    with cltrace.region("outer") as outer:
        with cltrace.region("inner", queue) as r:
            assert (r._parent, r._path, r._st) == (outer._id, ("outer", "inner"), regions._tls.stack)
            assert r._st[-1] == (r._id, r._path) and isinstance(r._hb, int)
            assert type(r._ev0) is cl.Event
        assert outer._ev0 is None and outer._parent == 0


def test_record_launch_in_c_gives_the_python_record(queue: Any) -> None:
    """``regions._record`` (C) and ``regions._record_py`` build the same record for the same command,
    at the top level and inside regions of either kind, on this thread's key."""
    native()
    from cltrace import _state

    c_record = regions._record
    assert c_record is not regions._record_py
    ev = cl.enqueue_marker(queue)
    attrs = {"global_size": (4,), "local_size": None}
    site = regions._site(1)
    RECORDER.configure(tickets_above=1 << 30)  # records keep their Events: two pushes would get two tickets
    _state.ENABLED = True
    try:
        with RECORDER._lock:  # the worker cannot take the records before they are read here
            RECORDER.pending.clear()
            ids = []
            for make in (lambda: regions._Region("py", None, None), lambda: regions._NativeRegion("c")):
                for fn in (c_record, regions._record_py):
                    ids.append(fn("k", queue, ev, 10, 20, "kernel", attrs, site))
                with make():
                    for fn in (c_record, regions._record_py):
                        ids.append(fn("k", queue, ev, 10, 20, "kernel", attrs, site))
            recs = [r for r in RECORDER.pending if r[R_NAME] == "k"]
            RECORDER.pending.clear()
    finally:
        _state.ENABLED = False
        RECORDER.pending.clear()
    assert [r[R_ID] for r in recs] == ids and len(set(ids)) == 8
    strip = [r[:R_ID] + r[R_ID + 1:] for r in recs]
    for a, b in zip(strip[::2], strip[1::2]):
        assert a == b
    assert recs[0][R_PARENT] == 0 and recs[0][R_PATH] == ()
    assert recs[2][R_PATH] == ("py",) and recs[6][R_PATH] == ("c",)
    assert recs[0][R_THREAD] == regions._tls.stack.key and recs[0][R_SITE] is site


SRC_ADD1 = "__kernel void k(__global float *x) { x[get_global_id(0)] += 1.0f; }"


def test_tracing_runs_no_collections_the_untraced_program_would_not(queue: Any) -> None:
    """Records, paths and stack entries are made and freed outside the cyclic collector's counts: a
    traced loop of launches and regions, which allocates nothing itself, starts (almost) no
    collection. Plain tuples freed in the worker's batches started a young collection every ~1 500
    launches, and through them full ones that paused every thread for tens of ms."""
    native()
    prg = cl.Program(queue.context, SRC_ADD1).build()
    buf = cl.Buffer(queue.context, cl.mem_flags.READ_WRITE, 4 * 64)
    k = cl.Kernel(prg, "k")

    def loop() -> None:
        for _ in range(400):
            for _ in range(50):
                cltrace.launch(k, queue, (64,), None, buf)
            queue.finish()
            with cltrace.region("step"):
                pass

    launch = cltrace.compile(SRC_ADD1, context=queue.context).kernel("k")[(64,), None, queue]

    def kernel_loop() -> None:  # a Kernel's launcher builds its record in Python: kept as a quiet copy
        for _ in range(400):
            for _ in range(50):
                launch(buf)
            queue.finish()

    for body in (loop, kernel_loop):
        body()  # warm: kernel names, launch shapes, the tuples' free lists
        gc.collect()
        before = [g["collections"] for g in gc.get_stats()]
        cltrace.start()
        try:
            body()
        finally:
            cltrace.stop()
        young, middle, full = (g["collections"] - b for g, b in zip(gc.get_stats(), before))
        # 20 000 launches (and 400 regions): 12-19 young collections with plain tuples, 0-1 now.
        assert young <= 3 and full == 0, (body.__name__, young, middle, full)
