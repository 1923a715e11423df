"""Which C calls run long on cltrace's threads while two threads launch: the candidates for GIL holds.

    python benchmarks/gil_holds.py [--seconds 3] [--over-ms 0.5] [--handover-ms 0.1]

A thread waiting for the GIL waits while another runs one C call that does not release it (the
switch interval only applies between bytecodes). This runs bench_pipeline's stall loop (two threads,
50 launches + finish + an empty region each iteration) traced, with a profile hook on every thread
that times each C call (``c_call`` to ``c_return``) on the thread's CPU clock and keeps those over
``--over-ms``, with their Python caller. CPU time, not wall: the hook's own Python code may wait for
the GIL, which costs no CPU, while a C call that computes with the GIL held costs as much CPU as it
holds the GIL. (A call that computes with the GIL released shows too: the native harvest does.)

Second table, the GIL hand-overs of cltrace's own threads: their C calls whose wall time passed their
CPU time by over ``--handover-ms``, i.e. calls that dropped the GIL while another thread wanted it
and waited to take it back (each such hand-over can restart a waiting launcher's switch interval), by
C call and caller, with their count per worker step (calls of ``Recorder._step``).
"""
from __future__ import annotations

import argparse
import collections
import os
import sys
import tempfile
import threading
import time

import pyopencl as cl

import cltrace

sys.path.insert(0, os.path.dirname(__file__))
from stall_probe import iteration, setup  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--over-ms", type=float, default=0.5)
    ap.add_argument("--handover-ms", type=float, default=0.1)
    a = ap.parse_args()
    over = a.over_ms / 1e3
    handover = a.handover_ms / 1e3
    handovers: collections.Counter[tuple[str, str, str]] = collections.Counter()
    walls: dict[int, list[float]] = collections.defaultdict(list)
    steps = [0]
    q, prg, buf = setup()
    long_calls: list[tuple[float, str, str, str]] = []
    starts: dict[int, list[float]] = collections.defaultdict(list)
    perf = time.perf_counter
    cpu = time.thread_time

    def hook(frame, event, arg):  # type: ignore[no-untyped-def]
        if event == "c_call":
            starts[threading.get_ident()].append(cpu())
            walls[threading.get_ident()].append(perf())
        elif event == "call" and frame.f_code.co_name == "_step":
            steps[0] += 1
        elif event in ("c_return", "c_exception"):
            st = starts[threading.get_ident()]
            wl = walls[threading.get_ident()]
            if st:
                took = cpu() - st.pop()
                wall = perf() - wl.pop()
                name = threading.current_thread().name
                if name.startswith("cltrace") and wall - took > handover:
                    where = f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno} {frame.f_code.co_name}"
                    handovers[(name, getattr(arg, "__qualname__", str(arg)), where)] += 1
                if took > over:
                    where = f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno} {frame.f_code.co_name}"
                    long_calls.append((took, threading.current_thread().name, getattr(arg, "__qualname__", str(arg)), where))

    worst = [0.0]

    def body() -> None:
        k = cl.Kernel(prg, "k")
        end = perf() + a.seconds
        last = perf()
        while perf() < end:
            iteration(k, q, buf)
            now = perf()
            worst[0] = max(worst[0], now - last)
            last = now

    with tempfile.TemporaryDirectory() as tmp:
        threading.setprofile(hook)
        cltrace.start(os.path.join(tmp, "a.json"), os.path.join(tmp, "a.pftrace"))
        ts = [threading.Thread(target=body, name=f"launcher-{i}") for i in range(2)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        cltrace.stop()
        threading.setprofile(None)
    by = collections.defaultdict(list)
    for took, th, fn, where in long_calls:
        by[(th if th.startswith("cltrace") else "launcher", fn, where)].append(took)
    print(f"longest pause of a launching thread: {worst[0] * 1e3:.1f} ms (profiled: slower than bench_pipeline's)")
    print(f"C calls over {a.over_ms:g} ms of CPU:")
    print(f"{'thread':18} {'calls':>5} {'max ms':>7} {'sum ms':>7}  C call (caller)")
    for (th, fn, where), v in sorted(by.items(), key=lambda kv: -max(kv[1]))[:25]:
        print(f"{th:18} {len(v):5} {max(v) * 1e3:7.2f} {sum(v) * 1e3:7.1f}  {fn} ({where})")
    total = sum(handovers.values())
    print(f"\nGIL hand-overs of cltrace's threads (wall past CPU by over {a.handover_ms:g} ms): {total} in "
          f"{steps[0]} worker steps, {total / max(1, steps[0]):.1f} a step")
    print(f"{'thread':24} {'count':>5} {'a step':>6}  C call (caller)")
    for (th, fn, where), k in handovers.most_common(30):
        print(f"{th:24} {k:5} {k / max(1, steps[0]):6.2f}  {fn} ({where})")


if __name__ == "__main__":
    main()
