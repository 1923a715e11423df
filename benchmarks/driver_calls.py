"""ns per OpenCL driver call on an event, through ctypes (its own ~0.1-0.3 us per call included, the same in
every row): what reading, retaining and releasing a command's event costs on this driver.

    python benchmarks/driver_calls.py [--n 100000]
"""
from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import time

import pyopencl as cl

import cltrace
from cltrace.timeline import stamps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=100_000)
    n = ap.parse_args().n
    q = cltrace.profiling_queue()
    lib = ctypes.CDLL(stamps.opencl_library() or ctypes.util.find_library("OpenCL") or "libOpenCL.so.1")
    prg = cl.Program(q.context, "__kernel void k(__global float *x) { x[get_global_id(0)] += 1.0f; }").build()
    buf = cl.Buffer(q.context, cl.mem_flags.READ_WRITE, 4096)
    ev = cl.Kernel(prg, "k")(q, (1024,), None, buf)
    q.finish()
    h = ctypes.c_void_p(ev.int_ptr)
    out64, out32 = ctypes.c_uint64(), ctypes.c_uint32()
    info, prof, retain, release = lib.clGetEventInfo, lib.clGetEventProfilingInfo, lib.clRetainEvent, lib.clReleaseEvent
    for f in (info, prof):
        f.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_void_p]
    retain.argtypes = release.argtypes = [ctypes.c_void_p]
    p64, p32 = ctypes.byref(out64), ctypes.byref(out32)
    CL_EVENT_REFERENCE_COUNT, CL_EVENT_COMMAND_EXECUTION_STATUS, CL_PROFILING_COMMAND_END = 0x11D2, 0x11D3, 0x1283

    def loop(label: str, body) -> None:
        best = float("inf")
        for _ in range(5):
            t0 = time.perf_counter()
            body()
            best = min(best, time.perf_counter() - t0)
        print(f"  {label:44s} {best / n * 1e9:8.0f} ns")

    def empty() -> None:
        for _ in range(n):
            pass

    def status() -> None:
        for _ in range(n):
            info(h, CL_EVENT_COMMAND_EXECUTION_STATUS, 4, p32, None)

    def refcount() -> None:
        for _ in range(n):
            info(h, CL_EVENT_REFERENCE_COUNT, 4, p32, None)

    def end() -> None:
        for _ in range(n):
            prof(h, CL_PROFILING_COMMAND_END, 8, p64, None)

    def pair() -> None:
        for _ in range(n):
            retain(h)
            release(h)

    print(f"device: {q.device.name.strip()}; per call, ctypes included:")
    for label, body in (("empty loop", empty), ("clGetEventInfo(status)", status),
                        ("clGetEventInfo(reference count)", refcount), ("clGetEventProfilingInfo(END)", end),
                        ("clRetainEvent + clReleaseEvent (two calls)", pair)):
        loop(label, body)


if __name__ == "__main__":
    main()
