"""When a traced thread's long pauses happen, beside what cltrace's worker was doing then.

    python benchmarks/stall_when.py [--seconds 3] [--over-ms 6]

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
    a = ap.parse_args()
    perf = time.perf_counter
    q, prg, buf = setup()
    spans: list[tuple[str, float, float]] = []

    def wrap(obj: object, attr: str, label: str) -> None:
        fn = getattr(obj, attr)

        def timed(*args, **kwargs):  # type: ignore[no-untyped-def]
            t0 = perf()
            try:
                return fn(*args, **kwargs)
            finally:
                spans.append((label, t0, perf()))
        setattr(obj, attr, timed)

    wrap(RECORDER, "_step", "worker step")
    wrap(RECORDER, "_flush_sinks", "flush sinks")
    wrap(RECORDER.clocks, "maybe_recalibrate", "recalibrate")
    pauses: list[tuple[str, float, float]] = []

    def body() -> None:
        k = cl.Kernel(prg, "k")
        end = perf() + a.seconds
        last = perf()
        me = threading.current_thread().name
        while perf() < end:
            iteration(k, q, buf)
            now = perf()
            if now - last > a.over_ms / 1e3:
                pauses.append((me, last, now))
            last = now

    with tempfile.TemporaryDirectory() as tmp:
        cltrace.start(os.path.join(tmp, "a.json"), os.path.join(tmp, "a.pftrace"))
        t0 = perf()
        ts = [threading.Thread(target=body, name=f"launcher-{i}") for i in range(2)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        cltrace.stop()
    for who, b, e in sorted(pauses, key=lambda p: p[1]):
        near = [f"{lab} {1e3 * (sb - t0):.1f}-{1e3 * (se - t0):.1f}" for lab, sb, se in spans if sb < e and se > b]
        print(f"{who}: paused {1e3 * (e - b):.1f} ms at {1e3 * (b - t0):.1f} ms; overlapping: {', '.join(near) or '-'}")
    steps = [se - sb for lab, sb, se in spans if lab == "worker step"]
    print(f"{len(pauses)} pauses over {a.over_ms:g} ms; worker steps {len(steps)}, longest {1e3 * max(steps, default=0):.1f} ms")


if __name__ == "__main__":
    main()
