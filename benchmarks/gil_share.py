"""How long the worker holds the GIL a record, by stage: what a launching thread waits for.

    python benchmarks/gil_share.py [--launches 100000] [--step 8192] [--regions]

Records ``--launches`` plain launches (9 a region with ``--regions``) with a ``.json`` and a ``.pftrace``
attached and the worker held off, then runs the worker's steps on this thread while a spinner thread
spins (it needs the GIL for every iteration, and waits for it off its CPU). The wall time its CPU clock
missed is the time someone else held the GIL: per stage (taking the records, resolve, statistics, each file,
keeping the batch) in ns a record, beside each stage's wall and CPU time. The difference between a stage's
CPU and its GIL share is the work it does with the GIL released. The interval is the one cltrace sets
while tracing (``switch.DEFAULT_S``).
"""
from __future__ import annotations

import argparse
import collections
import itertools
import os
import sys
import tempfile
import threading
import time
import types

import pyopencl as cl

import cltrace
from cltrace import _state
from cltrace.record import switch
from cltrace.record.recorder import RECORDER, STEP_ROWS
from cltrace.timeline import passes

SRC = "__kernel void k(__global float *x) { x[get_global_id(0)] += 1.0f; }"


class Spinner:
    """A thread that needs the GIL for every iteration: while it waits for the GIL it is off its CPU, so its
    CPU clock stops exactly while another thread holds the GIL (no rate to calibrate)."""

    def __init__(self) -> None:
        self.go = True
        self.t = threading.Thread(target=self._spin, daemon=True)
        self.t.start()
        while self.t.native_id is None:
            time.sleep(0.001)
        self.clock = time.pthread_getcpuclockid(self.t.ident)

    def _spin(self) -> None:
        n = 0
        while self.go:
            n += 1

    def cpu(self) -> float:
        return time.clock_gettime(self.clock)

    def duty(self, seconds: float = 0.5) -> float:
        """Its CPU time over wall time with nobody else on the GIL (≈ 1 on an idle core)."""
        c0, t0 = self.cpu(), time.perf_counter()
        time.sleep(seconds)
        return (self.cpu() - c0) / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--launches", type=int, default=100_000)
    ap.add_argument("--step", type=int, default=STEP_ROWS)
    ap.add_argument("--regions", action="store_true", help="9 launches inside each region, as the capacity row")
    a = ap.parse_args()
    q = cltrace.profiling_queue()
    k = cl.Kernel(cl.Program(q.context, SRC).build(), "k")
    buf = cl.Buffer(q.context, cl.mem_flags.READ_WRITE, 4 * 1024)
    k.set_args(buf)
    with tempfile.TemporaryDirectory() as tmp:
        RECORDER.configure(max_pending=4 * a.launches, resolve_interval_s=3600)
        session = cltrace.trace(os.path.join(tmp, "g.json"), os.path.join(tmp, "g.pftrace"))
        session.__enter__()
        RECORDER.flush(block=True)  # the clocks and the files' heads, before the records
        if a.regions:
            for _ in range(a.launches // 9):
                with cltrace.region("step", q):
                    for _ in range(9):
                        cltrace.launch(k, q, (1024,), None, buf)
        else:
            for _ in range(a.launches):
                cltrace.launch(k, q, (1024,), None, buf)
        q.finish()
        _state.ENABLED = False
        time.sleep(0.2)  # the reaper's late tickets
        n = len(RECORDER.pending)

        stages: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0, 0.0])
        spin = Spinner()
        switch.lower(switch.DEFAULT_S)
        alone = spin.duty()

        def timed(name: str, fn):
            def run(*args, **kw):
                c0, w0, t0 = spin.cpu(), time.perf_counter(), time.thread_time()
                try:
                    return fn(*args, **kw)
                finally:
                    w1, t1 = time.perf_counter(), time.thread_time()
                    s = stages[name]
                    s[0] += w1 - w0
                    s[1] += t1 - t0
                    s[2] += (w1 - w0) - (spin.cpu() - c0) / alone
            return run

        r = RECORDER
        r.resolver.resolve = timed("resolve", r.resolver.resolve)
        r.stats.add = timed("statistics", r.stats.add)
        for sink in r.sinks:
            sink.write = timed(type(sink).__name__.replace("Sink", ""), sink.write)
        r._keep = timed("keep", r._keep)
        st = r.resolver._stamps
        r.resolver._stamps = st._replace(**{fn: timed(f"  resolve: {fn}", getattr(st, fn))
                                            for fn in ("columns_read", "settle")})
        from cltrace.timeline import tail
        tail.columns = timed("  resolve: tail", tail.columns)
        native = r.resolver._tail
        if native is not None:
            r.resolver._tail = types.SimpleNamespace(**{fn: timed(f"    tail: {fn}", getattr(native, fn))
                                                        for fn in ("scan", "finish", "field")})
        from cltrace.timeline import stamps as stamps_mod
        stamps_mod.done = timed("  resolve: tickets done", stamps_mod.done)
        take = timed("take records", lambda m: list(map(collections.deque.popleft, itertools.repeat(r.pending, m))))
        c0, w0 = spin.cpu(), time.perf_counter()
        with r._lock:
            while r.pending:
                m = min(a.step, len(r.pending))
                batch = take(m)
                r.pending.extendleft(reversed(batch))  # _step takes them again, untimed: its own pop
                s0 = (spin.cpu(), time.perf_counter(), time.thread_time())
                r._step(block=False, limit_records=m)
                s1 = (spin.cpu(), time.perf_counter(), time.thread_time())
                st = stages["step (all)"]
                st[0] += s1[1] - s0[1]
                st[1] += s1[2] - s0[2]
                st[2] += (s1[1] - s0[1]) - (s1[0] - s0[0]) / alone
        w1 = time.perf_counter()
        session.__exit__(None, None, None)
        w2 = time.perf_counter()
        lost_all = (w2 - w0) - (spin.cpu() - c0) / alone
        spin.go = False
    print(f"{n:,} records ({'9 launches a region' if a.regions else 'plain launches'}), steps of {a.step}; "
          f"resolver passes: {passes.DETAIL}; spinner's CPU / wall alone {alone:.3f}; Python {sys.version.split()[0]}")
    rows = [("stage", "wall ns/rec", "CPU ns/rec", "GIL ns/rec", "GIL / CPU")]
    for name, (w, c, g) in stages.items():
        rows.append((name, f"{w / n * 1e9:,.0f}", f"{c / n * 1e9:,.0f}", f"{g / n * 1e9:,.0f}",
                     f"{g / c:.2f}" if c > 0 else "-"))
    rows.append(("steps + close, all threads", f"{(w2 - w0) / n * 1e9:,.0f}", "", f"{lost_all / n * 1e9:,.0f}", ""))
    rows.append(("of which the close", f"{(w2 - w1) / n * 1e9:,.0f}", "", "", ""))
    width = [max(len(row[i]) for row in rows) for i in range(5)]
    for row in rows:
        print("  ".join(c.rjust(width[i]) if i else c.ljust(width[i]) for i, c in enumerate(row)))


if __name__ == "__main__":
    main()
