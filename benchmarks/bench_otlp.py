"""OTLP delivery throughput to a real collector (rotel, blackhole exporter) on loopback.

Synthetic resolved spans (kernels with device placement inside regions, as the
recorder delivers them) go through ``OtlpSink.write`` in recorder-sized chunks;
the clock runs from the first write until the sink reports every span delivered.
Rows: gRPC and HTTP with cltrace's direct OTLP encoding (the default) and with the
OpenTelemetry SDK encoder on ReadableSpans (``sdk_encoder=True``), side by side.
Target: >= 50k spans/s delivered.

    .venv/bin/python benchmarks/bench_otlp.py [--spans 200000]
"""
from __future__ import annotations

import argparse
import os
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

from otlp_collector import RotelCollector  # noqa: E402

import cltrace  # noqa: E402
from cltrace.export.otlp import OtlpSink  # noqa: E402
from cltrace.record.recorder import RECORDER  # noqa: E402
from cltrace.timeline.spans import KERNEL, REGION, Span  # noqa: E402

TARGET = 50_000
CHUNK = 8192  # spans per write, like one recorder flush


def synthetic_spans(n: int) -> list[Span]:
    """Regions of 15 kernels each; every span is device-placed on a real PoCL queue track."""
    q = cltrace.profiling_queue()
    ident = threading.get_ident()
    host = RECORDER.tracks.host_thread(ident)
    dev = RECORDER.tracks.device_queue(q, ident)
    t = time.perf_counter_ns()
    out: list[Span] = []
    sid = 10_000_000
    while len(out) < n:
        sid += 1
        region = sid
        r0 = t
        for k in range(15):
            sid += 1
            t += 2_000
            out.append(Span(sid, region, "matmul_tiled", KERNEL, host, t, t + 1_500, dev,
                            t + 100, t + 300, t + 900, t + 5_900, 10**9 + t + 900, 10**9 + t + 5_900,
                            {"global_size": (1024, 1024), "local_size": (16, 16)},
                            path=("train", "step", "matmul_tiled")))
        out.append(Span(region, 0, "step", REGION, host, r0, t + 6_000, dev, r0 + 50, r0 + 80,
                        r0 + 200, t + 6_000, 10**9 + r0 + 200, 10**9 + t + 6_000, path=("train", "step")))
    return out[:n]


def run(sink: OtlpSink, spans: list[Span]) -> tuple[float, float, dict]:
    sink.start(RECORDER)
    write_s = 0.0
    t0 = time.perf_counter()
    for i in range(0, len(spans), CHUNK):
        w0 = time.perf_counter()
        sink.write(spans[i:i + CHUNK])
        write_s += time.perf_counter() - w0
    sink.force_flush(120)
    elapsed = time.perf_counter() - t0
    st = sink.stats()
    sink.close(RECORDER.metadata())
    return elapsed, write_s, st


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--spans", type=int, default=200_000)
    ap.add_argument("--sdk-spans", type=int, default=30_000, help="spans for the slower SDK-encoder rows")
    args = ap.parse_args()
    print(f"rotel collector (blackhole), loopback; {os.cpu_count()} CPUs shared with the collector")
    rows = []
    with RotelCollector(debug=False) as col:
        cases = [
            ("grpc, direct encoding", dict(endpoint=col.grpc_endpoint, protocol="grpc"), args.spans),
            ("http, direct encoding", dict(endpoint=col.http_endpoint, protocol="http/protobuf"), args.spans),
            ("grpc, SDK encoder", dict(endpoint=col.grpc_endpoint, protocol="grpc", sdk_encoder=True), args.sdk_spans),
            ("http, SDK encoder", dict(endpoint=col.http_endpoint, protocol="http/protobuf", sdk_encoder=True),
             args.sdk_spans),
        ]
        for label, kw, n in cases:
            spans = synthetic_spans(n)
            sink = OtlpSink(timeout_s=30, max_queue_spans=n + 1, **kw)
            elapsed, write_s, st = run(sink, spans)
            rows.append((label, n, st["delivered"], elapsed, n / elapsed, write_s / n * 1e9))
    print(f"{'path':<24}{'spans':>9}{'delivered':>11}{'seconds':>9}{'spans/s':>10}"
          f"{'x target':>10}{'write() ns/span':>17}")
    for label, n, delivered, elapsed, rate, wns in rows:
        print(f"{label:<24}{n:>9}{delivered:>11}{elapsed:>9.2f}{rate:>10.0f}{rate / TARGET:>10.2f}{wns:>17.1f}")
    base = {r[0].split(",")[0]: r[4] for r in rows if "direct" in r[0]}
    for label, _, _, _, rate, _ in rows:
        if "SDK" in label:
            proto = label.split(",")[0]
            print(f"direct / SDK encoder ({proto}): {base[proto] / rate:.2f}x")


if __name__ == "__main__":
    main()
