"""Reading stamps on the launching thread, in batches, when its queue has run dry: what it costs a
launch loop that never waits. Raw pyopencl enqueues of a tiny kernel; side by side in one run
(median of rounds, ns a launch, ratio to the untraced loop).

  untraced          the loop alone (one ``finish`` at the end)
  held              every event kept; read and released after the loop (what ``quiet`` does)
  dry K             every K launches, if the newest event is complete (the device has caught up:
                    the loop is launch-bound), ``finish`` and read + release the K held events
  finish K          the same without asking the status first
  held K            the loop keeps K events and drops the oldest (nothing read): the holding cost

    python benchmarks/inline_probe.py [--launches 100000] [--rounds 3]
"""
from __future__ import annotations

import argparse
import statistics
import time

import pyopencl as cl

import cltrace  # noqa: F401  (loads the native stamps reader)
from cltrace.timeline import stamps

SRC = "__kernel void k(__global float *x) { x[get_global_id(0)] += 1.0f; }"
COMPLETE = cl.command_execution_status.COMPLETE


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--launches", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    ctx = cl.create_some_context(interactive=False)
    q = cl.CommandQueue(ctx, properties=cl.command_queue_properties.PROFILING_ENABLE)
    buf = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, 4 * 1024)
    k = cl.Kernel(cl.Program(ctx, SRC).build(), "k")
    k.set_args(buf)
    enqueue = cl.enqueue_nd_range_kernel
    n = a.launches
    inside: dict = {}

    def read(evs: list) -> None:
        status, _ = stamps.read(stamps.handles(evs))
        assert (status == 0).all()

    def untraced() -> None:
        for _ in range(n):
            enqueue(q, k, (1024,), None)
        q.finish()

    def held() -> None:
        evs = [enqueue(q, k, (1024,), None) for _ in range(n)]
        q.finish()
        read(evs)
        evs.clear()

    def dry(every: int, ask: bool):
        def loop() -> None:
            evs: list = []
            spent = reads = 0
            for i in range(n):
                evs.append(enqueue(q, k, (1024,), None))
                if len(evs) >= every and (not ask or evs[-1].command_execution_status == COMPLETE
                                          or len(evs) >= 65536):
                    t = time.perf_counter_ns()
                    q.finish()
                    read(evs)
                    evs.clear()
                    spent += time.perf_counter_ns() - t
                    reads += 1
            q.finish()
            read(evs)
            inside.setdefault(loop, []).append((spent, reads))
        return loop

    def keep(kept: int):
        def loop() -> None:
            evs: list = []
            for i in range(n):
                evs.append(enqueue(q, k, (1024,), None))
                if len(evs) >= 2 * kept:
                    del evs[:kept]
            q.finish()
        return loop

    variants = {"untraced": untraced, "held": held}
    for every in (256, 1024, 4096):
        variants[f"dry {every}"] = dry(every, True)
    variants["finish 1024"] = dry(1024, False)
    variants["held 4096"] = keep(4096)
    times: dict = {name: [] for name in variants}
    untraced()
    for _ in range(a.rounds):
        for name, f in variants.items():
            t = time.perf_counter_ns()
            f()
            times[name].append(time.perf_counter_ns() - t)
    base = statistics.median(times["untraced"])
    print(f"{'variant':14} {'ns/launch':>10} {'ratio':>6}  inside reads (ms a round, batches)")
    for name, ts in times.items():
        med = statistics.median(ts)
        f = variants[name]
        extra = ""
        if f in inside:
            spent = statistics.median(s for s, _ in inside[f]) / 1e6
            batches = statistics.median(r for _, r in inside[f])
            extra = f"{spent:.1f} ms, {batches:.0f}"
        print(f"{name:14} {med / n:10.0f} {med / base:6.3f}  {extra}")


if __name__ == "__main__":
    main()
