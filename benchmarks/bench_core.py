"""Core costs, measured side by side in one run: regions (off and on) and Chrome JSON export.

Each row times cltrace and its baseline in alternation and keeps the best of
``--repeat`` rounds (timeit style), then prints the ratio and the target:

  disabled region      ``with timing_region("x"):`` off  vs  ``with contextlib.nullcontext():``  <= 0.6
  host region          ``with timing_region("x"):`` on, hot path only  vs  one OpenTelemetry SDK
                       span (``start_as_current_span``, SimpleSpanProcessor + InMemorySpanExporter)  <= 0.05
  host region, batch   the same against BatchSpanProcessor + InMemorySpanExporter                   <= 0.05
  host region + flush  the region with its share of resolution and statistics (``RECORDER.flush``)
  device region        a region with a queue (two markers on PoCL) against the same OTel span
  chrome export        spans/s writing resolved kernel spans with ChromeTraceSink (file closed and
                       fsynced) against the target of 300k spans/s, and against a naive exporter
                       that ``json.dumps`` every event dict

    .venv/bin/python benchmarks/bench_core.py [--spans 200000] [--repeat 7]
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import tempfile
import threading
import time
import timeit
from typing import Any, Callable

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import cltrace
from cltrace.export.chrome import ChromeTraceSink
from cltrace.record.recorder import RECORDER, Recorder
from cltrace.timeline.spans import KERNEL, REGION, Span

CHUNK = 8192  # spans per sink.write, like one recorder flush


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


def otel_tracers() -> tuple[Any, Any, Callable[[], None]]:
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


def bench_regions(repeat: int) -> list[tuple]:
    tr = cltrace.timing_region
    null = contextlib.nullcontext
    simple, batch, otel_clear = otel_tracers()
    q = cltrace.profiling_queue()

    def off() -> None:
        with tr("x"):
            pass

    def nullctx() -> None:
        with null():
            pass

    def on() -> None:
        with tr("x"):
            pass

    def on_dev() -> None:
        with tr("x", q):
            pass

    def otel() -> None:
        with simple.start_as_current_span("x"):
            pass

    def otel_batch() -> None:
        with batch.start_as_current_span("x"):
            pass

    rows = []
    assert not cltrace.enabled()
    t = best_per_call({"off": off, "null": nullctx}, 200_000, repeat)
    rows.append(("disabled region vs nullcontext", t["off"], t["null"], 0.6))

    def drop_pending() -> None:
        RECORDER.pending.clear()  # keep the hot path free of back-pressure drains
        otel_clear()

    cltrace.start()
    try:
        t = best_per_call({"on": on, "otel": otel, "batch": otel_batch}, 20_000, repeat, drop_pending)
        rows.append(("host region vs OTel span (simple)", t["on"], t["otel"], 0.05))
        rows.append(("host region vs OTel span (batch)", t["on"], t["batch"], 0.05))

        def on_and_flush() -> None:
            for _ in range(1000):
                on()
            RECORDER.flush()

        t2 = best_per_call({"on": on_and_flush}, 20, repeat, RECORDER.clear)
        rows.append(("host region + resolve vs OTel (simple)", t2["on"] / 1000, t["otel"], None))

        def finish() -> None:
            q.finish()
            RECORDER.pending.clear()
            otel_clear()

        t3 = best_per_call({"dev": on_dev, "otel": otel}, 2_000, repeat, finish)
        rows.append(("device region (2 markers) vs OTel (simple)", t3["dev"], t3["otel"], None))
    finally:
        cltrace.stop()
        RECORDER.clear()
    return rows


def synth_spans(n: int, recorder: Recorder, queue: Any) -> list[Span]:
    """Resolved spans as a training loop makes them: a region per 10 kernels, all with device times."""
    ident = threading.get_ident()
    host = recorder.tracks.host_thread(ident, "MainThread")
    dev = recorder.tracks.device_queue(queue, ident)
    t = recorder.start_ns + 1_000_000
    spans: list[Span] = []
    region = None
    # One attrs dict per launch configuration, shared by its spans, as Kernel launchers record them.
    launch_attrs = [{"global_size": (1024, 1024), "local_size": (16, 16), "kernel": k} for k in range(8)]
    for i in range(n):
        sid = i + 1
        if i % 10 == 0:
            region = Span(sid, 0, "step", REGION, host, t, t + 640_000, device_track=dev,
                          dev_queued=t + 100, dev_submit=t + 900, dev_start=t + 2_000, dev_end=t + 630_000,
                          raw_start=t + 2_000 + 77_777, raw_end=t + 630_000 + 77_777, path=("step",))
            spans.append(region)
            continue
        hb = t + (i % 10) * 60_000
        ds = hb + 9_000 + i % 7
        de = ds + 48_000 + (i % 13) * 17
        spans.append(Span(sid, region.id, "matmul_tiled" if i % 2 else "add", KERNEL, host, hb, hb + 3_100,
                          device_track=dev, dev_queued=hb + 500, dev_submit=hb + 900, dev_start=ds, dev_end=de,
                          raw_start=ds + 77_777, raw_end=de + 77_777, path=("step", "add"),
                          attrs=launch_attrs[i % 8]))
        if i % 10 == 9:
            t += 700_000
    return spans


def naive_chrome(path: str, spans: list[Span], recorder: Recorder) -> None:
    """The straightforward exporter: one dict per event, json.dumps each."""
    tracks = recorder.tracks
    base = recorder.start_ns
    pid = tracks.pid
    with open(path, "w", encoding="utf-8") as fh:
        fh.write("[\n")
        for s in spans:
            args = {"span": s.id, "parent": s.parent, "source": s.source, **(s.attrs or {})}
            fh.write(json.dumps({"ph": "X", "cat": s.cat, "name": s.name, "pid": pid, "tid": s.thread,
                                 "ts": (s.host_begin - base) / 1e3, "dur": s.host_ns / 1e3, "args": args}) + ",\n")
            if s.device_track is not None:
                fh.write(json.dumps({"ph": "X", "cat": s.cat, "name": s.name, "pid": 1, "tid": s.device_track,
                                     "ts": (s.dev_start - base) / 1e3, "dur": (s.dev_end - s.dev_start) / 1e3,
                                     "args": args}) + ",\n")
        fh.write("{}]\n")


def bench_export(n: int, repeat: int) -> tuple[list[tuple], float]:
    recorder = Recorder()
    spans = synth_spans(n, recorder, cltrace.profiling_queue())
    out = tempfile.mkdtemp(prefix="cltrace-bench-")
    path = os.path.join(out, "trace.json")
    naive_path = os.path.join(out, "naive.json")
    best = {"chrome": float("inf"), "naive": float("inf")}
    size = 0
    for _ in range(repeat):
        t0 = time.perf_counter()
        sink = ChromeTraceSink(path)
        sink.start(recorder)
        for k in range(0, n, CHUNK):
            sink.write(spans[k:k + CHUNK])
        sink.close(recorder.metadata())
        best["chrome"] = min(best["chrome"], time.perf_counter() - t0)
        size = os.path.getsize(path)
        t0 = time.perf_counter()
        naive_chrome(naive_path, spans, recorder)
        best["naive"] = min(best["naive"], time.perf_counter() - t0)
    for p in (path, naive_path):
        os.remove(p)
    os.rmdir(out)
    rate = n / best["chrome"]
    rows = [("chrome export spans/s vs 300k target", rate, 300_000.0, None),
            ("chrome export time vs naive json.dumps", best["chrome"], best["naive"], None)]
    return rows, size / n


def fmt_time(s: float) -> str:
    if s >= 1e-3:
        return f"{s * 1e3:.2f} ms"
    if s >= 1e-6:
        return f"{s * 1e6:.2f} us"
    return f"{s * 1e9:.0f} ns"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spans", type=int, default=200_000, help="spans for the export benchmark")
    ap.add_argument("--repeat", type=int, default=7, help="rounds; the best of each is kept")
    args = ap.parse_args()

    rows = bench_regions(args.repeat)
    export_rows, bytes_per_span = bench_export(args.spans, max(3, args.repeat // 2))
    print(f"cltrace core benchmarks  (device: {cltrace.default_device().name.strip()}, "
          f"best of {args.repeat}, cpus: {os.cpu_count()})")
    head = f"{'benchmark':<44} {'cltrace':>12} {'baseline':>12} {'ratio':>8} {'target':>9}  ok"
    print(head)
    print("-" * len(head))
    for name, ours, base, target in rows:
        ratio = ours / base
        tgt = f"<= {target:g}" if target is not None else "-"
        ok = ("yes" if ratio <= target else "NO") if target is not None else ""
        print(f"{name:<44} {fmt_time(ours):>12} {fmt_time(base):>12} {ratio:>8.3f} {tgt:>9}  {ok}")
    rate_row, time_row = export_rows
    rate = rate_row[1]
    print(f"{rate_row[0]:<44} {rate:>10,.0f}/s {rate_row[2]:>10,.0f}/s {rate / rate_row[2]:>8.3f} "
          f"{'>= 1':>9}  {'yes' if rate >= rate_row[2] else 'NO'}")
    print(f"{time_row[0]:<44} {fmt_time(time_row[1]):>12} {fmt_time(time_row[2]):>12} "
          f"{time_row[1] / time_row[2]:>8.3f} {'-':>9}")
    print(f"chrome export: {bytes_per_span:.0f} bytes per span ({args.spans} spans, 90% kernels with "
          "host+device slices and a flow, 10% regions)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
