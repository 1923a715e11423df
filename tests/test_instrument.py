"""cltrace.instrument on real pyopencl + PoCL: unmodified pyopencl code (pyopencl.array,
ElementwiseKernel, ReductionKernel, hand-written kernels, copies, fills, builds) is traced, queues
made while instrumented get profiling, old queues give host-only spans with one warning, and
uninstrument restores pyopencl exactly."""
from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pyopencl as cl
import pyopencl._cl as _cl
import pytest

import cltrace
from cltrace.capture.instrument import instrumented as is_instrumented
from cltrace.record.recorder import RECORDER
from cltrace.timeline.tracks import COMPILE

PROFILING = cl.command_queue_properties.PROFILING_ENABLE
N = 1000
TWICE = "__kernel void twice(__global float *a) { a[get_global_id(0)] *= 2.0f; }"

PATCHED = [(_cl, "enqueue_nd_range_kernel"), (cl, "enqueue_nd_range_kernel"), (cl, "enqueue_copy"),
           (cl, "enqueue_fill_buffer"), (cl.Program, "build"), (cl, "CommandQueue")]


def test_uninstrument_restores_every_attribute_exactly() -> None:
    before = {(id(o), a): (getattr(o, a), a in vars(o)) for o, a in PATCHED}
    cltrace.instrument()
    cltrace.instrument()  # idempotent: a second call must not save the hooks as "originals"
    try:
        for o, a in PATCHED:
            assert getattr(o, a) is not before[(id(o), a)][0], f"{a} not hooked"
    finally:
        cltrace.uninstrument()
    for o, a in PATCHED:
        original, own = before[(id(o), a)]
        assert getattr(o, a) is original, f"{a} not restored"
        assert (a in vars(o)) == own
    assert vars(cl.Program)["build"] is before[(id(cl.Program), "build")][0]
    cltrace.uninstrument()  # a second uninstrument is harmless
    assert cl.CommandQueue is _cl.CommandQueue


def test_queues_made_while_instrumented_can_be_profiled(cl_ctx: Any, plain_queue: Any, instrumented: None) -> None:
    q = cl.CommandQueue(cl_ctx)
    assert type(q) is _cl.CommandQueue and q.properties & PROFILING
    ooo = cl.CommandQueue(cl_ctx, cl_ctx.devices[0], cl.command_queue_properties.OUT_OF_ORDER_EXEC_MODE_ENABLE)
    assert ooo.properties & PROFILING and ooo.properties & cl.command_queue_properties.OUT_OF_ORDER_EXEC_MODE_ENABLE
    assert isinstance(plain_queue, cl.CommandQueue) and isinstance(q, cl.CommandQueue)
    assert issubclass(_cl.CommandQueue, cl.CommandQueue)
    assert cl.CommandQueue.finish is _cl.CommandQueue.finish


def _spans_by(cat: str) -> list[cltrace.Span]:
    return [s for s in RECORDER.spans() if s.cat == cat]


def test_pyopencl_array_elementwise_reduction_and_kernels_are_traced(cl_ctx: Any, instrumented: None) -> None:
    import pyopencl.array as cla
    from pyopencl.elementwise import ElementwiseKernel
    from pyopencl.reduction import ReductionKernel

    q = cl.CommandQueue(cl_ctx)
    lin = ElementwiseKernel(cl_ctx, "float *x, float *y, float k", "y[i] = k * x[i]", "cltrace_lincomb")
    dot = ReductionKernel(cl_ctx, np.float32, neutral="0", reduce_expr="a+b", map_expr="x[i]*y[i]",
                          arguments="__global const float *x, __global const float *y", name="cltrace_dot")
    host = np.arange(N, dtype=np.float32)
    with cltrace.trace():
        x = cla.to_device(q, host)
        y = cla.zeros(q, N, np.float32)
        z = x * 2 + y
        lin(x, y, np.float32(3))
        d = dot(x, y).get()
        prg = cl.Program(cl_ctx, TWICE).build()
        knl = prg.twice
        knl(q, (N,), None, z.data)
        cl.enqueue_nd_range_kernel(q, knl, (N,), None)
        got = z.get()
    np.testing.assert_allclose(got, host * 8)
    assert d == pytest.approx(float(np.dot(host, 3 * host)), rel=1e-5)

    kernels = _spans_by("kernel")
    names = [s.name for s in kernels]
    assert "cltrace_lincomb" in names and "cltrace_dot_stage1" in names
    assert names.count("twice") == 2
    assert len(names) >= 6, names  # + zeros/axpbyz or similar pyopencl.array kernels
    for s in kernels:
        assert s.source == "device" and s.device_ns >= 0
        assert s.attrs["global_size"]
    twice = [s for s in kernels if s.name == "twice"]
    assert twice[0].attrs["global_size"] == [N] and twice[0].attrs["local_size"] is None

    transfers = _spans_by("transfer")
    htod = [s for s in transfers if s.name == "copy HtoD"]
    dtoh = [s for s in transfers if s.name == "copy DtoH"]
    assert htod and htod[0].attrs["bytes"] == host.nbytes
    assert any(s.attrs["bytes"] == host.nbytes for s in dtoh)
    assert all(s.source == "device" for s in transfers)
    fills = _spans_by("fill")
    assert fills and fills[0].attrs["bytes"] == host.nbytes  # cla.zeros -> enqueue_fill_buffer

    builds = _spans_by("build")
    assert any(s.name == "build twice" for s in builds)
    assert any("cltrace_lincomb" in s.name for s in builds)
    for s in builds:
        assert RECORDER.tracks.get(s.thread).kind == COMPILE
        assert s.attrs["duration_ns"] == s.host_ns and s.attrs["binary_size"] > 0
        assert s.attrs["cache"] in ("hit", "miss", "none") and "pyopencl.build" in s.attrs


def test_old_queue_without_profiling_gives_host_only_spans_and_one_warning(
        cl_ctx: Any, plain_queue: Any, instrumented: None) -> None:
    prg = cl.Program(cl_ctx, TWICE).build()
    knl = prg.twice
    buf = cl.Buffer(cl_ctx, cl.mem_flags.READ_WRITE, 4 * N)
    host = np.ones(N, np.float32)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with cltrace.trace():
            cl.enqueue_copy(plain_queue, buf, host)
            for _ in range(3):
                knl(plain_queue, (N,), None, buf)
            cl.enqueue_fill_buffer(plain_queue, buf, np.float32(0), 0, 4 * N)
            plain_queue.finish()
    ours = [w for w in caught if "PROFILING_ENABLE" in str(w.message)]
    assert len(ours) == 1
    assert "cltrace.profiling_queue(ctx)" in str(ours[0].message)  # names the fix
    spans = [s for s in RECORDER.spans() if s.cat in ("kernel", "transfer", "fill")]
    assert [s.cat for s in spans] == ["transfer", "kernel", "kernel", "kernel", "fill"]
    for s in spans:
        assert s.source == "host" and s.device_track is None
        assert s.attrs["cltrace.device_time"] == "unavailable: queue without PROFILING_ENABLE"



def test_launches_of_one_shape_share_one_attrs_dict_and_a_plain_queue_changes_it_not(
        cl_ctx: Any, queue: Any, plain_queue: Any, instrumented: None) -> None:
    """One attrs dict a launch shape (a sink encodes each dict once: a dict a launch cost the Chrome sink
    ~9 us of the worker's time a span); a launch on a queue without profiling gets a copy with its note."""
    prg = cl.Program(cl_ctx, TWICE).build()
    knl = prg.twice
    buf = cl.Buffer(cl_ctx, cl.mem_flags.READ_WRITE, 4 * N)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with cltrace.trace():
            for q in (queue, plain_queue, queue):
                for _ in range(3):
                    knl(q, (N,), None, buf)
            plain_queue.finish()
            queue.finish()
    spans = [s for s in RECORDER.spans() if s.cat == "kernel"]
    profiled = [s for s in spans if s.source == "device"]
    assert len(spans) == 9 and len(profiled) == 6
    assert len({id(s.attrs) for s in profiled}) == 1
    assert profiled[0].attrs == {"global_size": [N], "local_size": None}
    assert [s.attrs["cltrace.device_time"] for s in spans if s.source == "host"] == [
        "unavailable: queue without PROFILING_ENABLE"] * 3


def test_a_profiled_queue_is_asked_once_and_forgotten_at_stop(cl_ctx: Any, queue: Any, plain_queue: Any,
                                                              instrumented: None) -> None:
    """pyopencl asks the driver for a queue's properties at each launch (~0.4 us): the hooks remember the
    queues that profile while tracing (never one that does not: its spans stay host-only), and let them go."""
    from cltrace.capture import instrument

    prg = cl.Program(cl_ctx, TWICE).build()
    buf = cl.Buffer(cl_ctx, cl.mem_flags.READ_WRITE, 4 * N)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with cltrace.trace():
            for q in (queue, plain_queue, queue):
                prg.twice(q, (N,), None, buf)
            assert list(instrument._PROFILED_QUEUES.values()) == [queue]
            plain_queue.finish()
            queue.finish()
    assert not instrument._PROFILED_QUEUES
    assert [s.source for s in RECORDER.spans() if s.cat == "kernel"] == ["device", "host", "device"]

def test_tracing_off_records_nothing(cl_ctx: Any, instrumented: None) -> None:
    q = cl.CommandQueue(cl_ctx)
    prg = cl.Program(cl_ctx, TWICE).build()
    buf = cl.Buffer(cl_ctx, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR, hostbuf=np.ones(N, np.float32))
    prg.twice(q, (N,), None, buf)
    out = np.empty(N, np.float32)
    cl.enqueue_copy(q, out, buf)
    assert np.all(out == 2)
    assert RECORDER.spans() == []


def test_failed_enqueue_and_build_are_recorded_and_raise(cl_ctx: Any, instrumented: None) -> None:
    q = cl.CommandQueue(cl_ctx)
    prg = cl.Program(cl_ctx, TWICE).build()
    knl = cl.Kernel(prg, "twice")  # no arguments set
    with cltrace.trace():
        with pytest.raises(cl.LogicError, match="INVALID_KERNEL_ARGS"):
            cl.enqueue_nd_range_kernel(q, knl, (N,), None)
        with pytest.raises(cl.RuntimeError, match="cltrace_nope"):
            cl.Program(cl_ctx, "__kernel void bad(__global float *a) { a[0] = cltrace_nope; }").build()
    failed = [s for s in RECORDER.spans() if s.status == "error"]
    assert {(s.cat, s.name) for s in failed} == {("kernel", "twice"), ("build", "build bad")}
    build = next(s for s in failed if s.cat == "build")
    assert "cltrace_nope" in build.attrs["build_log"]
    assert RECORDER.tracks.get(build.thread).kind == COMPILE


def test_cltrace_kernels_are_not_recorded_twice(cl_ctx: Any, instrumented: None) -> None:
    q = cl.CommandQueue(cl_ctx)
    prg = cltrace.compile(TWICE, context=cl_ctx)
    buf = cl.Buffer(cl_ctx, cl.mem_flags.READ_WRITE, 4 * N)
    with cltrace.trace():
        prg.twice[N, None, q](buf)
        prg.twice(q, (N,), None, buf)
    assert [s.name for s in _spans_by("kernel")] == ["twice", "twice"]
    assert is_instrumented()
