"""Every pyopencl command inside ``trace()``: plain launches, copies and waits are recorded by default,
pyopencl is put back exactly at ``stop()``, ``record_pyopencl=False``/``CLTRACE_PYOPENCL=0`` leave it
alone, and cltrace's own ``launch``/``copy``/``record_launch`` keep their names without a second span."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from typing import Any

import numpy as np
import pyopencl as cl
import pyopencl._cl as _cl

import cltrace
from cltrace.capture.instrument import instrumented
from cltrace.record import regions
from cltrace.record.recorder import RECORDER

SOURCE = "__kernel void twice(__global float *x) { x[get_global_id(0)] *= 2.0f; }"


def _setup(ctx: Any) -> tuple[Any, Any]:
    prg = cl.Program(ctx, SOURCE).build()
    return cl.Kernel(prg, "twice"), cl.Buffer(ctx, cl.mem_flags.READ_WRITE, 4 * 1024)


def test_plain_pyopencl_inside_trace_is_recorded_and_put_back_at_stop(cl_ctx: Any) -> None:
    knl, buf = _setup(cl_ctx)
    originals = (_cl.enqueue_nd_range_kernel, cl.enqueue_copy, cl.CommandQueue, _cl.CommandQueue.finish)
    host = np.ones(1024, np.float32)
    with cltrace.trace():
        assert instrumented() and regions.region_mode() == "auto (projected)"
        q = cl.CommandQueue(cl_ctx)  # made while tracing: profiling on
        assert q.properties & cl.command_queue_properties.PROFILING_ENABLE
        cl.enqueue_copy(q, buf, host)
        knl(q, (1024,), None, buf)
        cl.enqueue_copy(q, host, buf)
        q.finish()
    assert not instrumented() and regions.region_mode() == "auto (markers)"
    assert (_cl.enqueue_nd_range_kernel, cl.enqueue_copy, cl.CommandQueue, _cl.CommandQueue.finish) == originals
    assert (host == 2).all()
    spans = RECORDER.spans()
    assert [(s.cat, s.name) for s in spans] == [("transfer", "copy HtoD"), ("kernel", "twice"),
                                                ("transfer", "copy DtoH"), ("sync", "finish")]
    assert all(s.source == "device" and s.dev_end > s.dev_start for s in spans[:3])
    RECORDER.clear()
    knl(q, (1024,), None, buf)  # tracing off: nothing recorded
    q.finish()
    assert RECORDER.spans() == []


def test_record_pyopencl_false_leaves_pyopencl_alone(cl_ctx: Any, leave_pyopencl: None) -> None:
    knl, buf = _setup(cl_ctx)
    q = cltrace.profiling_queue(cl_ctx)
    with cltrace.trace():
        assert not instrumented() and regions.region_mode() == "auto (markers)"
        knl(q, (1024,), None, buf)
        cltrace.launch(knl, q, (1024,), None, buf, name="mine")
        q.finish()
    assert [s.name for s in RECORDER.spans()] == ["mine"]


def test_cltraces_own_calls_keep_their_names_once(cl_ctx: Any) -> None:
    knl, buf = _setup(cl_ctx)
    q = cltrace.profiling_queue(cl_ctx)
    host = np.ones(1024, np.float32)
    with cltrace.trace():
        cltrace.launch(knl, q, (1024,), None, buf, name="named")
        cltrace.launch(knl, q, (1024,), None, buf)
        cltrace.copy(q, host, buf, "download")
        ev = cl.enqueue_copy(q, buf, host)
        hb = time.perf_counter_ns()
        first = cltrace.record_launch("upload", q, ev, hb, hb, cat="transfer")
        again = cltrace.record_launch("upload", q, ev, hb, hb, cat="transfer")
        q.finish()
    assert first == again  # the hook's span: no second one
    names = [(s.cat, s.name) for s in RECORDER.spans() if s.cat != "sync"]
    assert names == [("kernel", "named"), ("kernel", "twice"), ("transfer", "download"), ("transfer", "copy HtoD")]


def test_a_users_instrument_outlives_the_session() -> None:
    cltrace.instrument()
    try:
        with cltrace.trace():
            pass
        assert instrumented()  # the user's instrument() stays after stop()
    finally:
        cltrace.uninstrument()
    assert not instrumented()


def _run(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **env})


PROGRAM = """
    import pyopencl as cl, cltrace
    ctx = cl.Context([cltrace.default_device()])
    q = cltrace.profiling_queue(ctx)
    prg = cl.Program(ctx, "__kernel void twice(__global float *x) { x[get_global_id(0)] *= 2.0f; }").build()
    buf = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, 4096)
    with cltrace.trace(quiet=True):
        prg.twice(q, (1024,), None, buf)
        q.finish()
    print(sorted({s.name for s in cltrace.RECORDER.spans()}))
"""


def test_the_environment_chooses_and_a_bad_value_is_one_warning() -> None:
    off = _run(PROGRAM, CLTRACE_PYOPENCL="0")
    assert off.returncode == 0 and off.stdout.strip() == "[]", off.stderr
    bad = _run(PROGRAM, CLTRACE_PYOPENCL="maybe")
    assert bad.returncode == 0 and bad.stdout.strip() == "['finish', 'twice']", bad.stderr
    lines = [ln for ln in bad.stderr.splitlines() if "CLTRACE_PYOPENCL" in ln]
    assert len(lines) == 1 and "CLTRACE_PYOPENCL=0" in lines[0]
    assert "Traceback" not in bad.stderr
