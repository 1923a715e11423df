"""Where every thread is during a long pause of a traced thread: the stall loop with a watchdog.

    python benchmarks/stall_where.py [--seconds 3] [--after-ms 300]

Each launching thread notes when its last iteration ended. A watchdog thread prints the stack of a
launching thread that has not ended an iteration for ``--after-ms`` (once per pause), with the
worker's; where no thread runs Python at all (one holds the GIL in a C call),
``faulthandler.dump_traceback_later``, re-armed by every iteration, prints all stacks from its own C thread.
"""
from __future__ import annotations

import argparse
import logging
import faulthandler
import os
import sys
import tempfile
import threading
import time
import traceback

import pyopencl as cl

import cltrace
from cltrace.record.recorder import RECORDER

sys.path.insert(0, os.path.dirname(__file__))
from stall_probe import iteration, setup  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--after-ms", type=float, default=300.0)
    ap.add_argument("--max-pending", type=int, default=None, help="RECORDER.configure(max_pending=...)")
    ap.add_argument("--threads", type=int, default=2, help="launching threads")
    ap.add_argument("--switch-ms", type=float, default=None, help="sys.setswitchinterval, in ms")
    ap.add_argument("--quiet", action="store_true", help="only the summary line")
    a = ap.parse_args()
    logging.basicConfig(format="%(threadName)s: %(message)s")  # the worker reports what it survived
    if a.switch_ms:
        sys.setswitchinterval(a.switch_ms / 1e3)
    if a.max_pending:
        RECORDER.configure(max_pending=a.max_pending)
    q, prg, buf = setup()
    worst = [0.0]
    progress: dict[int, float] = {}
    done = threading.Event()

    def watchdog() -> None:
        reported: set[tuple[int, float]] = set()
        seen, since, told = RECORDER.recorded, time.perf_counter(), 0
        while not done.wait(0.02):
            now = time.perf_counter()
            if RECORDER.recorded != seen:
                seen, since = RECORDER.recorded, now
            elif now - since > a.after_ms / 1e3 and told < 3 and (RECORDER.pending or RECORDER.lost):
                told += 1
                since = now
                frames = sys._current_frames()
                for th in threading.enumerate():
                    if th.name == "cltrace-resolver" and th.ident in frames:
                        print(f"--- no span resolved for {a.after_ms:.0f} ms (pending {len(RECORDER.pending)}, "
                              f"waiting {len(RECORDER.resolver.waiting)}, lost {RECORDER.lost}); the worker:\n"
                              + "".join(traceback.format_stack(frames[th.ident])[-8:]), flush=True)
            for ident, t in list(progress.items()):
                if now - t > a.after_ms / 1e3 and (ident, t) not in reported and not a.quiet:
                    reported.add((ident, t))
                    frames = sys._current_frames()
                    print(f"--- thread {ident} stuck {1e3 * (now - t):.0f} ms:", flush=True)
                    print("".join(traceback.format_stack(frames.get(ident))), flush=True)
                    for th in threading.enumerate():
                        if th.name.startswith("cltrace") and th.ident in frames:
                            print(f"--- {th.name}:", "".join(traceback.format_stack(frames[th.ident])[-6:]), flush=True)

    ready = threading.Barrier(a.threads)  # every Kernel built before any loop starts (stall_probe.loop)

    def body() -> None:
        k = cl.Kernel(prg, "k")
        ready.wait()
        end = time.perf_counter() + a.seconds
        last = time.perf_counter()
        me = threading.get_ident()
        progress[me] = last
        while time.perf_counter() < end:
            iteration(k, q, buf)
            if not a.quiet:
                faulthandler.dump_traceback_later(a.after_ms / 1e3, repeat=False, exit=False)
            now = time.perf_counter()
            worst[0] = max(worst[0], now - last)
            last = progress[me] = now
        progress.pop(me, None)

    with tempfile.TemporaryDirectory() as tmp:
        cltrace.start(os.path.join(tmp, "a.json"), os.path.join(tmp, "a.pftrace"))
        dog = threading.Thread(target=watchdog, daemon=True)
        dog.start()
        ts = [threading.Thread(target=body, name=f"launcher-{i}") for i in range(a.threads)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        faulthandler.cancel_dump_traceback_later()
        done.set()
        cltrace.stop()
    print(f"{a.threads} threads, switch {sys.getswitchinterval() * 1e3:g} ms, max_pending {RECORDER.max_pending}: longest pause {worst[0] * 1e3:.1f} ms; recorded {RECORDER.recorded}, lost {RECORDER.lost}")


if __name__ == "__main__":
    main()
