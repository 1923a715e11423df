"""After many events are released at once, do the next enqueues pause? (NVIDIA's driver, no cltrace.)

    python benchmarks/release_probe.py [--keep 60000] [--rounds 3]

Each round: a loop of ``--keep`` launches that keeps every Event, the Events dropped at once, then a second
loop of as many launches (events dropped as they come) timed per launch; printed: the longest gap between two
launches of that loop and when it came, against a round that kept nothing. Two launching threads are not
needed: a pause here is the driver's own.
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import pyopencl as cl

import cltrace


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--keep", type=int, default=60_000)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    q = cltrace.profiling_queue()
    k = cl.Program(q.context, "__kernel void k(__global float *x) { x[get_global_id(0)] += 1.0f; }").build().k
    buf = cl.Buffer(q.context, cl.mem_flags.READ_WRITE, 4 * 1024)
    k.set_args(buf)
    enq, perf = cl.enqueue_nd_range_kernel, time.perf_counter_ns
    print(f"device: {q.device.name.strip()}")
    for r in range(a.rounds):
        for keep in (False, True):
            kept = [enq(q, k, (1024,), None) for _ in range(a.keep)] if keep else []
            q.finish()
            t0 = perf()
            del kept
            freed = perf() - t0
            stamps = np.empty(a.keep + 1, np.int64)
            stamps[0] = perf()
            for i in range(1, a.keep + 1):
                enq(q, k, (1024,), None)
                stamps[i] = perf()
            q.finish()
            gaps = np.diff(stamps)
            at = int(np.argmax(gaps))
            print(f"round {r} {'kept' if keep else 'none'}: release {freed / 1e6:6.1f} ms; next loop: median "
                  f"{np.median(gaps) / 1e3:5.1f} us, longest {gaps[at] / 1e6:6.2f} ms at launch {at} "
                  f"({(stamps[at] - stamps[0]) / 1e6:.1f} ms in)")


if __name__ == "__main__":
    main()
