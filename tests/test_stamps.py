"""Bulk stamp reads (``cltrace.timeline.stamps``): the C extension and the Python fallback, on real
PoCL events, give pyopencl's own stamps and statuses, and the same as each other.

The native tests fail, not skip, when the extension is not active: CI must exercise both paths.
Only ``CLTRACE_NATIVE=0`` (the fallback-only run) skips them.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
from typing import Any

import numpy as np
import pyopencl as cl
import pytest

from cltrace.timeline import stamps

DISABLED = os.environ.get("CLTRACE_NATIVE", "").strip() == "0"
COMPLETE = cl.command_execution_status.COMPLETE


def native() -> stamps.Impl:
    if DISABLED:
        pytest.skip("CLTRACE_NATIVE=0: fallback-only run")
    if stamps.NATIVE is None:
        pytest.fail(f"the C extension is not active ({stamps.WHY}): reinstall with "
                    "`pip install -e .` where a C compiler exists, or run with CLTRACE_NATIVE=0")
    return stamps.NATIVE


@pytest.fixture(params=["native", "python"])
def impl(request: Any) -> stamps.Impl:
    return native() if request.param == "native" else stamps.PYTHON


def mixed_commands(queue: Any, kernels: Any) -> list[Any]:
    """Kernels, markers, a barrier, copies and a fill on one profiling queue."""
    host = np.arange(kernels.n, dtype=np.float32)
    out = np.empty_like(host)
    evs = [kernels.add(queue, (kernels.n,), None, kernels.a, kernels.b),
           cl.enqueue_marker(queue),
           cl.enqueue_copy(queue, kernels.a, host, is_blocking=False),
           kernels.spin(queue, (kernels.n,), None, kernels.a, np.int32(50)),
           cl.enqueue_copy(queue, kernels.b, kernels.a),
           cl.enqueue_fill_buffer(queue, kernels.a, np.float32(1), 0, 4 * kernels.n),
           cl.enqueue_barrier(queue),
           cl.enqueue_copy(queue, out, kernels.a, is_blocking=False),
           cl.enqueue_marker(queue)]
    return evs


def test_the_active_path_is_native_unless_disabled() -> None:
    if DISABLED:
        assert (stamps.PATH, stamps.NATIVE) == ("python", None)
        assert stamps.DETAIL == "python (fallback: CLTRACE_NATIVE=0)"
    else:
        native()
        assert (stamps.PATH, stamps.DETAIL) == ("native", "native (C extension)")


def test_handles_are_the_events_int_ptrs(impl: stamps.Impl, queue: Any, kernels: Any) -> None:
    evs = mixed_commands(queue, kernels)
    queue.finish()
    for seq in (evs, tuple(evs)):
        h = impl.handles(seq)
        assert h.dtype == np.uint64 and h.tolist() == [e.int_ptr for e in evs]


def test_complete_commands_read_exactly_what_pyopencl_reads(impl: stamps.Impl, queue: Any, kernels: Any) -> None:
    evs = mixed_commands(queue, kernels)
    queue.finish()
    status, st = impl.read(impl.handles(evs))
    assert status.dtype == np.int32 and status.shape == (len(evs),)
    assert st.dtype == np.int64 and st.shape == (len(evs), 4)
    assert status.tolist() == [0] * len(evs)
    assert st.tolist() == [[e.profile.queued, e.profile.submit, e.profile.start, e.profile.end] for e in evs]
    assert (st[:, 3] - st[:, 2]).tolist() == [e.profile.end - e.profile.start for e in evs]
    assert (st[:, 2] > 0).all()
    # Reading takes no reference away: the events read again, and pyopencl still reads them.
    again = impl.read(impl.handles(evs))
    assert again[0].tolist() == status.tolist() and again[1].tolist() == st.tolist()
    assert [e.profile.end for e in evs] == st[:, 3].tolist()


def test_commands_not_complete_yet_report_their_status_and_no_stamps(impl: stamps.Impl, cl_ctx: Any,
                                                                      kernels: Any) -> None:
    queue = cl.CommandQueue(cl_ctx, properties=cl.command_queue_properties.PROFILING_ENABLE)
    gate = cl.UserEvent(cl_ctx)
    held = kernels.add(queue, (kernels.n,), None, kernels.a, kernels.b, wait_for=[gate])
    after = cl.enqueue_marker(queue)
    evs = [held, after, gate]
    status, st = impl.read(impl.handles(evs))
    assert status.tolist() == [e.command_execution_status for e in evs]
    assert (status > 0).all() and status[2] == cl.command_execution_status.SUBMITTED
    assert not st.any()
    gate.set_status(COMPLETE)
    impl.wait(impl.handles([held, after]))
    status, st = impl.read(impl.handles(evs))
    # A user event completes without stamps: profiling information is not available for it.
    assert status.tolist() == [0, 0, cl.status_code.PROFILING_INFO_NOT_AVAILABLE]
    assert st[:2].tolist() == [[e.profile.queued, e.profile.submit, e.profile.start, e.profile.end]
                               for e in (held, after)]
    assert not st[2].any()


def test_a_queue_without_profiling_reads_as_not_available(impl: stamps.Impl, plain_queue: Any) -> None:
    ev = cl.enqueue_marker(plain_queue)
    ev.wait()
    status, st = impl.read(impl.handles([ev]))
    assert status.tolist() == [cl.status_code.PROFILING_INFO_NOT_AVAILABLE] and not st.any()


def gated_spins(ctx: Any, queue: Any, kernels: Any) -> list[Any]:
    """Four slow kernels still queued when this returns: the first waits on a user event that a timer
    completes 0.2 s later, so a wait on them must really wait, however fast or loaded the host."""
    gate = cl.UserEvent(ctx)
    slow = [kernels.spin(queue, (kernels.n,), None, kernels.a, np.int32(20_000), wait_for=[gate] if i == 0 else None)
            for i in range(4)]
    assert slow[-1].command_execution_status > 0, "precondition: the slow kernels are still queued"
    threading.Timer(0.2, gate.set_status, (cl.command_execution_status.COMPLETE,)).start()
    return slow


def test_failed_commands_read_negative_and_wait_does_not_stop_at_them(impl: stamps.Impl, cl_ctx: Any,
                                                                      queue: Any, kernels: Any) -> None:
    failing = cl.CommandQueue(cl_ctx, properties=cl.command_queue_properties.PROFILING_ENABLE)
    gate = cl.UserEvent(cl_ctx)
    doomed = kernels.add(failing, (kernels.n,), None, kernels.a, kernels.b, wait_for=[gate])
    gate.set_status(-5)
    # Slow work on another queue, after the failed event in the batch: wait must still wait for it.
    slow = gated_spins(cl_ctx, queue, kernels)
    batch = impl.handles([gate, doomed, *slow])
    impl.wait(batch)
    assert [e.command_execution_status for e in slow] == [0] * len(slow)
    status, st = impl.read(batch)
    assert status[0] == -5 and status[1] < 0 and status[1] == doomed.command_execution_status
    assert not st[:2].any()
    assert status[2:].tolist() == [0] * len(slow)
    assert st[2:, 3].tolist() == [e.profile.end for e in slow]


def test_wait_waits_for_events_of_several_contexts(impl: stamps.Impl, cl_ctx: Any, queue: Any,
                                                  kernels: Any) -> None:
    # clWaitForEvents refuses a list that spans contexts (CL_INVALID_CONTEXT) without waiting.
    other = cl.Context(cl_ctx.devices)
    elsewhere = cl.enqueue_marker(cl.CommandQueue(other, properties=cl.command_queue_properties.PROFILING_ENABLE))
    slow = gated_spins(cl_ctx, queue, kernels)
    impl.wait(impl.handles([elsewhere, *slow]))
    assert [e.command_execution_status for e in (elsewhere, *slow)] == [0] * 5


def test_a_command_completing_during_the_read_reads_complete(impl: stamps.Impl, queue: Any, kernels: Any) -> None:
    """Between "no stamps yet" and "status?" the command may complete: that is status 0, never -7.

    The window is a few instructions wide, so this reads kernels of ~1 ms in a tight loop as they
    complete (a batch holds each one a few times over); without the second look it fails in most runs.
    """
    spin = kernels.kernel("spin")
    wrong = []
    for _ in range(250):
        ev = spin(queue, (64,), None, kernels.a, np.int32(20_000))
        h = impl.handles([ev] * 8)
        while True:
            status, st = impl.read(h)
            if (status <= 0).all():
                break
        want = [ev.profile.queued, ev.profile.submit, ev.profile.start, ev.profile.end]
        wrong += [(s, row) for s, row in zip(status.tolist(), st.tolist()) if s != 0 or row != want]
    assert wrong == []


def test_native_and_python_agree_on_a_mix_of_states(cl_ctx: Any, queue: Any, plain_queue: Any,
                                                    kernels: Any) -> None:
    nat = native()
    gate, bad = cl.UserEvent(cl_ctx), cl.UserEvent(cl_ctx)
    gated_q = cl.CommandQueue(cl_ctx, properties=cl.command_queue_properties.PROFILING_ENABLE)
    failing_q = cl.CommandQueue(cl_ctx, properties=cl.command_queue_properties.PROFILING_ENABLE)
    evs = mixed_commands(queue, kernels)
    evs += [kernels.add(gated_q, (kernels.n,), None, kernels.a, kernels.b, wait_for=[gate]),
            cl.enqueue_marker(gated_q), gate,
            kernels.add(failing_q, (kernels.n,), None, kernels.a, kernels.b, wait_for=[bad]), bad,
            cl.enqueue_marker(plain_queue)]
    bad.set_status(-14)
    queue.finish()
    plain_queue.finish()
    failing_q.finish()
    h = stamps.PYTHON.handles(evs)
    assert nat.handles(evs).tolist() == h.tolist()
    n_status, n_st = nat.read(h)
    p_status, p_st = stamps.PYTHON.read(h)
    assert n_status.tolist() == p_status.tolist()
    assert n_st.tolist() == p_st.tolist()
    na = cl.status_code.PROFILING_INFO_NOT_AVAILABLE
    failed = evs[-3].command_execution_status
    assert failed < 0
    assert n_status.tolist() == [0] * (len(evs) - 6) + [3, 3, 2, failed, -14, na]
    gate.set_status(COMPLETE)
    nat.wait(h)
    stamps.PYTHON.wait(h)
    n_status, n_st = nat.read(h)
    p_status, p_st = stamps.PYTHON.read(h)
    assert n_status.tolist() == p_status.tolist() and n_st.tolist() == p_st.tolist()
    assert n_status.tolist() == [0] * (len(evs) - 4) + [na, failed, -14, na]
    assert (n_st[:len(evs) - 4, 2] > 0).all() and not n_st[len(evs) - 4:].any()


def test_an_empty_batch(impl: stamps.Impl) -> None:
    h = impl.handles([])
    assert h.dtype == np.uint64 and h.shape == (0,)
    status, st = impl.read(h)
    assert status.shape == (0,) and st.shape == (0, 4)
    assert status.dtype == np.int32 and st.dtype == np.int64
    impl.wait(h)


WAIT_SCRIPT = textwrap.dedent("""
    import sys, threading
    import numpy as np, pyopencl as cl
    from cltrace.timeline import stamps
    impl = stamps.NATIVE if sys.argv[1] == "native" else stamps.PYTHON
    ctx = cl.create_some_context(interactive=False)
    q = cl.CommandQueue(ctx, properties=cl.command_queue_properties.PROFILING_ENABLE)
    gate = cl.UserEvent(ctx)
    ev = cl.enqueue_marker(q, wait_for=[gate])
    # Only a Python thread can open the gate: if wait() held the GIL, this would never finish.
    threading.Timer(0.2, gate.set_status, (cl.command_execution_status.COMPLETE,)).start()
    impl.wait(impl.handles([ev]))
    print(impl.read(impl.handles([ev]))[0].tolist())
""")


def test_wait_releases_the_gil(impl: stamps.Impl) -> None:
    which = "native" if impl is stamps.NATIVE else "python"
    proc = subprocess.run([sys.executable, "-c", WAIT_SCRIPT, which], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[0]"


def test_cltrace_native_0_forces_the_fallback_and_devices_says_so(tmp_path: Any) -> None:
    env = {k: v for k, v in os.environ.items() if k != "CLTRACE_NATIVE"}
    runs = {"0": "span pipeline: python (fallback: CLTRACE_NATIVE=0)"}
    if not DISABLED:
        native()
        runs[""] = "span pipeline: native (C extension)"
    for value, line in runs.items():
        text = subprocess.run([sys.executable, "-m", "cltrace", "devices", "--samples", "4"],
                              capture_output=True, text=True, timeout=240, cwd=tmp_path,
                              env=dict(env, CLTRACE_NATIVE=value))
        assert text.returncode == 0, text.stderr
        assert line in text.stdout.splitlines()
        proc = subprocess.run([sys.executable, "-m", "cltrace", "devices", "--samples", "4", "--json"],
                              capture_output=True, text=True, timeout=240, cwd=tmp_path,
                              env=dict(env, CLTRACE_NATIVE=value))
        assert proc.returncode == 0, proc.stderr
        path = "python" if value == "0" else "native"
        assert json.loads(proc.stdout)[0]["span_pipeline"] == path


def test_transpose_gives_the_columns_of_the_records_on_both_paths() -> None:
    records = [(i, f"k{i}", None, (1, 2), object()) for i in range(300)]
    expected = list(zip(*records))
    assert stamps.PYTHON.transpose(records) == expected
    assert stamps.transpose([]) == [] and stamps.PYTHON.transpose([]) == []
    if not DISABLED:
        impl = native()
        assert impl.transpose(records) == expected
        with pytest.raises(TypeError):
            impl.transpose([(1, 2), (3,)])
        with pytest.raises(TypeError):
            impl.transpose([(1, 2), [3, 4]])


def test_columns_read_gives_columns_and_each_records_stamps_across_chunks(impl: stamps.Impl, cl_ctx: Any,
                                                                          queue: Any, kernels: Any) -> None:
    """``columns_read`` (the resolver's one pass) = ``columns`` + ``read`` of each record's events, a region's
    two markers combined into one row (START: the first marker's END, END: the second's; the first failure,
    else the later status), over more records than one GIL-free chunk (512) holds; native = Python."""
    gate, bad = cl.UserEvent(cl_ctx), cl.UserEvent(cl_ctx)
    gated_q = cl.CommandQueue(cl_ctx, properties=cl.command_queue_properties.PROFILING_ENABLE)
    done = mixed_commands(queue, kernels)
    held = kernels.add(gated_q, (kernels.n,), None, kernels.a, kernels.b, wait_for=[gate])
    failing = kernels.add(gated_q, (kernels.n,), None, kernels.a, kernels.b, wait_for=[bad])
    bad.set_status(-14)
    queue.finish()
    site = (None, 1)
    rng = np.random.default_rng(3)
    records, pairs = [], []
    for i in range(1300):
        pick = int(rng.integers(6))
        e0 = done[i % len(done)]
        e1 = (None, done[(i + 1) % len(done)], held, failing, None, None)[pick]
        if pick == 5:  # host only
            e0 = None
        q = None if e0 is None else queue
        records.append(("kernel", f"k{i % 7}", i + 1, 0, ("p",), 7, 10 * i, 10 * i + 5, q, e0, e1,
                        None, None, None, site))
        pairs.append((e0, e1))
    ints, hs, status, raw = impl.columns_read(records, {}, {}, {})
    want_ints, want_hs = impl.columns(records, {}, {}, {})
    assert np.array_equal(ints, want_ints)
    # Tickets' handles as ``columns`` gives them; rows holding Events: theirs (native) or 0 (Python).
    tick = (ints[stamps.C_FLAGS] & stamps.F_TICKETS) != 0
    assert np.array_equal(hs[:, tick], want_hs[:, tick])
    assert np.array_equal(hs, want_hs) if impl is not stamps.PYTHON else not hs[:, ~tick].any()
    for i, (e0, e1) in enumerate(pairs):
        if e0 is None:
            assert status[i] == 0 and not raw[i].any()
            continue
        s0, r0 = impl.read(impl.handles([e0]))
        if e1 is None:
            assert (status[i], raw[i].tolist()) == (s0[0], r0[0].tolist()), i
            continue
        s1, r1 = impl.read(impl.handles([e1]))
        want = s0[0] if s0[0] < 0 else s1[0] if s1[0] < 0 else max(s0[0], s1[0])
        assert status[i] == want, i
        assert raw[i].tolist() == [r0[0, 0], r0[0, 1], r0[0, 3], r1[0, 3]], i
    assert {int(s) for s in status} >= {0, 3, held.command_execution_status, failing.command_execution_status}
    if impl is not stamps.PYTHON:
        p = stamps.PYTHON.columns_read(records, {}, {}, {})
        assert all(np.array_equal(a, b) for a, b in zip((ints, status, raw), p[:1] + p[2:]))
    gate.set_status(COMPLETE)
    gated_q.finish()
