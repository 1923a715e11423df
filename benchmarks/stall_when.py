"""When a traced thread's long pauses happen, beside what cltrace's worker was doing then.

    python benchmarks/stall_when.py [--seconds 3] [--over-ms 6] [--trials 1] [--untraced-first]

bench_pipeline's stall loop (two threads, 50 launches + finish + an empty region an iteration), traced
to .json + .pftrace. Each pause of a launching thread over ``--over-ms`` is printed with the worker's
steps, flushes and clock recalibrations that overlapped it (each wrapped here and timed, wall clock).
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time

import pyopencl as cl

import cltrace
from cltrace.record.recorder import RECORDER

sys.path.insert(0, os.path.dirname(__file__))
from stall_probe import iteration, setup  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--over-ms", type=float, default=6.0)
    ap.add_argument("--trials", type=int, default=1)
    ap.add_argument("--parts", action="store_true", help="also time the step's pieces (worker CPU a record)")
    ap.add_argument("--untraced-first", action="store_true",
                    help="an untraced run of --seconds before each traced one (bench_pipeline's stall row)")
    a = ap.parse_args()
    perf = time.perf_counter
    q, prg, buf = setup()
    spans: list[tuple[str, float, float]] = []
    cpu: list[tuple[str, float, int]] = []  # each wrapped call's CPU time on its thread, records taken

    def wrap(obj: object, attr: str, label: str) -> None:
        fn = getattr(obj, attr)

        def timed(*args, **kwargs):  # type: ignore[no-untyped-def]
            t0, c0, n0 = perf(), time.thread_time(), len(RECORDER.pending)
            try:
                return fn(*args, **kwargs)
            finally:
                spans.append((label, t0, perf()))
                cpu.append((label, time.thread_time() - c0, n0 - len(RECORDER.pending)))
        setattr(obj, attr, timed)

    wrap(RECORDER, "_step", "worker step")
    wrap(RECORDER, "_flush_sinks", "flush sinks")
    wrap(RECORDER.clocks, "maybe_recalibrate", "recalibrate")
    parts = ("resolve", "stats", "keep", "sink .json", "sink .pftrace")
    if a.parts:  # the step's pieces, each timed on the worker's CPU clock
        wrap(RECORDER.resolver, "resolve", "resolve")
        wrap(RECORDER, "_keep", "keep")
        from cltrace.export.chrome import ChromeTraceSink
        from cltrace.export.perfetto.sink import PerfettoTraceSink
        wrap(ChromeTraceSink, "write", "sink .json")
        wrap(PerfettoTraceSink, "write", "sink .pftrace")
    pauses: list[tuple[str, float, float]] = []

    def loop(seconds: float) -> None:
        ready = threading.Barrier(2)  # both Kernels built before either loop starts (stall_probe.loop)

        def body() -> None:
            k = cl.Kernel(prg, "k")
            ready.wait()
            end = perf() + seconds
            last = perf()
            me = threading.current_thread().name
            while perf() < end:
                iteration(k, q, buf)
                now = perf()
                if now - last > a.over_ms / 1e3:
                    pauses.append((me, last, now))
                last = now

        ts = [threading.Thread(target=body, name=f"launcher-{i}") for i in range(2)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()

    with tempfile.TemporaryDirectory() as tmp:
        for trial in range(a.trials):

            if a.untraced_first:
                sys.setswitchinterval(RECORDER.switch_interval_s or sys.getswitchinterval())
                loop(a.seconds)  # as bench_pipeline's stall row: an untraced run before each traced one
                pauses.clear()
            RECORDER.clear()
            if a.parts:
                wrap(RECORDER.stats, "add", "stats")  # clear() made a fresh Stats
            spans.clear()
            cltrace.start(os.path.join(tmp, "a.json"), os.path.join(tmp, "a.pftrace"))
            t0 = perf()
            loop(a.seconds)
            cltrace.stop()
            print(f"trial {trial}:")
            for who, b, e in sorted(pauses, key=lambda p: p[1]):
                near = [f"{lab} {1e3 * (sb - t0):.1f}-{1e3 * (se - t0):.1f}"
                        for lab, sb, se in spans if sb < e and se > b]
                print(f"  {who}: paused {1e3 * (e - b):.1f} ms at {1e3 * (b - t0):.1f} ms; "
                      f"overlapping: {', '.join(near) or '-'}")
            steps = [se - sb for lab, sb, se in spans if lab == "worker step"]
            sc = [(c, n) for lab, c, n in cpu if lab == "worker step"]
            rows = sum(n for _, n in sc)
            print(f"  {len(pauses)} pauses over {a.over_ms:g} ms; worker steps {len(steps)}, "
                  f"longest {1e3 * max(steps, default=0):.1f} ms wall, {rows / max(1, len(sc)):.0f} records and "
                  f"{1e3 * sum(c for c, _ in sc) / max(1, len(sc)):.2f} ms CPU a step "
                  f"({1e9 * sum(c for c, _ in sc) / max(1, rows):.0f} ns a record); "
                  f"flushes {1e3 * sum(c for lab, c, _ in cpu if lab == 'flush sinks'):.1f} ms CPU")
            if a.parts:
                print("  worker CPU a record: " + ", ".join(
                    f"{p} {1e9 * sum(c for lab, c, _ in cpu if lab == p) / max(1, rows):.0f} ns" for p in parts))
            pauses.clear()
            cpu.clear()


if __name__ == "__main__":
    main()
