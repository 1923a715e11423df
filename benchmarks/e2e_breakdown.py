"""Where the end-to-end row's traced time goes: start(), the loop, stop(), and what runs inside each.

    .venv/bin/python benchmarks/e2e_breakdown.py [--launches 30000] [--rounds 5]
    CLTRACE_NATIVE=0 .venv/bin/python benchmarks/e2e_breakdown.py     # the pure-Python path

The loop is bench_pipeline's end-to-end loop (tiny kernels through ``cltrace.launch``, then
``queue.finish``). Variants, alternating in each round (median of rounds per cell):

  untraced   the loop alone
  traced     ``cltrace.trace(a.json, a.pftrace)`` around it, as bench_pipeline's row
  before     the same with this branch's cuts undone (``UNDO``), for before/after figures in one run
  held       the same, the worker held off during the loop (it resolves nothing until stop()):
             the loop column is the hot path alone, stop() the whole catch-up
  quiet      held, and the reaper paused too (records keep their events; nothing reads a stamp during
             the loop, nothing waits: no back-pressure below a million records): the hot path alone
  memory     ``cltrace.trace()`` with no file: the sinks' share is traced - memory

``--fresh N`` adds the first trace of a process, as a user's program pays it: N fresh interpreters
each (importing cltrace, pyopencl and numpy only), alternating with N that emulate the code before
this branch's first-trace cuts (``FIRST_UNDO``), untraced loop first then start/loop/stop, and the
cyclic GC's pauses inside.

Each variant prints the wall time of start(), the loop and stop(), then the time spent in the
pieces of cltrace that ran, per phase and per thread (wrapped here, timed wall-clock: a piece that
waits for the GIL counts that wait), and in the last column the CPU time they took (all phases:
for the worker, about how long it held the GIL). Nested pieces are indented under their caller.
The "cpu:" rows are per-thread CPU time during the loop: the worker's is (an upper bound of) how long
it held the GIL while the loop ran; "loop thread off-CPU" is the loop's wall time minus its CPU time
(waiting for the GIL, for the device in ``finish``, or descheduled), to compare with the untraced one.
"""
from __future__ import annotations

import argparse
import collections
import functools
import gc
import os
import statistics
import sys
import tempfile
import threading
import time
from typing import Any, Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_pipeline import Setup  # noqa: E402

import cltrace  # noqa: E402
from cltrace.capture import session  # noqa: E402
from cltrace.export.chrome import ChromeTraceSink  # noqa: E402
from cltrace.export.perfetto import PerfettoTraceSink  # noqa: E402
from cltrace.record.recorder import RECORDER, Recorder  # noqa: E402
from cltrace.timeline import clock, passes, stamps  # noqa: E402
from cltrace.timeline.resolve import Resolver  # noqa: E402
if stamps.REAPER is not None:
    from cltrace.timeline import _stamps as stamps_native  # noqa: E402
from cltrace.timeline.stats import Stats  # noqa: E402

PHASES = ("start", "loop", "stop")


def _no_writeback() -> Callable[[], None]:
    import cltrace.export.chrome as chrome_mod
    import cltrace.export.perfetto.sink as pf_mod

    saved = chrome_mod.start_writeback, pf_mod.start_writeback
    chrome_mod.start_writeback = pf_mod.start_writeback = lambda fh, since: since

    def redo() -> None:
        chrome_mod.start_writeback, pf_mod.start_writeback = saved
    return redo


# The cuts, each undone for the "before" variant: a function that undoes it and returns its redo.
UNDO: dict[str, Callable[[], Callable[[], None]]] = {
    "early writeback of the trace files (export/base.py start_writeback)": _no_writeback,
}

# (label, owner, attribute, depth): the pieces timed, in the order printed.
PIECES: list[tuple[str, Any, str, int]] = [
    ("open .json sink", ChromeTraceSink, "start", 1),
    ("open .pftrace sink", PerfettoTraceSink, "start", 1),
    ("start the worker", Recorder, "activate", 1),
    ("new device clock", clock.DeviceClock, "__init__", 0),
    ("calibrate", clock.DeviceClock, "calibrate", 1),
    ("flush(block=True)", Recorder, "flush", 0),
    ("resolve+deliver step", Recorder, "_step", 1),
    ("resolve", Resolver, "resolve", 2),
    ("wait for commands", RECORDER.resolver, "_stamps.wait", 3),
    ("statistics", Stats, "add", 2),
    ("write .json", ChromeTraceSink, "write", 2),
    ("write .pftrace", PerfettoTraceSink, "write", 2),
    ("flush sinks", Recorder, "_flush_sinks", 1),
    ("recalibrate when due", clock.ClockRegistry, "maybe_recalibrate", 2),
    ("metadata()", Recorder, "metadata", 2),
    ("flush .json", ChromeTraceSink, "flush", 2),
    ("flush .pftrace", PerfettoTraceSink, "flush", 2),
    ("close sinks", Recorder, "remove_sink", 0),
    ("close .json", ChromeTraceSink, "close", 1),
    ("close .pftrace", PerfettoTraceSink, "close", 1),
    ("fsync", os, "fsync", 2),
]
GC_LABELS = [(f"cyclic GC gen{g}", None, "", 0) for g in range(3)]


class Timings:
    """Wall-clock intervals of the wrapped pieces and the CPU time they took: (label, thread name, t0, t1, cpu)."""

    def __init__(self) -> None:
        self.spans: list[tuple[str, str, float, float, float]] = []
        self.on = False

    def wrap(self, label: str, owner: Any, attr: str) -> None:
        if "." in attr:  # a field of a NamedTuple (the resolver's stamps implementation)
            holder_name, field = attr.split(".")
            holder = getattr(owner, holder_name)
            fn = getattr(holder, field)
            setattr(owner, holder_name, holder._replace(**{field: self._timed(label, fn)}))
            return
        setattr(owner, attr, self._timed(label, getattr(owner, attr)))

    def _timed(self, label: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        spans = self.spans
        perf = time.perf_counter
        cpu = time.thread_time
        current = threading.current_thread

        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            if not self.on:
                return fn(*args, **kwargs)
            c0 = cpu()
            t0 = perf()
            try:
                return fn(*args, **kwargs)
            finally:
                t1 = perf()
                spans.append((label, current().name, t0, t1, cpu() - c0))
        return timed


class GcTime:
    """Cyclic-GC pauses while on: (thread name, generation, t0, t1)."""

    def __init__(self) -> None:
        self.spans: list[tuple[str, int, float, float]] = []
        self.on = False
        self._t0: dict[int, float] = {}
        gc.callbacks.append(self._cb)

    def _cb(self, phase: str, info: dict[str, int]) -> None:
        if not self.on:
            return
        if phase == "start":
            self._t0[threading.get_ident()] = time.perf_counter()
        else:
            t0 = self._t0.pop(threading.get_ident(), None)
            if t0 is not None:
                self.spans.append((threading.current_thread().name, info["generation"], t0, time.perf_counter()))


GC = GcTime()


def thread_cpu(t: threading.Thread | None) -> float:
    if t is None or t.ident is None or not t.is_alive():
        return 0.0
    try:
        return time.clock_gettime(time.pthread_getcpuclockid(t.ident))
    except (OSError, ProcessLookupError):
        return 0.0


def run_variant(s: Setup, name: str, n: int, tmp: str, r: int, timings: Timings) -> dict[str, float]:
    """One round of one variant: phase wall times, per-piece per-phase times, loop CPU times."""
    out: dict[str, float] = collections.defaultdict(float)
    files = () if name == "memory" else (os.path.join(tmp, f"{name}{r}.json"), os.path.join(tmp, f"{name}{r}.pftrace"))
    if name != "untraced":
        RECORDER.clear()
    redo = [undo() for undo in UNDO.values()] if name == "before" else []
    if name in ("held", "quiet"):  # the worker, woken once, goes back to a wait of an hour
        RECORDER.configure(resolve_interval_s=3600, **({"max_pending": 1 << 20} if name == "quiet" else {}))
        if name == "quiet" and stamps.REAPER is not None:
            stamps_native.pause_reaper(True)
        RECORDER._wake.set()
        time.sleep(0.02)
    timings.spans.clear()
    GC.spans.clear()
    timings.on = GC.on = True
    t0 = time.perf_counter()
    if name != "untraced":
        session.start(*files, quiet=True)
    t1 = time.perf_counter()
    worker = RECORDER._worker if name != "untraced" else None
    w0, m0, p0 = thread_cpu(worker), time.thread_time(), time.process_time()
    q, k, buf, launch = s.q, s.k, s.buf, cltrace.launch  # bench_pipeline's Setup.loop, its finish timed apart
    for _ in range(n):
        launch(k, q, (1024,), None, buf)
    tf, mf = time.perf_counter(), time.thread_time()
    q.finish()
    t2 = time.perf_counter()
    w1, m1, p1 = thread_cpu(worker), time.thread_time(), time.process_time()
    out["wall|queue.finish() in the loop"] = t2 - tf
    out["cpu|queue.finish() in the loop"] = m1 - mf
    behind = len(RECORDER.pending) + len(RECORDER.resolver.waiting) if name != "untraced" else 0
    if name != "untraced":
        session.stop()
    t3 = time.perf_counter()
    timings.on = GC.on = False
    if name in ("held", "quiet"):
        RECORDER.configure(resolve_interval_s=0.05, max_pending=65_536)
        if name == "quiet" and stamps.REAPER is not None:
            stamps_native.pause_reaper(False)
        RECORDER._wake.set()  # it sleeps in wait(3600) otherwise, and the next rounds would be "held" too
    for fn in redo:
        fn()
    bounds = {"start": (t0, t1), "loop": (t1, t2), "stop": (t2, t3)}
    for ph, (a, b) in bounds.items():
        out[f"wall|{ph}"] = b - a
    out["wall|total"] = t3 - t0
    out["cpu|loop thread"] = m1 - m0
    out["cpu|worker"] = w1 - w0
    out["cpu|others (device)"] = (p1 - p0) - (m1 - m0) - (w1 - w0)
    out["cpu|loop thread off-CPU"] = (t2 - t1) - (m1 - m0)
    out["count|records unresolved at the loop's end"] = behind
    out["count|worker steps during the loop"] = sum(
        1 for label, th, a, _, _ in timings.spans if label == "resolve+deliver step" and th != "MainThread" and t1 <= a < t2)
    gc_spans = [(f"cyclic GC gen{g}", th, a, b, b - a) for th, g, a, b in GC.spans]
    for label, thread, a, b, c in timings.spans + gc_spans:
        who = "main" if thread == "MainThread" else "worker" if thread == "cltrace-resolver" else thread
        out[f"{label}|{who}|cpu"] += c
        for ph, (lo, hi) in bounds.items():
            overlap = min(b, hi) - max(a, lo)
            if overlap > 0:
                out[f"{label}|{who}|{ph}"] += overlap
    return out


def report(name: str, rounds: list[dict[str, float]]) -> None:
    def med(key: str) -> float:
        return statistics.median(r.get(key, 0.0) for r in rounds) * 1e3

    totals = sorted(r["wall|total"] * 1e3 for r in rounds)
    print(f"\n{name}: total {med('wall|total'):.1f} ms (median; rounds {', '.join(f'{t:.0f}' for t in totals)} ms)")
    print(f"  {'':34s} {'start':>8s} {'loop':>8s} {'stop':>8s} {'cpu':>8s}  ms (wall per phase; cpu: all phases)")
    print(f"  {'wall time':34s} " + " ".join(f"{med(f'wall|{ph}'):8.1f}" for ph in PHASES))
    print(f"  {'  queue.finish() ending the loop':34s} {'':8s} {med('wall|queue.finish() in the loop'):8.1f} {'':8s} "
          f"{med('cpu|queue.finish() in the loop'):8.1f}")
    seen = {k.rsplit("|", 1)[0] for r in rounds for k in r if k.count("|") == 2 and not k.endswith("|cpu")}
    for label, _, _, depth in PIECES + GC_LABELS:
        for who in ("main", "worker"):
            if f"{label}|{who}" not in seen:
                continue
            cells = [med(f"{label}|{who}|{ph}") for ph in PHASES + ("cpu",)]
            tag = f"{'  ' * depth}{label} ({who})"
            print(f"  {tag:34s} " + " ".join(f"{c:8.1f}" if c else f"{'':8s}" for c in cells))
    for key in ("loop thread", "worker", "others (device)", "loop thread off-CPU"):
        print(f"  {'cpu: ' + key:34s} {'':8s} {med(f'cpu|{key}'):8.1f}")
    for key in ("worker steps during the loop", "records unresolved at the loop's end"):
        print(f"  {key:34s} {'':8s} {med(f'count|{key}') / 1e3:8.0f}")


def hot_path(s: Setup, n: int = 5000, reps: int = 15) -> None:
    """CPU time per launch (this thread's, best of reps, alternating) of the loop's launch untraced
    and traced, and of the pieces the traced path adds, each alone in a loop."""
    from cltrace import _state
    from cltrace.record import regions

    k, q, buf, launch = s.k, s.q, s.buf, cltrace.launch
    perf, attrs, site, record = time.perf_counter_ns, regions._launch_attrs, regions._site, regions.record_launch
    ev = launch(k, q, (1024,), None, buf)
    q.finish()

    def untraced() -> None:
        for _ in range(n):
            launch(k, q, (1024,), None, buf)
        q.finish()

    def traced() -> None:
        _state.ENABLED = True
        try:
            untraced()
        finally:
            _state.ENABLED = False

    def name() -> None:
        for _ in range(n):
            k.function_name

    def shape() -> None:
        for _ in range(n):
            attrs((1024,), None)

    def call_site() -> None:
        for _ in range(n):
            site(1)

    def record_tuple() -> None:
        for _ in range(n):
            record("k", q, ev, 0, 1, "kernel", None, None)

    def clock_reads() -> None:
        for _ in range(n):
            perf()
            perf()

    cases = {"launch, untraced": untraced, "launch, traced (worker held off)": traced,
             "  kernel.function_name (per launch)": name, "  _launch_attrs": shape, "  call site capture": call_site,
             "  record_launch (tuple + deque)": record_tuple, "  two perf_counter_ns": clock_reads}
    best = dict.fromkeys(cases, float("inf"))
    RECORDER.configure(resolve_interval_s=3600)
    RECORDER._wake.set()
    time.sleep(0.02)
    for _ in range(reps):
        for label, fn in cases.items():
            RECORDER.pending.clear()
            t0 = time.thread_time()
            fn()
            best[label] = min(best[label], time.thread_time() - t0)
    RECORDER.pending.clear()
    RECORDER.configure(resolve_interval_s=0.05)
    RECORDER._wake.set()
    print(f"\nhot path: CPU ns per launch (this thread, best of {reps} x {n})")
    for label, t in best.items():
        print(f"  {label:40s} {t / n * 1e9:8.0f}")
    extra = (best["launch, traced (worker held off)"] - best["launch, untraced"]) / n
    print(f"  {'traced - untraced':40s} {extra * 1e9:8.0f}   (x {a_launches} launches = {extra * a_launches * 1e3:.0f} ms)")


a_launches = 30_000

# A fresh interpreter's first trace. argv: launches, "before"/"after", folder. Prints one JSON line.
FRESH = r"""
import gc, json, os, sys, time
import numpy as np
import pyopencl as cl
import cltrace
n, mode, tmp = int(sys.argv[1]), sys.argv[2], sys.argv[3]
if mode == "before":  # the writers called np.unique, whose first call imports numpy.ma (inside the trace)
    import cltrace.timeline.arrays
    assert "cltrace.export.perfetto" not in sys.modules  # imported by start(), binding the name below
    cltrace.timeline.arrays.distinct = np.unique
q = cltrace.profiling_queue()
k = cl.Kernel(cl.Program(q.context, "__kernel void k(__global float *x) { x[get_global_id(0)] += 1.0f; }").build(), "k")
buf = cl.Buffer(q.context, cl.mem_flags.READ_WRITE, 4 * 1024)
def loop():
    for _ in range(n):
        cltrace.launch(k, q, (1024,), None, buf)
    q.finish()
loop()
t = time.perf_counter(); loop(); off = time.perf_counter() - t
pauses, full = [], []
def cb(phase, info, t0=[0.0]):
    if phase == "start":
        t0[0] = time.perf_counter()
    else:
        pauses.append(time.perf_counter() - t0[0])
        if info["generation"] == 2:
            full.append(info["collected"])
gc.callbacks.append(cb)
before = set(sys.modules)
t0 = time.perf_counter()
cltrace.start(os.path.join(tmp, mode + ".json"), os.path.join(tmp, mode + ".pftrace"), quiet=True)
t1 = time.perf_counter()
loop()
t2 = time.perf_counter()
cltrace.stop()
t3 = time.perf_counter()
gc.callbacks.remove(cb)
print(json.dumps({"untraced": off, "start": t1 - t0, "loop": t2 - t1, "stop": t3 - t2, "total": t3 - t0,
                  "gc": sum(pauses), "gc_max": max(pauses, default=0.0), "full_gc": len(full),
                  "imported": len(set(sys.modules) - before),
                  "numpy.ma": "numpy.ma" in set(sys.modules) - before}))
"""
FIRST_UNDO = ["the writers' distinct() in place of np.unique (timeline/arrays.py): no numpy.ma import in the trace"]


def fresh(pairs: int, launches: int) -> None:
    import json
    import subprocess

    runs: dict[str, list[dict[str, Any]]] = {"before": [], "after": []}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(pairs):
            for mode in runs:
                out = subprocess.run([sys.executable, "-c", FRESH, str(launches), mode, tmp], capture_output=True,
                                     text=True, check=True, env={**os.environ, "CLTRACE_QUIET": "1"})
                runs[mode].append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(f"\nfirst trace of a fresh process ({launches} launches; median of {pairs}; ms)")
    print(f"  {'':8s} {'untraced':>9s} {'start':>8s} {'loop':>8s} {'stop':>8s} {'total':>8s} {'ratio':>6s} "
          f"{'GC':>7s} {'GC max':>7s} {'full GCs':>8s}  modules imported in the trace")
    for mode, rs in runs.items():
        def med(key: str) -> float:
            return statistics.median(r[key] for r in rs) * 1e3
        print(f"  {mode:8s} {med('untraced'):9.1f} {med('start'):8.1f} {med('loop'):8.1f} {med('stop'):8.1f} "
              f"{med('total'):8.1f} {med('total') / med('untraced'):6.2f} {med('gc'):7.1f} {med('gc_max'):7.1f} "
              f"{sum(r['full_gc'] for r in rs) / len(rs):8.1f}  "
              f"{statistics.median(r['imported'] for r in rs):.0f}"
              f"{' (numpy.ma among them)' if any(r['numpy.ma'] for r in rs) else ''}")
    print("  undone in 'before': " + "; ".join(FIRST_UNDO))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--launches", type=int, default=30_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--variants", default="untraced,before,traced,held,quiet,memory")
    ap.add_argument("--fresh", type=int, default=0, help="pairs of fresh processes timing their first trace")
    a = ap.parse_args()
    global a_launches
    a_launches = a.launches
    s = Setup()
    print(f"device: {s.q.device.name.strip()}; stamps path: {stamps.PATH}; resolver passes: {passes.PATH}; "
          f"{a.launches} launches, {a.rounds} rounds; python {sys.version.split()[0]}")
    timings = Timings()
    for label, owner, attr, _ in PIECES:
        timings.wrap(label, owner, attr)
    variants = a.variants.split(",")
    results: dict[str, list[dict[str, float]]] = {v: [] for v in variants}
    with tempfile.TemporaryDirectory() as tmp:
        s.loop(2000)
        first = run_variant(s, "traced", a.launches, tmp, -1, timings)  # the process's first trace: new clock
        for r in range(a.rounds):
            for v in variants:
                results[v].append(run_variant(s, v, a.launches, tmp, r, timings))
    report("first trace of the process (traced, one round: the device clock is created)", [first])
    for v in variants:
        report(v, results[v])
    if "untraced" in results:
        off = statistics.median(r["wall|total"] for r in results["untraced"])
        print()
        for v in ("before", "traced"):
            if v in results:
                on = statistics.median(r["wall|total"] for r in results[v])
                print(f"{v} / untraced = {on / off:.2f} ({on * 1e3:.1f} ms / {off * 1e3:.1f} ms)")
    if "before" in results:
        print("cuts undone in 'before': " + "; ".join(UNDO))
    hot_path(s)
    if a.fresh:
        fresh(a.fresh, a.launches)


if __name__ == "__main__":
    main()
