"""Launch overhead of cltrace.Kernel against pyopencl, side by side in one run.

Steady state (compiled, primed, warm): N launches per variant of a tiny kernel
(1024 floats) so that dispatch dominates. Launches run in blocks, with the
queue drained between blocks; each round times one block of every variant
back to back, so load from other processes falls on all of them alike. A
ratio is the median over rounds of the per-round ratio. Wall clock is the
measure; the thread's CPU time is shown beside it (it leaves out time the
thread was not running, which on a shared machine is mostly other processes).

    python benchmarks/bench_launch.py [--n 20000] [--block 250]

Targets: tracing off, ``knl[gs, ls, q](*args)`` / pyopencl ``knl(q, gs, ls, *args)`` <= 1.03;
tracing on / a raw ``cl.enqueue_nd_range_kernel`` on a profiling queue <= 1.2. The last
table compares a kernel's first launch (program compiled on a cache miss) with a
steady-state launch: the profile's kernel time is END - START of the event and never
contains the compile, which is reported apart as ``compile_ns``.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from typing import Any, Callable

import numpy as np
import pyopencl as cl

import cltrace
from cltrace import _state
from cltrace.programs.compiler import default_queue
from cltrace.record.recorder import RECORDER

SOURCE = """
__kernel void add(__global float *a, __global const float *b) {
    int i = get_global_id(0);
    a[i] += b[i];
}
"""
N_ELEMS = 1024


def timed(fn: Callable[[], Any], queue: Any, n: int) -> tuple[float, float]:
    """(wall, thread CPU) seconds per call of ``fn`` over ``n`` calls, from an empty queue."""
    queue.finish()
    c0 = time.thread_time_ns()
    t0 = time.perf_counter_ns()
    for _ in range(n):
        fn()
    t1 = time.perf_counter_ns()
    c1 = time.thread_time_ns()
    queue.finish()
    return (t1 - t0) / n / 1e9, (c1 - c0) / n / 1e9


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--n", type=int, default=20_000, help="launches per variant")
    ap.add_argument("--block", type=int, default=250, help="launches per block (queue drained between blocks)")
    args = ap.parse_args(argv)
    os.environ.setdefault("CLTRACE_CACHE_DIR", tempfile.mkdtemp(prefix="cltrace-bench-"))

    prg = cltrace.compile(SOURCE)
    ctx = prg.context
    q = default_queue(ctx)
    mf = cl.mem_flags
    host = np.ones(N_ELEMS, np.float32)
    a = cl.Buffer(ctx, mf.READ_WRITE | mf.COPY_HOST_PTR, hostbuf=host)
    b = cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=host)
    gs, ls = (N_ELEMS,), (64,)

    knl = prg.add
    pknl = cl.Kernel(prg.program, "add")  # a plain pyopencl kernel object
    raw = cl.Kernel(prg.program, "add")
    raw.set_args(a, b)
    enqueue = cl.enqueue_nd_range_kernel
    held = knl[gs, ls, q]
    profile = cltrace.LaunchProfile()
    perf = time.perf_counter_ns

    def raw_recorded() -> None:
        """A traced launch through the public API: the raw enqueue, two clock reads, one record_launch.

        Kernel launchers append the same record to the recorder themselves, without record_launch's calls.
        """
        hb = perf()
        ev = enqueue(q, raw, gs, ls)
        cltrace.record_launch("add", q, ev, hb, perf())

    variants: dict[str, tuple[bool, Callable[[], Any]]] = {
        "pyopencl knl(q, gs, ls, a, b)": (False, lambda: pknl(q, gs, ls, a, b)),
        "raw cl.enqueue_nd_range_kernel(q, knl, gs, ls)": (False, lambda: enqueue(q, raw, gs, ls)),
        "off: knl[gs, ls, q](a, b)": (False, lambda: knl[gs, ls, q](a, b)),
        "off: knl(q, gs, ls, a, b)": (False, lambda: knl(q, gs, ls, a, b)),
        "on:  knl[gs, ls, q](a, b)": (True, lambda: knl[gs, ls, q](a, b)),
        "on:  held = knl[gs, ls, q]; held(a, b)": (True, lambda: held(a, b)),
        "on:  knl(q, gs, ls, a, b)": (True, lambda: knl(q, gs, ls, a, b)),
        "on:  cltrace.launch(pyopencl knl, ...)": (True, lambda: cltrace.launch(pknl, q, gs, ls, a, b)),
        "off: knl[gs, ls, q](a, b, profile=p)": (False, lambda: knl[gs, ls, q](a, b, profile=profile)),
        "on:  raw enqueue + 2 clock reads + record": (True, raw_recorded),
    }
    for on, fn in variants.values():  # warm: prime, bind arguments, calibrate the device clock
        _state.ENABLED = on
        for _ in range(200):
            fn()
        _state.ENABLED = False
    q.finish()
    RECORDER.clear()
    profile.reset()

    wall: dict[str, list[float]] = {k: [] for k in variants}
    cpu: dict[str, list[float]] = {k: [] for k in variants}
    rounds = max(1, args.n // args.block)
    for _ in range(rounds):
        for name, (on, fn) in variants.items():
            _state.ENABLED = on
            try:
                w, c = timed(fn, q, args.block)
            finally:
                _state.ENABLED = False
            wall[name].append(w)
            cpu[name].append(c)
        RECORDER.clear()  # resolve and drop what the traced blocks recorded: memory stays bounded
        profile.reset()

    def ratio(series: dict[str, list[float]], num: str, den: str) -> float:
        return statistics.median(x / y for x, y in zip(series[num], series[den]))

    print(f"device: {q.device.name.strip()} ({q.device.platform.name.strip()}) | {rounds} rounds x "
          f"{args.block} launches per variant, {N_ELEMS} floats\n")
    print(f"{'variant':<44} {'wall us/launch':>15} {'cpu us/launch':>14}")
    for name in variants:
        print(f"{name:<44} {statistics.median(wall[name]) * 1e6:>15.3f} {statistics.median(cpu[name]) * 1e6:>14.3f}")
    print()
    pyo, rawk = "pyopencl knl(q, gs, ls, a, b)", "raw cl.enqueue_nd_range_kernel(q, knl, gs, ls)"
    rows = [
        ("off: knl[gs, ls, q](a, b)", pyo, 1.03),
        ("off: knl(q, gs, ls, a, b)", pyo, 1.03),
        ("on:  knl[gs, ls, q](a, b)", rawk, 1.2),
        ("on:  held = knl[gs, ls, q]; held(a, b)", rawk, 1.2),
        ("on:  knl(q, gs, ls, a, b)", rawk, 1.2),
        ("on:  cltrace.launch(pyopencl knl, ...)", rawk, None),
        ("off: knl[gs, ls, q](a, b, profile=p)", rawk, None),
        ("on:  raw enqueue + 2 clock reads + record", rawk, None),
    ]
    print(f"{'ratio (median of per-round ratios)':<44} {'vs':<31} {'wall':>6} {'cpu':>6} {'target':>8}")
    for num, den, target in rows:
        r = ratio(wall, num, den)
        verdict = "" if target is None else ("  met" if r <= target else "  missed")
        tgt = f"<= {target}" if target else ""
        print(f"{num:<44} {den[:31]:<31} {r:>6.3f} {ratio(cpu, num, den):>6.3f} {tgt:>8}{verdict}")

    print()
    cold = cltrace.compile(SOURCE + f"\n// cold {time.time_ns()}\n", cache=cltrace.ProgramCache(tempfile.mkdtemp()))
    first = cltrace.LaunchProfile()
    cold.add[gs, ls, q](a, b, profile=first)
    for _ in range(200):
        cold.add[gs, ls, q](a, b)
    steady = cltrace.LaunchProfile()
    cold.add[gs, ls, q](a, b, profile=steady)
    q.finish()
    print(f"program compile: cache {cold.cache_hit}, {cold.compile_ns} ns")
    print(f"{'launch':<14} {'compile_ns':>12} {'kernel_ns':>10} {'END-START':>10} {'enqueue_ns':>11} {'from_cache':>10}")
    for name, p in (("first", first), ("steady-state", steady)):
        ev = p.event
        print(f"{name:<14} {p.compile_ns:>12} {p.kernel_ns:>10} {ev.profile.end - ev.profile.start:>10} "
              f"{p.enqueue_ns:>11} {str(p.from_cache):>10}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
