"""Every command pyopencl can enqueue is traced under ``instrument()``.

The list of entry points comes from pyopencl itself (every ``enqueue_*`` it exports), so a
new one fails here until it is hooked or put on ``NO_DEVICE_WORK`` with its reason.
"""
from __future__ import annotations

import warnings
from typing import Any, Callable

import numpy as np
import pyopencl as cl
import pyopencl._cl as _cl
import pytest

import cltrace
from cltrace.capture import instrument as ins
from cltrace.record.recorder import RECORDER

# Exported enqueue_* functions that enqueue no command of their own. Empty today: each one either
# enqueues a command or reaches the driver through a hooked function (enqueue_fill).
NO_DEVICE_WORK: dict[str, str] = {}

FLOAT4 = cl.ImageFormat(cl.channel_order.RGBA, cl.channel_type.FLOAT)


def exported_enqueues() -> list[str]:
    return sorted(n for n in dir(cl) if n.startswith("enqueue_") and callable(getattr(cl, n)))


def calls(ctx: Any, q: Any) -> dict[str, tuple[Callable[[], Any], str, str, int | None]]:
    """For each entry point: a call, and the category, name(s) ("a+b": two spans) and bytes of its span(s)."""
    buf = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, 4096)
    host = np.zeros(1024, np.float32)
    img = cl.create_image(ctx, cl.mem_flags.READ_WRITE, FLOAT4, shape=(16, 16))
    svm = cl.SVM(cl.csvm_empty(ctx, 1024, np.float32))
    zero = cl.Kernel(cl.Program(ctx, "__kernel void zero(__global float *a) { a[get_global_id(0)] = 0; }").build(),
                     "zero")
    zero.set_arg(0, buf)

    def map_buffer() -> None:
        ary, _ = cl.enqueue_map_buffer(q, buf, cl.map_flags.READ, 0, (1024,), np.float32)
        ary.base.release(q).wait()

    def map_image() -> None:
        ary, *_ = cl.enqueue_map_image(q, img, cl.map_flags.READ, (0, 0), (16, 16), (16, 16, 4), np.float32)
        ary.base.release(q).wait()

    return {
        "enqueue_copy": (lambda: cl.enqueue_copy(q, buf, host), "transfer", "copy HtoD", 4096),
        "enqueue_fill": (lambda: cl.enqueue_fill(q, svm, np.float32(2), 4096), "fill", "fill SVM", 4096),
        "enqueue_fill_buffer": (lambda: cl.enqueue_fill_buffer(q, buf, np.float32(0), 0, 4096), "fill", "fill", 4096),
        "enqueue_fill_image": (lambda: cl.enqueue_fill_image(q, img, np.zeros(4, np.float32), (0, 0), (16, 16)),
                               "fill", "fill image", 4096),
        "enqueue_map_buffer": (map_buffer, "transfer", "map buffer+unmap", 4096),
        "enqueue_map_image": (map_image, "transfer", "map image+unmap", 4096),
        "enqueue_marker": (lambda: cl.enqueue_marker(q), "marker", "marker", None),
        "enqueue_barrier": (lambda: cl.enqueue_barrier(q), "marker", "barrier", None),
        "enqueue_migrate_mem_objects": (lambda: cl.enqueue_migrate_mem_objects(q, [buf]), "transfer", "migrate", 4096),
        "enqueue_nd_range_kernel": (lambda: cl.enqueue_nd_range_kernel(q, zero, (1024,), None), "kernel", "zero", None),
        "enqueue_svm_memfill": (lambda: cl.enqueue_svm_memfill(q, svm, np.float32(1)), "fill", "fill SVM", 4096),
        "enqueue_svm_migrate_mem": (lambda: cl.enqueue_svm_migrate_mem(q, [svm], 0), "transfer", "migrate SVM", 4096),
        # not an enqueue_* function, but commands all the same: the unmap of a map, SVM map/unmap
        "MemoryMap.release": (lambda: _unmap(q, buf), "transfer", "unmap", None),
        "SVM map": (lambda: svm.map_ro(q).release(q), "transfer", "map SVM+unmap SVM", 4096),
    }


def _unmap(q: Any, buf: Any) -> None:
    cltrace.stop()  # map untraced, then trace the unmap alone
    ary, _ = cl.enqueue_map_buffer(q, buf, cl.map_flags.READ, 0, (1024,), np.float32)
    cltrace.start()
    ary.base.release(q)


NOT_RUNNABLE_HERE = {"enqueue_copy_buffer_p2p_amd": "needs two AMD devices"}


def test_every_exported_enqueue_is_traced_or_listed(cl_ctx: Any, instrumented: None) -> None:
    q = cl.CommandQueue(cl_ctx)  # profiling added by instrument()
    table = calls(cl_ctx, q)
    names = exported_enqueues()
    assert "enqueue_svm_memfill" in names  # the enumeration does see what the issue found missing
    unchecked = [n for n in names if n not in table and n not in NO_DEVICE_WORK and n not in NOT_RUNNABLE_HERE]
    assert not unchecked, f"enqueue functions neither traced by a check here nor listed: {unchecked}"
    for n in NOT_RUNNABLE_HERE:  # hooked all the same
        assert getattr(getattr(cl, n), "__wrapped__", None) is not None, n
    warnings.simplefilter("ignore", DeprecationWarning)
    for what, (call, cat, name, nbytes) in table.items():
        RECORDER.clear()
        with cltrace.trace():
            call()
            q.finish()
        spans = [s for s in RECORDER.spans() if s.cat != "sync"]  # q.finish() is a host-side "sync" span
        assert [(s.cat, s.name) for s in spans] == [(cat, n) for n in name.split("+")], what
        assert all(s.device_track is not None and s.status == "ok" for s in spans), what  # device-timed
        if nbytes is not None:
            assert spans[0].attrs["bytes"] == nbytes, (what, spans[0].attrs)


def test_cltrace_own_markers_are_not_commands_of_the_program(queue: Any, instrumented: None) -> None:
    with cltrace.trace():
        cltrace.configure(regions="markers")
        with cltrace.region("r", queue):  # two bracketing markers
            pass
        timer = cltrace.EventTimer(queue)  # two markers (the interval is a region span of its own)
        timer.start()
        timer.stop()
        cltrace.timing(lambda: None, queue=queue, n_warmup=0, n=2)  # markers around each call
        cl.enqueue_marker(queue)  # the program's own
    assert sorted((s.cat, s.name) for s in RECORDER.spans()) == [("marker", "marker"), ("region", "EventTimer"),
                                                                 ("region", "r")]


def test_failed_command_is_recorded_and_raises(cl_ctx: Any, instrumented: None) -> None:
    q = cl.CommandQueue(cl_ctx)
    buf = cl.Buffer(cl_ctx, cl.mem_flags.READ_WRITE, 64)
    with cltrace.trace():
        with pytest.raises(cl.Error):
            cl.enqueue_map_buffer(q, buf, cl.map_flags.READ, 0, (1 << 20,), np.float32)  # past the end
    (s,) = RECORDER.spans()
    assert (s.cat, s.name, s.status) == ("transfer", "map buffer", "error")


def test_uninstrument_restores_every_command_entry_point() -> None:
    before = {(id(c.owner), c.attr): getattr(c.owner, c.attr) for c in ins.COMMANDS if hasattr(c.owner, c.attr)}
    cltrace.instrument()
    try:
        for c in ins.COMMANDS:
            if hasattr(c.owner, c.attr):
                assert getattr(c.owner, c.attr) is not before[(id(c.owner), c.attr)], c.attr
    finally:
        cltrace.uninstrument()
    for c in ins.COMMANDS:
        if hasattr(c.owner, c.attr):
            assert getattr(c.owner, c.attr) is before[(id(c.owner), c.attr)], c.attr
    assert _cl.MemoryMap.release is before[(id(_cl.MemoryMap), "release")]
