"""Reading the profiling stamps of completed events in bulk: events/s of each way, side by side.

Rows (each reads the status and QUEUED, SUBMIT, START, END of every event, into arrays):

  native read        ``stamps.NATIVE.read(handles)``: the C extension, one loop without the GIL
  python read        ``stamps.PYTHON.read(handles)``: the fallback, pyopencl's ``get_profiling_info``
                     on events rebuilt from their handles
  ctypes read        the rejected fallback: the same four ``clGetEventProfilingInfo`` calls per event
                     through ctypes (prebuilt argtypes) on the same library, straight into the array
  pyopencl attrs     what resolution did before: ``ev.command_execution_status`` and
                     ``ev.profile.queued/submit/start/end``, one attribute at a time (the baseline)
  native handles     ``stamps.NATIVE.handles(events)`` (``ev.int_ptr`` of each event), and
  python handles     ``stamps.PYTHON.handles(events)``: part of what a caller pays per event

Events are completed kernels on the default device (PoCL here). Each row keeps the best of
``--repeat`` rounds, rows alternating; the ratio is against ``pyopencl attrs``.

    .venv/bin/python benchmarks/bench_stamps.py [--events 200000] [--repeat 5]
"""
from __future__ import annotations

import argparse
import ctypes
import time
from typing import Any, Callable

import numpy as np
import pyopencl as cl

from cltrace.timeline import stamps

SOURCE = "__kernel void inc(__global float *a) { a[get_global_id(0)] += 1.0f; }"


def completed_kernels(n: int) -> tuple[Any, list[Any]]:
    ctx = cl.create_some_context(interactive=False)
    queue = cl.CommandQueue(ctx, properties=cl.command_queue_properties.PROFILING_ENABLE)
    knl = cl.Program(ctx, SOURCE).build().inc
    buf = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, 4 * 64)
    knl.set_args(buf)
    events = [cl.enqueue_nd_range_kernel(queue, knl, (64,), None) for _ in range(n)]
    queue.finish()
    return queue, events


def ctypes_reader() -> Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]:
    lib = ctypes.CDLL(stamps.opencl_library())
    prof = lib.clGetEventProfilingInfo
    prof.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_void_p]
    prof.restype = ctypes.c_int32

    def read(handles: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        status, out = np.zeros(len(handles), np.int32), np.zeros((len(handles), 4), np.int64)
        base = out.ctypes.data
        for i, h in enumerate(handles.tolist()):
            a = base + 32 * i
            err = prof(h, 0x1283, 8, a + 24, None)
            if err == 0:
                err = prof(h, 0x1280, 8, a, None) or prof(h, 0x1281, 8, a + 8, None) or prof(h, 0x1282, 8, a + 16, None)
            if err:
                status[i] = err
                out[i] = 0
        return status, out

    return read


def pyopencl_attrs(events: list[Any]) -> tuple[np.ndarray, np.ndarray]:
    status = np.fromiter((ev.command_execution_status for ev in events), np.int32, count=len(events))
    rows = []
    for ev in events:
        p = ev.profile
        rows.append((p.queued, p.submit, p.start, p.end))
    return status, np.array(rows, np.int64)


def best(fns: dict[str, Callable[[], Any]], repeat: int) -> dict[str, float]:
    out = {k: float("inf") for k in fns}
    for _ in range(repeat):
        for k, fn in fns.items():
            t = time.perf_counter()
            fn()
            out[k] = min(out[k], time.perf_counter() - t)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=200_000)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()

    print(f"span pipeline: {stamps.DETAIL}")
    _, events = completed_kernels(args.events)
    handles = stamps.PYTHON.handles(events)
    want = pyopencl_attrs(events)
    fns: dict[str, Callable[[], Any]] = {}
    if stamps.NATIVE is not None:
        fns["native read"] = lambda: stamps.NATIVE.read(handles)
    fns["python read"] = lambda: stamps.PYTHON.read(handles)
    ctypes_read = ctypes_reader()
    fns["ctypes read"] = lambda: ctypes_read(handles)
    fns["pyopencl attrs"] = lambda: pyopencl_attrs(events)
    if stamps.NATIVE is not None:
        fns["native handles"] = lambda: stamps.NATIVE.handles(events)
    fns["python handles"] = lambda: stamps.PYTHON.handles(events)
    for name, fn in fns.items():  # every reader must agree with pyopencl before it is timed
        if name.endswith("read"):
            got = fn()
            assert (got[0] == want[0]).all() and (got[1] == want[1]).all(), f"{name} disagrees with pyopencl"

    secs = best(fns, args.repeat)
    base = args.events / secs["pyopencl attrs"]
    print(f"{args.events} completed kernel events on {events[0].command_queue.device.name.strip()}, "
          f"best of {args.repeat}")
    print(f"{'row':<24} {'events/s':>12} {'ns/event':>9} {'vs pyopencl attrs':>18}")
    for name, s in secs.items():
        rate = args.events / s
        print(f"{name:<24} {rate:>12,.0f} {1e9 / rate:>9.0f} {rate / base:>17.2f}x")


if __name__ == "__main__":
    main()
