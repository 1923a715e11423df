"""What the reaper costs a launch loop, side by side in one run: per-launch time of the loop
(50 ``Kernel`` launches + ``finish``, as bench_pipeline's) untraced, traced with records keeping their
Events, traced with tickets at the reaper's default pace, and at a slow pace, and as by default (tickets
only past ``tickets_above`` records waiting for a starved resolver); and the hot path's
ticket alone (``track`` + ``done`` of a completed event).

    python benchmarks/reaper_probe.py [--launches 50000] [--rounds 3]

Only the loop is timed (the resolution after it is not): this isolates what the hot path and the
reaper thread's driver calls take from the launching thread.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np
import pyopencl as cl

import cltrace
from cltrace.record.recorder import RECORDER
from cltrace.timeline import stamps

SRC = "__kernel void k(__global float *x) { x[get_global_id(0)] += 1.0f; }"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--launches", type=int, default=50_000)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    if stamps.REAPER is None:
        sys.exit(f"no reaper here ({stamps.REAPER_DETAIL})")
    from cltrace._ext import stamps as _stamps

    q = cltrace.profiling_queue()
    prg = cltrace.compile(SRC, context=q.context)
    buf = cl.Buffer(q.context, cl.mem_flags.READ_WRITE, 4 * 1024)
    raw_k = cl.Kernel(cl.Program(q.context, SRC).build(), "k")
    raw_k.set_args(buf)
    launcher = prg.k[1024, None, q]
    print(f"device: {q.device.name.strip()}; python {sys.version.split()[0]}; {a.launches} launches a round")

    def loop_raw() -> None:
        for i in range(a.launches // 50):
            for _ in range(50):
                cl.enqueue_nd_range_kernel(q, raw_k, (1024,), None)
            q.finish()

    def loop_traced() -> None:
        for i in range(a.launches // 50):
            for _ in range(50):
                launcher(buf)
            q.finish()

    def variant(name: str) -> float:
        if name == "untraced":
            t = time.perf_counter()
            loop_raw()
            return time.perf_counter() - t
        RECORDER.configure(max_pending=1 << 20, tickets_above=16_384 if name.startswith("default") else 0)
        cltrace.start()
        if name == "events kept":
            was = _stamps.pause_reaper(True)
        elif name == "tickets, slow reaper (2-20 ms)":
            _stamps.reaper_config(2_000_000, 20_000_000)
        before = stamps.reaper_stats()
        t = time.perf_counter()
        loop_traced()
        dt = time.perf_counter() - t
        after = stamps.reaper_stats()
        stats[name].append({k: after[k] - before[k] for k in ("tracked", "reaped", "read_inline", "rounds")})
        if name == "events kept":
            _stamps.pause_reaper(was)
        _stamps.reaper_config(250_000, 2_000_000)
        cltrace.stop()
        RECORDER.clear()
        return dt

    names = ["untraced", "events kept", "tickets (0.25-2 ms)", "tickets, slow reaper (2-20 ms)",
             "default: tickets past 16384 waiting"]
    times: dict[str, list[float]] = {n: [] for n in names}
    stats: dict[str, list[dict]] = {n: [] for n in names}
    for r in range(a.rounds):
        for n in names:
            times[n].append(variant(n))
    base = statistics.median(times["untraced"])
    print(f"\n{'variant':34} {'ns/launch':>10} {'ratio':>7}  reaper (last round)")
    for n in names:
        m = statistics.median(times[n])
        st = stats[n][-1] if stats[n] else {}
        print(f"{n:34} {m / a.launches * 1e9:10.0f} {m / base:7.3f}  {st}")

    ev = cl.enqueue_nd_range_kernel(q, raw_k, (1024,), None)
    q.finish()
    n = 200_000
    track, done = _stamps.track, _stamps.done
    ts = np.empty(n, np.uint64)
    t = time.perf_counter()
    for i in range(n):
        ts[i] = track(ev)
    t_track = time.perf_counter() - t
    done(ts)
    time.sleep(0.1)
    print(f"\nticket of a completed event (track, Python call included): {t_track / n * 1e9:.0f} ns")


if __name__ == "__main__":
    main()
