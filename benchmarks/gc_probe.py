"""Which collections of Python's cyclic GC pause traced threads, and what they collect.

    python benchmarks/gc_probe.py [--seconds 3]

Runs the stall loop of ``stall_probe.py`` (two threads: 50 launches, finish, an empty region)
traced into .json+.pftrace, logs every collection over 5 ms (generation, thread, duration, objects
collected, young objects at its start), then repeats with ``gc.DEBUG_SAVEALL`` and prints the types
of the cyclic garbage made while tracing.
"""
from __future__ import annotations

import argparse
import collections
import gc
import os
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(__file__))
from stall_probe import SRC, loop  # noqa: E402

import pyopencl as cl  # noqa: E402

import cltrace  # noqa: E402
from cltrace.record.recorder import RECORDER  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=3.0)
    a = ap.parse_args()
    q = cltrace.profiling_queue()
    prg = cl.Program(q.context, SRC).build()
    buf = cl.Buffer(q.context, cl.mem_flags.READ_WRITE, 4 * 1024)
    long: list[tuple] = []
    started: dict[int, tuple[float, tuple[int, int, int]]] = {}

    def cb(phase: str, info: dict) -> None:
        me = threading.get_ident()
        if phase == "start":
            started[me] = (time.perf_counter(), gc.get_count())
        elif me in started:
            t0, count = started.pop(me)
            dt = time.perf_counter() - t0
            if dt > 0.005:
                long.append((info["generation"], threading.current_thread().name, dt * 1e3,
                             info.get("collected"), count))

    gc.callbacks.append(cb)
    with tempfile.TemporaryDirectory() as tmp:
        for name, prep in (("default", lambda: None), ("gc.freeze() at start", gc.freeze),
                           ("threshold 50000", lambda: gc.set_threshold(50000, 10, 10))):
            RECORDER.clear()
            gc.collect()
            prep()
            long.clear()
            cltrace.start(os.path.join(tmp, "a.json"), os.path.join(tmp, "a.pftrace"))
            worst, at, _ = loop(q, prg, buf, a.seconds)
            cltrace.stop()
            gc.unfreeze()
            gc.set_threshold(700, 10, 10)
            print(f"{name}: longest pause {worst * 1e3:.2f} ms at {at:.2f} s; recorded {RECORDER.recorded}, lost {RECORDER.lost}")
            for gen, thread, ms, collected, count in sorted(long, key=lambda x: -x[2])[:8]:
                print(f"   gen{gen} in {thread}: {ms:.1f} ms, collected {collected}, counts at start {count}")
        gc.collect()
        gc.set_debug(gc.DEBUG_SAVEALL)
        cltrace.start(os.path.join(tmp, "b.json"), os.path.join(tmp, "b.pftrace"))
        loop(q, prg, buf, a.seconds)
        cltrace.stop()
        gc.collect()
        kinds = collections.Counter(f"{type(o).__module__}.{type(o).__qualname__}" for o in gc.garbage)
        print(f"cyclic garbage while tracing: {len(gc.garbage)} objects")
        for k, v in kinds.most_common(15):
            print(f"   {v:9d} {k}")
        gc.set_debug(0)
        gc.garbage.clear()


if __name__ == "__main__":
    main()
