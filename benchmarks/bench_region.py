"""An enabled region's cost: the C region, the Python fallback and one OpenTelemetry SDK span, side by side.

Rows (``with cltrace.timing_region("x"): pass`` with tracing on, hot path only, measured as
``bench_core.py`` measures it (its helpers copied here): contenders alternate, best of ``--repeat`` rounds, the recorder's
deque emptied between rounds):

  native region      the C ``__enter__``/``__exit__`` (``cltrace.record._region``)
  python region      the fallback ``regions._Region``, the code ``CLTRACE_NATIVE=0`` runs; switched
                     on in this same process so both meet the same machine load
  OTel span          ``start_as_current_span`` with SimpleSpanProcessor + InMemorySpanExporter
                     (and BatchSpanProcessor for the second ratio)
  device region      a region with a queue (two markers each), native and fallback
  OTLP context       the region while an OTLP sink is attached (``otel_context.OtelRegion``: the Python
                     path plus reading, attaching and detaching the OpenTelemetry context), alone and
                     under an SDK span (the region is then noted as that span's child)

    .venv/bin/python benchmarks/bench_region.py [--number 20000] [--repeat 9]
"""
from __future__ import annotations

import argparse
import contextlib
import os
import timeit
from typing import Any, Callable, Iterator

from opentelemetry import trace as otel_trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import cltrace
from cltrace.record import otel_context, regions
from cltrace.record.recorder import RECORDER


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


def otel_tracers() -> tuple[Any, Any, Callable[[], None]]:
    """OpenTelemetry SDK tracers with SimpleSpanProcessor and BatchSpanProcessor into memory, and a clear."""
    simple = TracerProvider()
    simple_exp = InMemorySpanExporter()
    simple.add_span_processor(SimpleSpanProcessor(simple_exp))
    batch = TracerProvider()
    batch_exp = InMemorySpanExporter()
    batch.add_span_processor(BatchSpanProcessor(batch_exp))

    def clear() -> None:
        simple_exp.clear()
        batch.force_flush()
        batch_exp.clear()

    return simple.get_tracer("bench"), batch.get_tracer("bench"), clear


@contextlib.contextmanager
def python_regions() -> Iterator[None]:
    """The fallback for the duration: what regions.py selects at import under CLTRACE_NATIVE=0."""
    native, chosen = regions._NativeRegion, regions._RegionType
    regions._NativeRegion, regions._RegionType = None, regions._Region
    try:
        yield
    finally:
        regions._NativeRegion, regions._RegionType = native, chosen


@contextlib.contextmanager
def otlp_context() -> Iterator[None]:
    """Regions as they run while an OTLP sink is attached (its export left out: hot path only)."""
    otel_context.claim(0x1234 << 32, 0xABCD, None, False)
    try:
        yield
    finally:
        otel_context.release()


def bench(number: int, repeat: int) -> list[tuple[str, float, float, float | None]]:
    tr = cltrace.timing_region
    simple, batch, otel_clear = otel_tracers()
    q = cltrace.profiling_queue()
    have_native = regions._NativeRegion is not None

    def host() -> None:
        with tr("x"):
            pass

    def dev() -> None:
        with tr("x", q):
            pass

    def otel() -> None:
        with simple.start_as_current_span("x"):
            pass

    def otel_batch() -> None:
        with batch.start_as_current_span("x"):
            pass

    request = simple.start_span("request")

    def under_span() -> None:
        with otel_trace.use_span(request):
            with tr("x"):
                pass

    best: dict[str, float] = {}

    def run(label: str, fn: Callable[[], None], n: int, python: bool, between: Callable[[], None],
            otlp: bool = False) -> None:
        """One round of one contender (the fallback or the OTLP context switched on around the whole round)."""
        ctx = python_regions() if python else otlp_context() if otlp else contextlib.nullcontext()
        with ctx:
            t = best_per_call({label: fn}, n, 1, between)[label]
        best[label] = min(best.get(label, float("inf")), t)

    def drop() -> None:
        RECORDER.pending.clear()  # keep the hot path free of back-pressure drains
        otel_clear()

    def finish() -> None:
        q.finish()
        drop()

    cltrace.start()
    try:
        for _ in range(repeat):  # rounds alternate between all contenders
            if have_native:
                run("native", host, number, False, drop)
            run("python", host, number, True, drop)
            run("otel", otel, number, False, drop)
            run("otel_batch", otel_batch, number, False, drop)
            run("otlp", host, number, False, drop, otlp=True)
            run("otlp_under_span", under_span, number, False, drop, otlp=True)
            run("under_span_off", under_span, number, False, drop)
            if have_native:
                run("native_dev", dev, max(1, number // 10), False, finish)
            run("python_dev", dev, max(1, number // 10), True, finish)
    finally:
        cltrace.stop()
        RECORDER.clear()

    rows: list[tuple[str, float, float, float | None]] = []
    if have_native:
        rows += [("native region / OTel span (simple)", best["native"], best["otel"], 0.02),
                 ("native region / OTel span (batch)", best["native"], best["otel_batch"], 0.02)]
    rows += [("python region / OTel span (simple)", best["python"], best["otel"], 0.02),
             ("python region / OTel span (batch)", best["python"], best["otel_batch"], 0.02)]
    if have_native:
        rows += [("native region / python region", best["native"], best["python"], None),
                 ("native device region / python (2 markers)", best["native_dev"], best["python_dev"], None)]
    else:
        rows += [("python device region (2 markers) / OTel", best["python_dev"], best["otel"], None)]
    plain = "native" if have_native else "python"
    rows += [(f"OTLP-context region / {plain} region", best["otlp"], best[plain], None),
             ("OTLP-context region / OTel span (simple)", best["otlp"], best["otel"], None),
             ("under an SDK span: OTLP on / off", best["otlp_under_span"], best["under_span_off"], None)]
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--number", type=int, default=20_000, help="regions per round")
    ap.add_argument("--repeat", type=int, default=9, help="rounds; the best of each is kept")
    args = ap.parse_args()
    rows = bench(args.number, args.repeat)
    path = regions.REGION_PATH if not regions.REGION_WHY else f"{regions.REGION_PATH} ({regions.REGION_WHY})"
    print(f"enabled region cost  (region path at import: {path}; device: "
          f"{cltrace.default_device().name.strip()}, best of {args.repeat}, cpus: {os.cpu_count()})")
    head = f"{'benchmark':<44} {'cltrace':>10} {'baseline':>10} {'ratio':>8} {'target':>9}  ok"
    print(head)
    print("-" * len(head))
    for name, ours, base, target in rows:
        ratio = ours / base
        tgt = f"<= {target:g}" if target is not None else "-"
        ok = ("yes" if ratio <= target else "NO") if target is not None else ""
        print(f"{name:<44} {fmt_time(ours):>10} {fmt_time(base):>10} {ratio:>8.3f} {tgt:>9}  {ok}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
