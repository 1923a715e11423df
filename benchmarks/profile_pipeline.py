"""Where the worker's time goes: resolve + statistics + .json + .pftrace on real launches, per stage.

    python benchmarks/profile_pipeline.py [--spans 100000] [--top 25]

Records twice ``--spans`` launches and regions on the default device (CLTRACE_DEVICE picks it), then
prints the stamps read, a table of each stage's spans/s on the first half without the profiler (wall
clock and this thread's CPU time, which a loaded machine disturbs less; "close" is the files' final
flush and fsync), and the second half under cProfile with its top functions by own time.
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
from cltrace.export import chrome_lines
from cltrace.export.chrome import ChromeTraceSink
from cltrace.export.perfetto import PerfettoTraceSink, encoder
from cltrace.record.recorder import RECORDER
from cltrace.timeline import passes, stamps


STAGES = ("resolve", "stats", "json", "pftrace")
PLAIN = False  # --plain


def run(recs: list, tmp: str, tag: str, pr: cProfile.Profile | None = None, step: int = 4096) -> dict[str, tuple[float, float]]:
    """The worker's job on ``recs``: (wall, CPU) seconds per stage, and of closing both files."""
    js = ChromeTraceSink(os.path.join(tmp, f"{tag}.json"))
    pf = PerfettoTraceSink(os.path.join(tmp, f"{tag}.pftrace"), compress=not PLAIN)
    js.start(RECORDER)
    pf.start(RECORDER)
    wall = dict.fromkeys(STAGES + ("close",), 0.0)
    cpu = dict(wall)
    if pr is not None:
        pr.enable()
    for i in range(0, len(recs), step):
        marks = [(time.perf_counter(), time.thread_time())]
        b = RECORDER.resolver.resolve(recs[i:i + step], block=False)
        marks.append((time.perf_counter(), time.thread_time()))
        RECORDER.stats.add(b)
        marks.append((time.perf_counter(), time.thread_time()))
        js.write(b)
        marks.append((time.perf_counter(), time.thread_time()))
        pf.write(b)
        marks.append((time.perf_counter(), time.thread_time()))
        for key, (w0, c0), (w1, c1) in zip(STAGES, marks, marks[1:]):
            wall[key] += w1 - w0
            cpu[key] += c1 - c0
    w0, c0 = time.perf_counter(), time.thread_time()
    meta = RECORDER.metadata()
    js.close(meta)
    pf.close(meta)
    wall["close"] += time.perf_counter() - w0
    cpu["close"] += time.thread_time() - c0
    if pr is not None:
        pr.disable()
    return {k: (wall[k], cpu[k]) for k in wall}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--spans", type=int, default=100_000)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--plain", action="store_true", help="the .pftrace written plain (compress=False)")
    ap.add_argument("--batch", type=int, default=4096, help="records resolved per step")
    ap.add_argument("--tickets", action="store_true", help="records hold the reaper's tickets (default: their events)")
    a = ap.parse_args()
    global PLAIN
    PLAIN = a.plain
    q = cltrace.profiling_queue()
    k = cl.Program(q.context, "__kernel void k(__global float *x) { x[get_global_id(0)] += 1.0f; }").build().k
    buf = cl.Buffer(q.context, cl.mem_flags.READ_WRITE, 4 * 1024)
    RECORDER.configure(max_pending=20 * a.spans, resolve_interval_s=3600,
                       tickets_above=0 if a.tickets else 1 << 62)
    _state.ENABLED = True
    for _ in range(2 * a.spans // 10):
        with cltrace.region("step", q):
            for _ in range(9):
                cltrace.launch(k, q, (1024,), None, buf)
    _state.ENABLED = False
    q.finish()
    recs = list(RECORDER.pending)
    RECORDER.pending.clear()
    half = len(recs) // 2
    print(f"resolver passes: {passes.DETAIL}; json encoder: {chrome_lines.DETAIL}; pftrace encoder: {encoder.DETAIL}")
    if not a.tickets:
        evs = [e for r in recs[:half] for e in (r[9], r[10]) if e is not None]
        t0 = time.perf_counter()
        h = stamps.handles(evs)
        t1 = time.perf_counter()
        stamps.read(h)
        t2 = time.perf_counter()
        print(f"stamps {stamps.DETAIL}: handles {len(evs) / (t1 - t0):,.0f}/s, read {len(evs) / (t2 - t1):,.0f} events/s")
    pr = cProfile.Profile()
    with tempfile.TemporaryDirectory() as tmp:
        plain = run(recs[:half], tmp, "plain", step=a.batch)
        profiled = run(recs[half:], tmp, "profiled", pr, step=a.batch)
    n = half
    rows = [("stage", "spans/s wall", "spans/s CPU", "ns/span CPU", "spans/s profiled")]
    for key in STAGES + ("close",):
        (w, c), (pw, _) = plain[key], profiled[key]
        rows.append((key, f"{n / w:,.0f}", f"{n / c:,.0f}", f"{c / n * 1e9:,.0f}", f"{(len(recs) - half) / pw:,.0f}"))
    w, c = (sum(v[j] for v in plain.values()) for j in (0, 1))
    rows.append(("all", f"{n / w:,.0f}", f"{n / c:,.0f}", f"{c / n * 1e9:,.0f}", "-"))
    width = [max(len(r[i]) for r in rows) for i in range(5)]
    print()
    for r in rows:
        print("  ".join(cell.rjust(width[i]) if i else cell.ljust(width[i]) for i, cell in enumerate(r)))
    print()
    pstats.Stats(pr).sort_stats("tottime").print_stats(a.top)


if __name__ == "__main__":
    main()
