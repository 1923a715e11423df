"""Launching never breaks once tracing is on, and a failed launch
leaves a failed span and raises the same pyopencl error naming the kernel and its sizes,
through ``cltrace.launch``, ``Kernel`` launches and ``instrument()``."""
from __future__ import annotations

from typing import Any, Callable

import numpy as np
import pyopencl as cl
import pytest

import cltrace
from cltrace.record.recorder import RECORDER

ADD = "__kernel void add1(__global float *a) { a[get_global_id(0)] += 1.0f; }"
N = 4096


@pytest.fixture()
def buf(cl_ctx: Any) -> Any:
    return cl.Buffer(cl_ctx, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR,
                     hostbuf=np.zeros(N, np.float32))


def read(queue: Any, buf: Any) -> np.ndarray:
    out = np.empty(N, np.float32)
    cl.enqueue_copy(queue, out, buf)
    return out


@pytest.mark.parametrize("tracing", [False, True])
def test_launch_of_a_cltrace_kernel_works_and_is_recorded_once(cl_ctx: Any, queue: Any, buf: Any,
                                                                tracing: bool) -> None:
    knl = cltrace.compile(ADD, context=cl_ctx).kernel("add1")
    if tracing:
        cltrace.start()
    cltrace.launch(knl, queue, (N,), None, buf).wait()
    cltrace.launch(knl, queue, (N,), None, buf, name="renamed").wait()
    cltrace.stop()
    assert np.all(read(queue, buf) == 2)
    kernels = [s for s in RECORDER.spans() if s.cat == "kernel"]
    assert [s.name for s in kernels] == (["add1", "add1"] if tracing else [])
    assert knl.function_name == "add1"  # a cl.Kernel's attribute, for code written against pyopencl


def test_launch_names_any_kernel_object_without_failing(queue: Any, buf: Any, cl_ctx: Any) -> None:
    prg = cl.Program(cl_ctx, ADD).build()
    knl = cl.Kernel(prg, "add1")

    class Wrapped:  # a callable kernel with neither function_name nor name
        def __call__(self, *a: Any, **k: Any) -> Any:
            return knl(*a, **k)

    with cltrace.trace():
        cltrace.launch(Wrapped(), queue, (N,), None, buf)
        cltrace.launch(knl, queue, [N], None, buf)
    assert [(s.name, s.attrs["global_size"]) for s in RECORDER.spans()] == [("Wrapped", (N,)), ("add1", (N,))]


def _launchers(cl_ctx: Any, queue: Any, buf: Any) -> dict[str, Callable[[], Any]]:
    prg = cltrace.compile(ADD, context=cl_ctx)
    plain = cl.Kernel(cl.Program(cl_ctx, ADD).build(), "add1")
    plain.set_arg(0, buf)
    return {
        "cltrace.launch": lambda: cltrace.launch(cl.Kernel(prg.program, "add1"), queue, (N,), (3,), buf),
        "Kernel[]": lambda: prg.kernel("add1")[(N,), (3,), queue](buf),
        "Kernel()": lambda: prg.kernel("add1")(queue, (N,), (3,), buf),
        "instrument": lambda: cl.enqueue_nd_range_kernel(queue, plain, (N,), (3,)),
    }


@pytest.mark.parametrize("how", ["cltrace.launch", "Kernel[]", "Kernel()", "instrument"])
def test_failed_launch_leaves_a_failed_span_and_names_kernel_and_sizes(cl_ctx: Any, queue: Any, buf: Any,
                                                                        how: str, instrumented: None) -> None:
    launch = _launchers(cl_ctx, queue, buf)[how]
    with cltrace.trace():
        with pytest.raises(cl.LogicError) as info:
            launch()
        launch_ok = cltrace.compile(ADD, context=cl_ctx).kernel("add1")
        launch_ok[(N,), None, queue](buf).wait()  # tracing goes on after the failure
    err = info.value
    assert err.code == cl.status_code.INVALID_WORK_GROUP_SIZE  # same class and code as pyopencl's
    msg = str(err)
    assert "INVALID_WORK_GROUP_SIZE" in msg and "'add1'" in msg
    assert f"global_size ({N},)" in msg and "local_size (3,)" in msg and "local_size=None" in msg
    spans = [s for s in RECORDER.spans() if s.cat == "kernel"]
    failed = [s for s in spans if s.status == "error"]
    assert len(failed) == 1, [(s.name, s.status) for s in spans]
    f = failed[0]
    assert f.name == "add1" and "INVALID_WORK_GROUP_SIZE" in f.error
    assert f.attrs["global_size"] == [N] and f.attrs["local_size"] == [3]
    assert [s.status for s in spans if s is not f] == ["ok"]


def test_failed_cltrace_kernel_launch_is_named_with_tracing_off(cl_ctx: Any, queue: Any, buf: Any) -> None:
    knl = cltrace.compile(ADD, context=cl_ctx).kernel("add1")
    for launch in (lambda: knl[(N,), (3,), queue](buf), lambda: knl(queue, (N,), (3,), buf)):
        with pytest.raises(cl.LogicError, match=r"kernel 'add1' \(global_size \(4096,\), local_size \(3,\)\)"):
            launch()
    assert RECORDER.spans() == []


def test_pyopencls_own_detail_is_kept_in_the_named_error(cl_ctx: Any, queue: Any, buf: Any) -> None:
    knl = cltrace.compile("__kernel void addn(__global float *a, int n) { a[get_global_id(0)] += n; }",
                          context=cl_ctx).kernel("addn")
    with pytest.raises(cl.LogicError) as info:
        knl(queue, (N,), None, buf, 3.5)  # a float where the kernel takes an int: pyopencl says which
    msg = str(info.value)
    assert "arg#2" in msg and "kernel 'addn'" in msg


def test_a_kernel_seen_before_launches_fails_and_renames_as_the_first_launch_did(cl_ctx: Any, queue: Any,
                                                                                  buf: Any) -> None:
    """A kernel ``cltrace.launch`` has seen takes the C path (no Python frame of its own where the extension is
    built): the same spans, names, call site, failed span and error as the first, Python, launch."""
    knl = cl.Kernel(cl.Program(cl_ctx, ADD).build(), "add1")
    knl.set_arg(0, buf)
    with cltrace.trace():
        cltrace.launch(knl, queue, (N,), None, buf)  # learns the kernel's name
        ev = cltrace.launch(knl, queue, (N,), None, buf)  # the kernel is known now
        cltrace.launch(knl, queue, (N,), None, buf, wait_for=[ev], name="renamed")
        with pytest.raises(cl.LogicError) as info:
            cltrace.launch(knl, queue, (N,), (3,), buf)
        with pytest.raises(TypeError):
            cltrace.launch(knl, queue, (N,), None, buf, bogus=1)
        with pytest.raises(TypeError):
            cltrace.launch(knl, queue)
        line = info.traceback[0].lineno + 1  # the failing launch's line (pytest's are 0-based)
    queue.finish()
    assert np.all(read(queue, buf) == 3)
    err = info.value
    assert err.code == cl.status_code.INVALID_WORK_GROUP_SIZE and "'add1'" in str(err) and "local_size (3,)" in str(err)
    assert err.__suppress_context__ and err.__cause__ is None  # raised "from None", as the Python path does
    spans = [s for s in RECORDER.spans() if s.cat == "kernel"]
    assert [(s.name, s.status) for s in spans] == [("add1", "ok"), ("add1", "ok"), ("renamed", "ok"), ("add1", "error")]
    assert all(s.dev_start is not None for s in spans[:3])
    assert spans[3].attrs["local_size"] == [3]
    fn = "test_a_kernel_seen_before_launches_fails_and_renames_as_the_first_launch_did"
    assert [(s.site.file, s.site.function) for s in spans] == [(__file__, fn)] * 4  # the user's line
    assert spans[0].site.line + 1 == spans[1].site.line and spans[3].site.line == line
