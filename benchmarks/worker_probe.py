"""What the resolver thread does while a launch loop runs: its wake-ups, steps and records per step.

    python benchmarks/worker_probe.py [--seconds 3] [--threads 1]      (CLTRACE_REAPER=0: without the reaper)

Counts, every 250 ms, how often the worker woke, how many steps it ran, the records those steps took
and resolved, and the backlog: a worker that wakes but takes nothing, or never wakes, shows here.
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
from cltrace.timeline import stamps

sys.path.insert(0, os.path.dirname(__file__))
from stall_probe import SRC  # noqa: E402


class SleepingEvent:
    """An Event whose wait is a plain sleep (no Condition, no timed lock acquire)."""

    def __init__(self) -> None:
        self.waits = 0
        self.flag = False

    def wait(self, timeout: float | None = None) -> bool:
        self.waits += 1
        time.sleep(timeout or 0)
        return self.flag

    def set(self) -> None:
        self.flag = True

    def clear(self) -> None:
        self.flag = False

    def is_set(self) -> bool:
        return self.flag


class CountingEvent(threading.Event):
    def __init__(self) -> None:
        super().__init__()
        self.waits = 0

    def wait(self, timeout: float | None = None) -> bool:
        self.waits += 1
        return super().wait(timeout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--sleep-wake", action="store_true", help="the worker sleeps instead of waiting on an Event")
    a = ap.parse_args()
    q = cltrace.profiling_queue()
    prg = cl.Program(q.context, SRC).build()
    buf = cl.Buffer(q.context, cl.mem_flags.READ_WRITE, 4 * 1024)
    steps = {"n": 0, "took": 0, "resolved": 0, "s": 0.0}
    step = RECORDER._step

    def counting_step(block: bool, limit_records: int | None = None, wait_limit: int | None = None):
        before = len(RECORDER.pending)
        t = time.perf_counter()
        out = step(block, limit_records, wait_limit)
        steps["s"] += time.perf_counter() - t
        steps["n"] += 1
        steps["took"] += before - len(RECORDER.pending)
        steps["resolved"] += out.n
        return out

    RECORDER._step = counting_step  # type: ignore[method-assign]
    RECORDER._wake = wake = SleepingEvent() if a.sleep_wake else CountingEvent()  # type: ignore[assignment]

    def body() -> None:
        k = cl.Kernel(prg, "k")
        end = time.perf_counter() + a.seconds
        while time.perf_counter() < end:
            for _ in range(50):
                cltrace.launch(k, q, (1024,), None, buf)
            q.finish()

    with tempfile.TemporaryDirectory() as tmp:
        cltrace.start(os.path.join(tmp, "a.json"), os.path.join(tmp, "a.pftrace"))
        ts = [threading.Thread(target=body) for _ in range(a.threads)]
        for t in ts:
            t.start()
        t0 = time.perf_counter()
        while any(t.is_alive() for t in ts):
            time.sleep(0.25)
            print(f"{time.perf_counter() - t0:5.2f} s: woke {wake.waits}, steps {steps['n']} ({steps['s'] * 1e3:.0f} ms), "
                  f"took {steps['took']}, resolved {steps['resolved']}, pending {len(RECORDER.pending)}, "
                  f"waiting {len(RECORDER.resolver.waiting)}, lost {RECORDER.lost}, events held by the reaper "
                  f"{(stamps.reaper_stats() or {}).get('held', 'n/a (off)')}, worker alive "
                  f"{RECORDER._worker is not None and RECORDER._worker.is_alive()}", flush=True)
        cltrace.stop()


if __name__ == "__main__":
    main()
