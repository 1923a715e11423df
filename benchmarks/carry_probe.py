"""The pause that follows stall_parts' "hot path" trial: where it is, one trial after another.

    python benchmarks/carry_probe.py [--trials 4] [--seconds 1] [--first "hot path"] [--then reaper]
        [--dump-ms 8] [--dump-dir DIR] [--barrier]

Variants: untraced, hot path, reaper, worker (as in stall_parts) and files (reaper + worker + .json and
.pftrace).

Each trial runs the ``--first`` variant of stall_parts, then the ``--then`` variant with each launching
thread's iterations split into launches / finish / region; printed for the ``--then`` run: its longest
pause, which part of the iteration it was in and when, against a ``--then`` run that follows another
``--then`` run. With ``--dump-ms``, faulthandler dumps every thread's stack (from its own C thread, so a
thread holding the GIL in a C call is seen) into ``--dump-dir`` whenever an iteration overruns.

Found on an H200 host (fifteenth session): the 10-14 ms pause at 0.014 s into the run was the other
launching thread building its ``cl.Kernel`` (pyopencl loads the invoker from its SQLite cache, unpickles
and execs it, with no in-memory cache) while this one already looped. ``--barrier`` starts both loops
after both Kernels exist, as ``stall_probe.loop`` now does.
"""
from __future__ import annotations

import argparse
import contextlib
import faulthandler
import os
import sys
import tempfile
import threading
import time

import pyopencl as cl

import cltrace
from cltrace.record.recorder import RECORDER

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from stall_parts import reaper, worker_held  # noqa: E402
from stall_probe import setup  # noqa: E402

VARIANTS = {  # name: (context managers, traced, files)
    "untraced": ((), False, ()),
    "hot path": ((worker_held, lambda: reaper(paused=True)), True, ()),
    "reaper": ((worker_held, reaper), True, ()),
    "worker": ((reaper,), True, ()),
    "files": ((reaper,), True, ("json", "pftrace")),
}


def timed_loop(q, prg, buf, seconds: float, dump: str | None, dump_ms: float, barrier: bool) -> dict:
    """Two threads of the stall loop; the longest gap, split into launches / finish / region."""
    worst = {"gap": 0.0}
    t0 = time.perf_counter()
    lock = threading.Lock()

    ready = threading.Barrier(2) if barrier else None

    def body() -> None:
        k = cl.Kernel(prg, "k")
        if ready is not None:
            ready.wait()
        perf = time.perf_counter
        end = perf() + seconds
        last = perf()
        f = open(dump, "a") if dump else None
        while perf() < end:
            if f is not None:
                faulthandler.dump_traceback_later(dump_ms / 1e3, repeat=False, file=f)
            a = perf()
            for _ in range(50):
                cltrace.launch(k, q, (1024,), None, buf)
            b = perf()
            q.finish()
            c = perf()
            with cltrace.region("empty"):
                pass
            now = perf()
            if now - last > worst["gap"]:
                with lock:
                    worst.update(gap=now - last, at=last - t0, before=a - last, launches=b - a,
                                 finish=c - b, region=now - c, thread=threading.current_thread().name)
            last = now
        if f is not None:
            faulthandler.cancel_dump_traceback_later()
            f.close()

    ts = [threading.Thread(target=body, name=f"launcher-{i}") for i in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return worst


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trials", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=1.0)
    ap.add_argument("--first", default="hot path", choices=list(VARIANTS))
    ap.add_argument("--then", default="reaper", choices=list(VARIANTS))
    ap.add_argument("--dump-ms", type=float, default=0.0)
    ap.add_argument("--dump-dir", default=tempfile.gettempdir())
    ap.add_argument("--barrier", action="store_true",
                    help="both threads build their Kernel before either starts its loop (as stall_probe.loop)")
    a = ap.parse_args()
    q, prg, buf = setup()
    tmp = tempfile.mkdtemp()

    interval = RECORDER.switch_interval_s or sys.getswitchinterval()

    def run(name: str, dump: str | None = None) -> dict:
        ctx, traced, files = VARIANTS[name]
        RECORDER.clear()
        with contextlib.ExitStack() as stack:
            for c in ctx:
                stack.enter_context(c())
            if traced:
                stack.enter_context(cltrace.trace(*(os.path.join(tmp, f"c.{k}") for k in files)))
            else:  # at the switch interval cltrace sets while tracing, as stall_parts' untraced
                old = sys.getswitchinterval()
                sys.setswitchinterval(interval)
                stack.callback(sys.setswitchinterval, old)
            return timed_loop(q, prg, buf, a.seconds, dump, a.dump_ms, a.barrier)

    def show(label: str, w: dict) -> None:
        print(f"{label:<28} longest {w['gap'] * 1e3:6.2f} ms at {w['at']:.3f} s ({w['thread']}): before "
              f"{w['before'] * 1e3:.2f}, launches {w['launches'] * 1e3:.2f}, finish {w['finish'] * 1e3:.2f}, "
              f"region {w['region'] * 1e3:.2f} ms", flush=True)

    timed_loop(q, prg, buf, 0.2, None, 0, True)  # warm-up
    for t in range(a.trials):
        run(a.then)
        show(f"trial {t}: {a.then} after {a.then}", run(a.then))
        run(a.first)
        dump = os.path.join(a.dump_dir, f"carry-{t}.txt") if a.dump_ms else None
        show(f"trial {t}: {a.then} after {a.first}", run(a.then, dump))


if __name__ == "__main__":
    main()
