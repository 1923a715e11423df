"""What recording call sites costs: a traced launch, copy and region with and without them, per path.

Hot path, per call, tracing on (contenders alternate, best of
``--repeat`` rounds; the queue is drained and the recorder's deque emptied between rounds, so no
back-pressure wait lands in a round). Rounds are short and many: on a machine whose few cores also
run the CPU device and other work, the best of many short rounds is what the code costs. "no sites"
and "sites" are those bests and "added" their difference (the target applies to it); beside it, the
median over rounds of (sites - no sites) measured back
to back, in alternating order ("median"): the one to read when the machine is loaded only lightly. "off" is ``cltrace.configure(stack_depth=0)`` (nothing
captured), "on" the default ``stack_depth=1``. Paths:

  native   the C capture (``cltrace.record._region.site``; the C region captures inside __enter__)
  python   the fallback ``callsite._py_capture`` (and the Python region), what ``CLTRACE_NATIVE=0``
           runs; switched in this same process so both meet the same machine load

Rows: ``knl[gs, ls, q](a, b)`` (a ``cltrace.Kernel`` launcher), ``cltrace.launch`` of a pyopencl
kernel, ``cltrace.copy`` (host to device, 4 kB), ``with cltrace.region("x")`` (host-only), and
``cltrace.record_launch`` of a host-only span: the recording alone, without the device's noise
(on a machine whose few cores also run the CPU device, a launch varies by more than a capture costs).
Target: <= 0.3 us added per launch.

The second table is the worker's side: resolving the same 4096 recorded launches into a batch with
their captures and with none (the line lookup happens there, once per distinct line), and writing
that batch as Chrome JSON and as .pftrace (fresh interning tables and sinks each round).

    .venv/bin/python benchmarks/bench_callsite.py [--number 200] [--repeat 60]
"""
from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import tempfile
import time
import timeit
from typing import Any, Callable, Iterator

import numpy as np
import pyopencl as cl

import cltrace
from cltrace.record import callsite, regions
from cltrace.record.recorder import RECORDER
from cltrace.timeline.raw import R_SITE
from cltrace.export.chrome import ChromeTraceSink
from cltrace.export.perfetto import PerfettoTraceSink
from cltrace.timeline.batch import Tables


def best_per_call(fns: dict[str, Callable[[], Any]], number: int, repeat: int,
                  between: Callable[[], None] = lambda: None) -> dict[str, float]:
    """Seconds per call of each fn: the best of ``repeat`` rounds, contenders alternating."""
    best = {k: float("inf") for k in fns}
    for _ in range(repeat):
        for k, fn in fns.items():
            between()
            best[k] = min(best[k], timeit.timeit(fn, number=number) / number)
    between()
    return best


def fmt_time(s: float) -> str:
    if s >= 1e-3:
        return f"{s * 1e3:.2f} ms"
    if s >= 1e-6:
        return f"{s * 1e6:.2f} us"
    return f"{s * 1e9:.0f} ns"
from cltrace.timeline.resolve import Resolver  # noqa: E402

SOURCE = "__kernel void add(__global float *a, __global const float *b) { int i = get_global_id(0); a[i] += b[i]; }"
TARGET_US = 0.3


@contextlib.contextmanager
def python_path(launchers: list[Any]) -> Iterator[None]:
    """The fallback capture (and Python region) for the duration, in the modules that bound the native one."""
    saved = (regions._site, regions._NativeRegion, regions._RegionType)
    regions._site = callsite._py_capture
    regions._NativeRegion, regions._RegionType = None, regions._Region
    globs = [getattr(f, "launch", f).__globals__ for f in launchers]
    olds = [g["site"] for g in globs]
    for g in globs:
        g["site"] = callsite._py_capture
    try:
        yield
    finally:
        regions._site, regions._NativeRegion, regions._RegionType = saved
        for g, old in zip(globs, olds):
            g["site"] = old


def hot_path(number: int, repeat: int) -> dict[tuple[str, str, str], float]:
    q = cltrace.profiling_queue()
    ctx = q.context
    prg = cltrace.compile(SOURCE, context=ctx)
    mf = cl.mem_flags
    host = np.ones(1024, np.float32)
    a = cl.Buffer(ctx, mf.READ_WRITE | mf.COPY_HOST_PTR, hostbuf=host)
    b = cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=host)
    gs, ls = (1024,), (64,)
    knl = prg.add
    pknl = cl.Kernel(prg.program, "add")
    pknl.set_args(a, b)
    held = knl[gs, ls, q]
    tr = cltrace.region

    def kernel() -> None:
        knl[gs, ls, q](a, b)

    def launch() -> None:
        cltrace.launch(pknl, q, gs, ls, a, b)

    def copy() -> None:
        cltrace.copy(q, a, host)

    def region() -> None:
        with tr("x"):
            pass

    rec = cltrace.record_launch
    perf = time.perf_counter_ns

    def record() -> None:
        t = perf()
        rec("add", None, None, t, t)

    rows = {"knl[gs, ls, q](a, b)": (kernel, True), "cltrace.launch(pyopencl knl)": (launch, True),
            "cltrace.copy(q, a, host)": (copy, True), 'with cltrace.region("x")': (region, False),
            "record_launch (host-only)": (record, False)}
    paths = ["native", "python"] if callsite.CAPTURE_PATH == "native" else ["python"]

    def between() -> None:
        q.finish()
        RECORDER.pending.clear()

    best: dict[tuple[str, str, str], float] = {}
    diffs: dict[tuple[str, str], list[float]] = {}
    cltrace.start()
    try:
        for fn, _ in rows.values():  # warm: prime launchers, bind arguments, calibrate the clock
            for _ in range(200):
                fn()
        between()
        for r in range(repeat):
            for path in paths:
                ctx_ = python_path([held]) if path == "python" else contextlib.nullcontext()
                with ctx_:
                    for label, (fn, device) in rows.items():
                        n = number if device else number * 10
                        got = {}
                        # off and on back to back, in alternating order: drift falls on both alike
                        for mode, depth in ((("off", 0), ("on", 1)) if r % 2 == 0 else (("on", 1), ("off", 0))):
                            callsite.configure(stack_depth=depth)
                            got[mode] = t = best_per_call({label: fn}, n, 1, between)[label]
                            key = (label, path, mode)
                            best[key] = min(best.get(key, float("inf")), t)
                        diffs.setdefault((label, path), []).append(got["on"] - got["off"])
    finally:
        callsite.configure(stack_depth=1)
        cltrace.stop()
        RECORDER.clear()
    for (label, path), d in diffs.items():
        best[label, path, "added"] = statistics.median(d)
    return best


def worker_side(repeat: int, tmp: str) -> dict[str, tuple[float, float]]:
    """Seconds to resolve 4096 recorded launches (alternating between two lines, the worst case for
    runs of equal sites) and to write the batch to .json and .pftrace, with their captures and with none."""
    q = cltrace.profiling_queue()
    prg = cltrace.compile(SOURCE, context=q.context)
    a = cl.Buffer(q.context, cl.mem_flags.READ_WRITE, 4096)
    knl = prg.add
    cltrace.start()
    try:
        for i in range(4096):
            if i % 2:
                knl[(1024,), (64,), q](a, a)
            else:
                knl[(1024,), (64,), q](a, a)
        q.finish()
        records = list(RECORDER.pending)
        RECORDER.pending.clear()
    finally:
        cltrace.stop()
        RECORDER.clear()
    bare = [r[:R_SITE] + (None,) for r in records]
    best = {(k, w): float("inf") for k in ("resolve", "write .json", "write .pftrace") for w in ("with", "without")}
    for _ in range(repeat):
        for label, recs in (("with", records), ("without", bare)):
            tables = Tables()
            RECORDER.tables, saved = tables, RECORDER.tables
            try:
                res = Resolver(RECORDER.tracks, RECORDER.clocks, tables)
                t0 = time.perf_counter()
                batch = res.resolve(list(recs), block=True)
                best["resolve", label] = min(best["resolve", label], time.perf_counter() - t0)
                for kind, sink in (("write .json", ChromeTraceSink(os.path.join(tmp, "w.json"))),
                                   ("write .pftrace", PerfettoTraceSink(os.path.join(tmp, "w.pftrace")))):
                    sink.start(RECORDER)
                    t0 = time.perf_counter()
                    sink.write(batch)
                    best[kind, label] = min(best[kind, label], time.perf_counter() - t0)
                    sink.close(RECORDER.metadata())
            finally:
                RECORDER.tables = saved
    return {k: (best[k, "without"], best[k, "with"]) for k in ("resolve", "write .json", "write .pftrace")}


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--number", type=int, default=200, help="launches per round (host-only rows: 10x)")
    ap.add_argument("--repeat", type=int, default=60, help="rounds; the best of each is kept")
    args = ap.parse_args()
    os.environ.setdefault("CLTRACE_CACHE_DIR", os.path.join(os.getcwd(), ".cltrace-bench-cache"))
    best = hot_path(args.number, args.repeat)
    q = cltrace.profiling_queue()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"call-site cost, tracing on  (capture at import: {callsite.CAPTURE_PATH}; device: "
          f"{q.device.name.strip()}; best of {args.repeat}; cpus: {os.cpu_count()}, load {load:.1f})")
    head = (f"{'hot path, per call':<32} {'path':<7} {'no sites':>10} {'sites':>10} {'added':>10} {'median':>10} "
            f"{'target':>9}  ok")
    print(head)
    print("-" * len(head))
    labels = list(dict.fromkeys(k[0] for k in best))
    for label in labels:
        for path in ("native", "python"):
            if (label, path, "on") not in best:
                continue
            off, on = best[label, path, "off"], best[label, path, "on"]
            added = on - off
            ok = "yes" if added <= TARGET_US * 1e-6 else "NO"
            print(f"{label:<32} {path:<7} {fmt_time(off):>10} {fmt_time(on):>10} {added * 1e6:>8.3f}us "
                  f"{best[label, path, 'added'] * 1e6:>8.3f}us {'<= 0.3us':>9}  {ok}")
    print()
    head = f"{'worker, 4096 launches':<32} {'':<7} {'no sites':>10} {'sites':>10} {'added':>10}"
    print(head)
    print("-" * len(head))
    with tempfile.TemporaryDirectory() as tmp:
        for label, (off, on) in worker_side(max(3, args.repeat // 6), tmp).items():
            print(f"{label:<32} {'':<7} {off * 1e3:>8.2f}ms {on * 1e3:>8.2f}ms {(on - off) / 4096 * 1e6:>8.3f}us per launch")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
