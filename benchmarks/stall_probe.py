"""Where a traced thread's longest pause comes from: the stall loop of bench_pipeline under variants.

    python benchmarks/stall_probe.py [--seconds 3]

Each variant prints the longest pause between iterations (50 launches + finish + an empty region) on
two threads, when in the run it happened, and the worker's counters at the end.
"""
from __future__ import annotations

import argparse
import gc
import os
import tempfile
import threading
import time

import pyopencl as cl

import cltrace
from cltrace.record.recorder import RECORDER

SRC = "__kernel void k(__global float *x) { x[get_global_id(0)] += 1.0f; }"


def setup() -> tuple[cl.CommandQueue, cl.Program, cl.Buffer]:
    """The stall loop's profiling queue, its program (``SRC``) and the kernel's buffer."""
    q = cltrace.profiling_queue()
    return q, cl.Program(q.context, SRC).build(), cl.Buffer(q.context, cl.mem_flags.READ_WRITE, 4 * 1024)


def iteration(k: cl.Kernel, q: cl.CommandQueue, buf: cl.Buffer) -> None:
    """One iteration of the stall loop: 50 launches, a finish, an empty region."""
    for _ in range(50):
        cltrace.launch(k, q, (1024,), None, buf)
    q.finish()
    with cltrace.region("empty"):
        pass


def loop(q: cl.CommandQueue, prg: cl.Program, buf: cl.Buffer, seconds: float) -> tuple[float, float, int]:
    """The longest pause between two threads' iterations, when it began (s), and the iterations done."""
    worst = [0.0, 0.0]
    done = [0]
    t0 = time.perf_counter()

    # Each thread builds its Kernel before the clock starts: pyopencl loads a new Kernel's invoker from
    # its on-disk cache (SQLite, unpickling, exec) holding the GIL, which paused the other thread for
    # 3-14 ms on an H200 host, traced or not (benchmarks/carry_probe.py).
    ready = threading.Barrier(2)

    def body() -> None:
        k = cl.Kernel(prg, "k")
        ready.wait()
        end = time.perf_counter() + seconds
        last = time.perf_counter()
        while time.perf_counter() < end:
            iteration(k, q, buf)
            now = time.perf_counter()
            if now - last > worst[0]:
                worst[0], worst[1] = now - last, last - t0
            last = now
            done[0] += 1

    ts = [threading.Thread(target=body) for _ in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return worst[0], worst[1], done[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--heap", type=int, default=0, help="GC-tracked objects the program holds (e.g. 3000000)")
    a = ap.parse_args()
    q, prg, buf = setup()
    heap = [[i] for i in range(a.heap)]  # a program's own long-lived objects, which a full GC walks
    print(f"heap: {len(heap)} objects the collector tracks")
    print("untraced: longest %.2f ms at %.2f s" % tuple(x * f for x, f in zip(loop(q, prg, buf, 1.0)[:2], (1e3, 1))))
    with tempfile.TemporaryDirectory() as tmp:
        variants = {
            "no outputs": lambda: cltrace.start(),
            "no recalibration": lambda: (setattr(RECORDER.clocks, "recalibrate_s", 1e9),
                                         cltrace.start(os.path.join(tmp, "a.json"), os.path.join(tmp, "a.pftrace"))),
            "json+pftrace": lambda: (setattr(RECORDER.clocks, "recalibrate_s", 2.0),
                                     cltrace.start(os.path.join(tmp, "b.json"), os.path.join(tmp, "b.pftrace"))),
            "json+pftrace again (clock exists)": lambda: cltrace.start(os.path.join(tmp, "c.json")),
            "json+pftrace, cyclic GC off": lambda: (gc.disable(), cltrace.start(os.path.join(tmp, "d.json"),
                                                                                os.path.join(tmp, "d.pftrace"))),
        }
        for name, begin in variants.items():
            RECORDER.clear()
            t = time.perf_counter()
            begin()
            started = time.perf_counter() - t
            worst, at, _ = loop(q, prg, buf, a.seconds)
            cltrace.stop()
            gc.enable()
            print(f"{name}: start() {started * 1e3:.1f} ms; longest {worst * 1e3:.2f} ms at {at:.2f} s; "
                  f"recorded {RECORDER.recorded}, lost {RECORDER.lost}")


if __name__ == "__main__":
    main()
