"""What tracing costs a training loop that keeps the device busy: a small MLP step, end to end.

Each step: ``forward`` (2 tiled GEMMs and a ReLU), ``backward`` (2 GEMMs), ``optimizer`` (2 SGD
updates) inside a ``step`` region, ``cltrace.step()`` at its top, no ``finish`` inside the loop, so
the host runs ahead of the device as real training does. Matrix sizes cover a launch-bound (256),
a balanced (512-1024) and a GEMM-bound (2048) step on an H100 (this GEMM: ~20 TFLOPS there). Each variant
(no regions, host-only regions, regions on the queue) runs traced to ``.json`` + ``.pftrace`` from ``start()`` to
the files closed (``device``: regions on the queue with the defaults, ``"auto"``; ``markers``: bracketed by two
markers; ``projected``: projected from their commands), against the same loop untraced, alternating, and the table gives the median of
the pairs' ratios. ``--probe`` times every call of the launching thread in one traced run of each
variant and lists the calls that blocked (the evidence of where the host waits).

    python benchmarks/bench_overlap.py [--sizes 256,512,1024] [--steps 400,2000] [--rounds 3] [--torch]
"""
from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import tempfile
import time
from typing import Any, Callable

import numpy as np
import pyopencl as cl

import cltrace
from cltrace.record.recorder import RECORDER
from cltrace.timeline import stamps

SOURCE = r"""
#define TS 64
#define WPT 4
// C = A(MxK) B(KxN), 64x64 tiles, 4x4 outputs a work-item; A(i,k) = A[i*sa0 + k*sa1], B(k,j) = B[k*sb0 + j*sb1]
// (strides express transposes). Dimension 0 runs along columns, so row-major loads coalesce.
__kernel __attribute__((reqd_work_group_size(16, 16, 1)))
void gemm(const int M, const int N, const int K, __global const float* A, const int sa0, const int sa1,
          __global const float* B, const int sb0, const int sb1, __global float* C) {
    __local float As[TS][TS + 1], Bs[TS][TS + 1];
    const int lc = get_local_id(0), lr = get_local_id(1);
    const int bj = get_group_id(0) * TS, bi = get_group_id(1) * TS;
    float acc[WPT][WPT];
    for (int r = 0; r < WPT; ++r) for (int c = 0; c < WPT; ++c) acc[r][c] = 0.0f;
    for (int t = 0; t < K; t += TS) {
        for (int r = 0; r < WPT; ++r) for (int c = 0; c < WPT; ++c) {
            const int row = lr + 16 * r, col = lc + 16 * c;
            As[row][col] = (bi + row < M && t + col < K) ? A[(bi + row) * sa0 + (t + col) * sa1] : 0.0f;
            Bs[row][col] = (t + row < K && bj + col < N) ? B[(t + row) * sb0 + (bj + col) * sb1] : 0.0f;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int k = 0; k < TS; ++k) {
            float a[WPT], b[WPT];
            for (int r = 0; r < WPT; ++r) a[r] = As[lr + 16 * r][k];
            for (int c = 0; c < WPT; ++c) b[c] = Bs[k][lc + 16 * c];
            for (int r = 0; r < WPT; ++r) for (int c = 0; c < WPT; ++c) acc[r][c] += a[r] * b[c];
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    for (int r = 0; r < WPT; ++r) for (int c = 0; c < WPT; ++c) {
        const int i = bi + lr + 16 * r, j = bj + lc + 16 * c;
        if (i < M && j < N) C[i * N + j] = acc[r][c];
    }
}
__kernel void relu(__global float* x) { const int g = get_global_id(0); x[g] = fmax(x[g], 0.0f); }
__kernel void sgd(__global float* w, __global const float* dw, const float lr) {
    const int g = get_global_id(0); w[g] -= lr * dw[g];
}
"""

MODES = ("none", "host", "device", "markers", "projected")
# regions: none; host-only (no queue); on the queue with the defaults (``"auto"``); on the queue bracketed by
# two markers each (``regions="markers"``); on the queue, projected from their commands (``regions="projected"``)
_REGIONS = {"markers": "markers", "projected": "projected"}


class Mlp:
    """Buffers and kernels of one matrix size; ``step(mode)`` enqueues one training step."""

    def __init__(self, queue: Any, n: int) -> None:
        self.q, self.n = queue, n
        ctx = queue.context
        prg = cltrace.compile(SOURCE, context=ctx)
        self.gemm, self.relu, self.sgd = prg.gemm, prg.relu, prg.sgd
        mf = cl.mem_flags
        rng = np.random.default_rng(0)

        def buf() -> Any:
            host = (rng.standard_normal((n, n)) * 0.01).astype(np.float32)
            return cl.Buffer(ctx, mf.READ_WRITE | mf.COPY_HOST_PTR, hostbuf=host)

        self.x, self.w1, self.w2, self.h, self.y, self.dw1, self.dw2 = (buf() for _ in range(7))
        self.gs = ((n + 63) // 64 * 16,) * 2
        self.lr = np.float32(1e-6)
        self.dims = (np.int32(n),) * 3
        self.row, self.col = (np.int32(n), np.int32(1)), (np.int32(1), np.int32(n))  # as stored, transposed

    def _mm(self, a: Any, sa: tuple[Any, Any], b: Any, sb: tuple[Any, Any], c: Any) -> None:
        self.gemm(self.q, self.gs, (16, 16), *self.dims, a, *sa, b, *sb, c)

    def step(self, mode: str) -> None:
        n, q = self.n, self.q
        rq = q if mode in ("device", "markers", "projected") else None
        region = None if mode == "none" else cltrace.region
        row, col = self.row, self.col

        def forward() -> None:
            self._mm(self.x, row, self.w1, row, self.h)
            self.relu(q, (n * n,), None, self.h)
            self._mm(self.h, row, self.w2, row, self.y)

        def backward() -> None:
            self._mm(self.h, col, self.y, row, self.dw2)  # dW2 = H^T dY
            self._mm(self.x, col, self.h, row, self.dw1)  # dW1 = X^T dH

        def optimizer() -> None:
            self.sgd(q, (n * n,), None, self.w1, self.dw1, self.lr)
            self.sgd(q, (n * n,), None, self.w2, self.dw2, self.lr)

        if region is None:
            forward(), backward(), optimizer()
            return
        with region("step", rq):
            with region("forward", rq):
                forward()
            with region("backward", rq):
                backward()
            with region("optimizer", rq):
                optimizer()

    def loop(self, steps: int, mode: str) -> float:
        """Run the steps, then ``finish``; the seconds the host took to enqueue them (before the finish)."""
        step, one = cltrace.step, self.step
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
            one(mode)
        host = time.perf_counter() - t0
        self.q.finish()
        return host


def untraced(m: Mlp, steps: int, mode: str) -> tuple[float, float, float]:
    """(seconds in all, of which enqueueing, of which ``stop()``: 0)."""
    t0 = time.perf_counter()
    host = m.loop(steps, mode)
    return time.perf_counter() - t0, host, 0.0


def traced(m: Mlp, steps: int, mode: str, tmp: str) -> tuple[float, float, float]:
    """(seconds from ``start()`` to both files closed, of which enqueueing, of which ``stop()``)."""
    RECORDER.clear()
    cltrace.configure(regions=_REGIONS.get(mode, "auto"))
    paths = [os.path.join(tmp, f"overlap.{ext}") for ext in ("json", "pftrace")]
    t0 = time.perf_counter()
    cltrace.start(*paths, quiet=True)
    host = m.loop(steps, mode)
    t1 = time.perf_counter()
    cltrace.stop()
    t2 = time.perf_counter()
    return t2 - t0, host, t2 - t1


class Row:
    """One cell's alternating pairs: the median ratio and where the time went (medians, ms a step)."""

    def __init__(self, steps: int) -> None:
        self.steps = steps
        self.base: list[tuple[float, float, float]] = []
        self.trace: list[tuple[float, float, float]] = []

    def ratios(self) -> list[float]:
        return [t[0] / b[0] for t, b in zip(self.trace, self.base)]

    def ms(self, runs: list[tuple[float, float, float]], i: int) -> float:
        return statistics.median(r[i] for r in runs) / self.steps * 1e3

    def cells(self) -> str:
        """untraced ms/step | ratio (range) | host enqueue ms/step untraced -> traced | stop() ms/step."""
        r = self.ratios()
        mid = ""
        if len(r) >= 4:  # the middle half of the pairs: what a target is judged against on a noisy host
            q1, _, q3 = statistics.quantiles(r, n=4)
            mid = f"middle half {q1:.3f}-{q3:.3f}; "
        return (f"{self.ms(self.base, 0):.3f} | {statistics.median(r):.3f} ({mid}{min(r):.3f}-{max(r):.3f}) | "
                f"{self.ms(self.base, 1):.3f} -> {self.ms(self.trace, 1):.3f} | {self.ms(self.trace, 2):.3f}")


def ratio_row(m: Mlp, steps: int, mode: str, rounds: int, tmp: str) -> Row:
    """Alternating untraced/traced pairs of one cell."""
    row = Row(steps)
    for r in range(rounds):
        if r % 2 == 0:
            row.base.append(untraced(m, steps, mode))
            row.trace.append(traced(m, steps, mode, tmp))
        else:
            row.trace.append(traced(m, steps, mode, tmp))
            row.base.append(untraced(m, steps, mode))
    return row


REAPER_SETTINGS = ("min_ns", "max_ns", "harvest_every", "quiet_ns", "stale_ns", "shared_hold_ns", "spin_ns")


def set_reaper(changes: dict[str, int]) -> dict[str, int]:
    """Change the reaper's settings (``REAPER_SETTINGS`` names); returns the ones before."""
    reaper = stamps._reaper
    was = dict(zip(REAPER_SETTINGS, reaper.reaper_config(250000, 2000000)))
    reaper.reaper_config(*{**was, **changes}.values())
    return was


def apply_variant(spec: str) -> Callable[[], None]:
    """Apply ``k=v,...`` (``RECORDER.configure`` keywords; ``recorder.NAME=v`` sets a module constant;
    ``reaper.NAME=v`` one of ``REAPER_SETTINGS``); returns what puts the old values back."""
    from cltrace.record import recorder as rec_mod
    undo: list[Callable[[], None]] = []
    for kv in filter(None, spec.split(",")):
        k, v = kv.split("=")
        val = float(v) if "." in v or "e" in v else int(v)
        if k == "inline":  # the launching thread resolves what waits itself, in step(), every ``val`` steps
            real, count = cltrace.step, [0]

            def step(*a: Any, every: int = int(val), real: Any = real, **kw: Any) -> Any:
                count[0] += 1
                if count[0] % every == 0 and RECORDER.pending:
                    with RECORDER._lock:
                        RECORDER._step(block=False)
                return real(*a, **kw)
            cltrace.step = step  # type: ignore[assignment]
            undo.append(lambda real=real: setattr(cltrace, "step", real))
        elif k.startswith("reaper."):
            was_r = set_reaper({k.split(".", 1)[1]: int(val)})
            undo.append(lambda was_r=was_r: set_reaper(was_r) and None)
        elif k.startswith("recorder."):
            name = k.split(".", 1)[1]
            was = getattr(rec_mod, name)
            setattr(rec_mod, name, type(was)(val))
            undo.append(lambda name=name, was=was: setattr(rec_mod, name, was))
        else:
            was = getattr(RECORDER, k)
            RECORDER.configure(**{k: val})
            undo.append(lambda k=k, was=was: RECORDER.configure(**{k: was}))
    return lambda: [u() for u in reversed(undo)] and None


def variant_rows(m: Mlp, steps: int, mode: str, rounds: int, tmp: str, variants: list[str]) -> list[str]:
    """Each variant's traced runs against untraced ones, all interleaved in one process (order rotating a round)."""
    rows = {v: Row(steps) for v in variants}
    for r in range(rounds):
        k = r % len(variants)
        for v in variants[k:] + variants[:k]:
            rows[v].base.append(untraced(m, steps, mode))
            undo = apply_variant(v)
            try:
                rows[v].trace.append(traced(m, steps, mode, tmp))
            finally:
                undo()
    return [f"| {m.n} | {steps} | {mode} {v or 'default'} | {rows[v].cells()} |" for v in variants]


def probe(m: Mlp, steps: int, mode: str, tmp: str, slow_us: float, trace: bool = True) -> list[str]:
    """One run (traced, or not) with each call of the launching thread timed: the calls that took > ``slow_us``."""
    perf = time.perf_counter_ns
    calls: dict[str, list[int]] = {}
    slow: list[tuple[int, str, int]] = []

    def timed(kind: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        lst = calls.setdefault(kind, [])

        def call(*a: Any, **kw: Any) -> Any:
            t = perf()
            out = fn(*a, **kw)
            d = perf() - t
            lst.append(d)
            if d > slow_us * 1e3:
                slow.append((t, kind, d))
            return out
        return call

    saved = (m.gemm, m.relu, m.sgd, cltrace.region, cltrace.timing_region, cltrace.step)
    m.gemm, m.relu, m.sgd = (timed(k, f) for k, f in (("gemm", m.gemm), ("relu", m.relu), ("sgd", m.sgd)))

    def timed_region(real: Callable[..., Any]) -> Any:
        class TimedRegion:
            def __init__(self, name: str, q: Any) -> None:
                self.r = real(name, q)

            def __enter__(self) -> Any:
                return timed("region enter", self.r.__enter__)()

            def __exit__(self, *exc: Any) -> Any:
                return timed("region exit", self.r.__exit__)(*exc)
        return TimedRegion

    # what else ran while a call was slow: the worker's steps and flushes, and the garbage collector
    busy: dict[str, list[tuple[int, int]]] = {"worker": [], "gc": []}

    def spans_of(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*a: Any, **kw: Any) -> Any:
            t = perf()
            try:
                return fn(*a, **kw)
            finally:
                busy[name].append((t, perf()))
        return call

    gc_t: list[int] = []

    def on_gc(phase: str, info: dict) -> None:
        if phase == "start":
            gc_t.append(perf())
        elif gc_t:
            busy["gc"].append((gc_t.pop(), perf()))

    RECORDER._step = spans_of("worker", RECORDER._step)  # type: ignore[method-assign]
    RECORDER._flush_sinks = spans_of("worker", RECORDER._flush_sinks)  # type: ignore[method-assign]
    gc.callbacks.append(on_gc)
    cltrace.region = timed_region(cltrace.region)  # type: ignore[assignment]
    cltrace.timing_region = timed_region(cltrace.timing_region)  # type: ignore[assignment]
    cltrace.step = timed("step()", cltrace.step)  # type: ignore[assignment]
    RECORDER.clear()
    cltrace.configure(regions=_REGIONS.get(mode, "auto"))
    before = stamps.reaper_stats() or {}
    t0 = perf()
    try:
        if trace:
            cltrace.start(os.path.join(tmp, "probe.json"), os.path.join(tmp, "probe.pftrace"), quiet=True)
        m.loop(steps, mode)
        if trace:
            cltrace.stop()
    finally:
        m.gemm, m.relu, m.sgd, cltrace.region, cltrace.timing_region, cltrace.step = saved  # type: ignore[assignment]
        del RECORDER._step, RECORDER._flush_sinks
        gc.callbacks.remove(on_gc)
    total = perf() - t0
    after = stamps.reaper_stats() or {}
    out = [f"  probe {m.n} {mode} x{steps} {'traced' if trace else 'untraced'}: {total / 1e6:.1f} ms; reaper " + ", ".join(
               f"{k} {after.get(k, 0) - before.get(k, 0)}" for k in ("harvests", "harvests_front", "harvests_declined", "harvest_ms",
                                                                      "read_inline", "reaped"))]
    for kind, ds in sorted(calls.items()):
        if ds:
            s = sorted(ds)
            over = sum(d for d in ds if d > slow_us * 1e3)
            out.append(f"    {kind:13s} n={len(ds):6d} p50 {s[len(s) // 2] / 1e3:7.1f} us  p99 "
                       f"{s[int(len(s) * 0.99)] / 1e3:8.1f} us  max {s[-1] / 1e3:8.1f} us  "
                       f"over {slow_us:.0f} us: {sum(1 for d in ds if d > slow_us * 1e3)} calls, {over / 1e6:.1f} ms")
    slow.sort()
    if slow:
        out.append("    the slow calls overlapped (count, ms): " + "; ".join(
            f"{name} {sum(1 for t, _, d in slow if _overlaps(t, t + d, busy[name]))}, "
            f"{sum(d for t, _, d in slow if _overlaps(t, t + d, busy[name])) / 1e6:.1f}"
            for name in busy) + f"; neither {sum(1 for t, _, d in slow if not any(_overlaps(t, t + d, b) for b in busy.values()))}"
            f" (worker steps {len(busy['worker'])}, {sum(e - b for b, e in busy['worker']) / 1e6:.1f} ms; "
            f"collections {len(busy['gc'])}, {sum(e - b for b, e in busy['gc']) / 1e6:.1f} ms)")
    for t, kind, d in slow[:12]:
        out.append(f"    at {(t - t0) / 1e6:8.2f} ms  {kind:13s} {d / 1e3:9.1f} us")
    return out


def _overlaps(b: int, e: int, spans: list[tuple[int, int]]) -> bool:
    return any(sb < e and se > b for sb, se in spans)


def torch_rows(sizes: list[int], steps_list: list[int], rounds: int, tmp: str) -> list[str]:
    """PyTorch's profiler on the same step shapes in CUDA (record_function regions), end to end."""
    try:
        import torch
        from torch.profiler import ProfilerActivity, profile, record_function
    except Exception as exc:
        return [f"PyTorch: not available ({exc})"]
    if not torch.cuda.is_available():
        return ["PyTorch: no CUDA device"]
    rows = []
    for n in sizes:
        dev = torch.device("cuda")
        x, w1, w2 = (torch.randn(n, n, device=dev) * 0.01 for _ in range(3))

        def step() -> None:
            with record_function("step"):
                with record_function("forward"):
                    h = torch.relu(x @ w1)
                    y = h @ w2
                with record_function("backward"):
                    dw2 = h.t() @ y
                    dw1 = x.t() @ h
                with record_function("optimizer"):
                    w1.sub_(dw1, alpha=1e-6)
                    w2.sub_(dw2, alpha=1e-6)

        for steps in steps_list:
            for _ in range(20):
                step()
            torch.cuda.synchronize()
            ratios, bases = [], []
            for _ in range(rounds):
                t0 = time.perf_counter()
                for _ in range(steps):
                    step()
                torch.cuda.synchronize()
                b = time.perf_counter() - t0
                t0 = time.perf_counter()
                with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                    for _ in range(steps):
                        step()
                    torch.cuda.synchronize()
                prof.export_chrome_trace(os.path.join(tmp, "torch.json"))
                ratios.append((time.perf_counter() - t0) / b)
                bases.append(b)
            rows.append(f"| {n} | {steps} | {statistics.median(bases) / steps * 1e3:.3f} | "
                        f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f}) |")
    return ["PyTorch profiler, same shapes in CUDA (CPU+CUDA activities, chrome export included):",
            "| size | steps | untraced ms/step | traced / untraced |", "|---|---|---|---|", *rows]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="256,512,1024")
    ap.add_argument("--steps", default="400,2000")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--rounds", type=int, default=3, help="alternating untraced/traced pairs a cell")
    ap.add_argument("--probe", action="store_true", help="also time each call of one traced run a variant")
    ap.add_argument("--slow-us", type=float, default=200.0, help="a call slower than this blocked (--probe)")
    ap.add_argument("--torch", action="store_true", help="PyTorch's profiler on the same shapes (CUDA)")
    ap.add_argument("--variants", default="", help="';'-separated settings compared interleaved, e.g. "
                    "';resolve_interval_s=0.5;recorder.YIELD=1' (empty: the defaults)")
    ap.add_argument("--config", default="", help="RECORDER.configure keywords, e.g. max_pending=1000000")
    ap.add_argument("--reaper", default="", help="reaper settings, e.g. harvest_every=0,stale_ns=100000000000")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    steps_list = [int(s) for s in args.steps.split(",")]
    modes = args.modes.split(",")
    if args.config:
        RECORDER.configure(**{k: float(v) if "." in v else int(v)
                              for k, v in (kv.split("=") for kv in args.config.split(","))})
    if args.reaper:
        set_reaper({k: int(v) for k, v in (kv.split("=") for kv in args.reaper.split(","))})
    queue = cltrace.profiling_queue()
    print(f"device: {queue.device.name.strip()} ({queue.device.platform.name.strip()}); "
          f"span pipeline: {stamps.PATH}", flush=True)
    lines = ["| size | steps | regions | untraced ms/step | traced / untraced (middle half; range) | host enqueue ms/step, "
             "untraced -> traced | stop() ms/step |", "|---|---|---|---|---|---|---|"]
    probes: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in sizes:
            m = Mlp(queue, n)
            m.loop(20, "none")  # first launches, JIT
            for steps in steps_list:
                for mode in modes:
                    if args.variants:
                        got = variant_rows(m, steps, mode, args.rounds, tmp, args.variants.split(";"))
                        lines += got
                        print("\n".join(got), flush=True)
                        continue
                    row = ratio_row(m, steps, mode, args.rounds, tmp)
                    line = f"| {n} | {steps} | {mode} | {row.cells()} |"
                    lines.append(line)
                    print(line, flush=True)
                    if args.probe:
                        got = probe(m, steps, mode, tmp, args.slow_us, trace=False)
                        got += probe(m, steps, mode, tmp, args.slow_us)
                        probes += got
                        print("\n".join(got), flush=True)
        print("\n" + "\n".join(lines))
        if probes:
            print("\nCalls of the launching thread (one traced run each):\n" + "\n".join(probes))
        if args.torch:
            print("\n" + "\n".join(torch_rows(sizes, steps_list, args.rounds, tmp)))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
