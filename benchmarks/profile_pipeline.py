"""Where the worker's time goes: cProfile of resolve + statistics + .json + .pftrace on real launches.

    python benchmarks/profile_pipeline.py [--spans 100000] [--top 25]

Prints the time of each stage on its own (stamps read, resolve, stats, each writer) and the
profile's top functions by own time, on the default device (CLTRACE_DEVICE picks it).
"""
from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import tempfile
import time

import pyopencl as cl

import cltrace
from cltrace import _state
from cltrace.export.chrome import ChromeTraceSink
from cltrace.export.perfetto import PerfettoTraceSink
from cltrace.record.recorder import RECORDER
from cltrace.timeline import passes, stamps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--spans", type=int, default=100_000)
    ap.add_argument("--top", type=int, default=25)
    a = ap.parse_args()
    q = cltrace.profiling_queue()
    k = cl.Program(q.context, "__kernel void k(__global float *x) { x[get_global_id(0)] += 1.0f; }").build().k
    buf = cl.Buffer(q.context, cl.mem_flags.READ_WRITE, 4 * 1024)
    RECORDER.configure(max_pending=10 * a.spans, resolve_interval_s=3600)
    _state.ENABLED = True
    for _ in range(a.spans // 10):
        with cltrace.region("step", q):
            for _ in range(9):
                cltrace.launch(k, q, (1024,), None, buf)
    _state.ENABLED = False
    q.finish()
    recs = list(RECORDER.pending)
    RECORDER.pending.clear()
    evs = [e for r in recs for e in (r[9], r[10]) if e is not None]
    t0 = time.perf_counter()
    h = stamps.handles(evs)
    t1 = time.perf_counter()
    stamps.read(h)
    t2 = time.perf_counter()
    print(f"resolver passes: {passes.DETAIL}")
    print(f"stamps {stamps.DETAIL}: handles {len(evs) / (t1 - t0):,.0f}/s, read {len(evs) / (t2 - t1):,.0f} events/s")
    with tempfile.TemporaryDirectory() as tmp:
        js = ChromeTraceSink(os.path.join(tmp, "p.json"))
        pf = PerfettoTraceSink(os.path.join(tmp, "p.pftrace"))
        js.start(RECORDER)
        pf.start(RECORDER)
        stage = dict.fromkeys(("resolve", "stats", "json", "pftrace"), 0.0)
        pr = cProfile.Profile()
        pr.enable()
        for i in range(0, len(recs), 4096):
            t = time.perf_counter()
            b = RECORDER.resolver.resolve(recs[i:i + 4096], block=False)
            t_r = time.perf_counter()
            RECORDER.stats.add(b)
            t_s = time.perf_counter()
            js.write(b)
            t_j = time.perf_counter()
            pf.write(b)
            t_p = time.perf_counter()
            for key, dt in zip(stage, (t_r - t, t_s - t_r, t_j - t_s, t_p - t_j)):
                stage[key] += dt
        pr.disable()
        meta = RECORDER.metadata()
        js.close(meta)
        pf.close(meta)
    n = len(recs)
    print("stage spans/s (profiled): " + ", ".join(f"{k} {n / v:,.0f}" for k, v in stage.items()))
    pstats.Stats(pr).sort_stats("tottime").print_stats(a.top)


if __name__ == "__main__":
    main()
