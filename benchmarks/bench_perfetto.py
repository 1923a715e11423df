"""Perfetto exporter: spans/s written and bytes per span, side by side with the Chrome JSON exporter.

Both sinks get the same resolved spans in the same batches (as the recorder hands them over),
alternating runs and keeping each one's best, so machine load hits both alike. Tracks are named
from a real PoCL queue; the spans themselves are generated, so only the writers are timed.
A last row traces real launches on PoCL into both formats in one session.

Targets (from the issue): >= 300k spans/s written; <= 30 bytes per plain kernel span (host and
device slices and the flow between them, no attributes).

    python benchmarks/bench_perfetto.py [--spans 200000] [--batch 8192] [--repeat 3]
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from collections import defaultdict
from typing import Any, Callable

import numpy as np
import pyopencl as cl
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

import cltrace
from cltrace.export.chrome import ChromeTraceSink
from cltrace.export.perfetto import PerfettoTraceSink
from cltrace.read.perfetto import iter_packets
from cltrace.record.recorder import Recorder
from cltrace.timeline.spans import Span

TARGET_SPANS_PER_S = 300_000
TARGET_BYTES_PER_KERNEL = 30


def workload(n: int, queue: Any, region_every: int = 0, attrs: bool = False) -> tuple[Recorder, list[Span]]:
    """Kernel spans (optionally inside regions of ``region_every``), timed like a busy in-order queue."""
    rec = Recorder()
    ident = threading.get_ident()
    th = rec.tracks.host_thread(ident)
    dt = rec.tracks.device_queue(queue, ident)
    rng = np.random.default_rng(1)
    t = time.perf_counter_ns()
    d = t + 20_000
    raw_offset = 1_234
    ids = iter(range(1, 10 * n))
    out: list[Span] = []

    def kernel(parent: int) -> Span:
        nonlocal t, d
        sid = next(ids)
        hb = t
        he = hb + int(rng.integers(2_000, 6_000))
        t = he + int(rng.integers(500, 3_000))
        ds = max(d, hb + 15_000)
        de = ds + int(rng.integers(5_000, 40_000))
        d = de + int(rng.integers(100, 1_000))
        a = {"global_size": (65536,), "local_size": None} if attrs else None
        return Span(sid, parent, "saxpy", "kernel", th, hb, he, dt, ds - 3_000, ds - 1_000, ds, de,
                    ds + raw_offset, de + raw_offset, attrs=a)

    while len(out) < n:
        if region_every:
            rid = next(ids)
            rhb, rds = t, d
            t += 700
            kids = [kernel(rid) for _ in range(region_every)]
            rhe = t
            t += 700
            out.extend(kids)
            out.append(Span(rid, 0, "step", "region", th, rhb, rhe, dt, rds, rds, rds, d,
                            rds + raw_offset, d + raw_offset))
        else:
            out.append(kernel(0))
    return rec, out


def write(sink_cls: Callable[[str], Any], rec: Recorder, spans: list[Span], path: str,
          batch: int) -> tuple[float, int]:
    """Seconds to write ``spans`` through a sink (start to close) and the file size."""
    sink = sink_cls(path)
    t0 = time.perf_counter()
    sink.start(rec)
    for i in range(0, len(spans), batch):
        sink.write(spans[i:i + batch])
    meta = rec.metadata()
    sink.flush(meta)
    sink.close(meta)
    return time.perf_counter() - t0, os.path.getsize(path)


def best_of(repeat: int, rec: Recorder, spans: list[Span], tmp: str, batch: int) -> dict[str, tuple[float, int]]:
    """Best time and file size per format, runs alternating after one untimed run of each."""
    best: dict[str, tuple[float, int]] = {}
    for i in range(repeat + 1):
        for name, cls, suffix in (("pftrace", PerfettoTraceSink, ".pftrace"), ("json", ChromeTraceSink, ".json")):
            secs, size = write(cls, rec, spans, os.path.join(tmp, "bench" + suffix), batch)
            if i and (name not in best or secs < best[name][0]):
                best[name] = (secs, size)
    return best


def packet_sizes(path: str) -> dict[str, float]:
    """Mean bytes (framing included) of each kind of slice packet in a trace of plain kernels."""
    sizes: dict[str, list[int]] = defaultdict(list)
    device_seqs: set[int] = set()  # sequences whose BEGINs end a flow: device queue tracks
    for _, raw in iter_packets(open(path, "rb").read()):
        p = pb.TracePacket.FromString(raw)
        te = p.track_event
        if not p.HasField("track_event") or te.type not in (te.TYPE_SLICE_BEGIN, te.TYPE_SLICE_END):
            continue
        if te.terminating_flow_ids:
            device_seqs.add(p.trusted_packet_sequence_id)
        kind = ("device " if p.trusted_packet_sequence_id in device_seqs else "host ") + (
            "BEGIN" if te.type == te.TYPE_SLICE_BEGIN else "END")
        sizes[kind].append(len(raw) + 2)
    return {k: float(np.mean(v)) for k, v in sorted(sizes.items())}


def real_run(queue: Any, launches: int, tmp: str) -> dict[str, float]:
    """Bytes per span of each format for real launches on PoCL, traced in one session."""
    prg = cl.Program(queue.context, "__kernel void inc(__global float *a) { a[get_global_id(0)] += 1.0f; }").build()
    k = prg.inc
    buf = cl.Buffer(queue.context, cl.mem_flags.READ_WRITE, 4 * 256)
    js, pf = os.path.join(tmp, "real.json"), os.path.join(tmp, "real.pftrace")
    with cltrace.trace(js, pf) as rec:
        for step in range(launches // 8):
            with cltrace.region("step", queue):
                for _ in range(8):
                    cltrace.launch(k, queue, (256,), None, buf)
        n = len(rec.spans())
    return {"spans": n, "json": os.path.getsize(js) / n, "pftrace": os.path.getsize(pf) / n}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spans", type=int, default=200_000)
    ap.add_argument("--batch", type=int, default=8192, help="spans per write (the recorder's batches)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--launches", type=int, default=4000, help="real PoCL launches for the last row")
    args = ap.parse_args(argv)
    queue = cltrace.profiling_queue()
    print(f"device: {queue.device.name.strip()}; {args.spans} spans per run, batches of {args.batch}, "
          f"best of {args.repeat}; python {sys.version.split()[0]}")
    with tempfile.TemporaryDirectory() as tmp:
        empty_rec, _ = workload(1, queue)
        _, empty_pf = write(PerfettoTraceSink, empty_rec, [], os.path.join(tmp, "empty.pftrace"), args.batch)
        _, empty_js = write(ChromeTraceSink, empty_rec, [], os.path.join(tmp, "empty.json"), args.batch)
        rows = []
        for label, kw in (("plain kernels", {}), ("kernels, regions of 8", {"region_every": 8}),
                          ("kernels with launch attrs", {"attrs": True})):
            rec, spans = workload(args.spans, queue, **kw)
            best = best_of(args.repeat, rec, spans, tmp, args.batch)
            pf_s, pf_b = best["pftrace"]
            js_s, js_b = best["json"]
            rows.append((label, len(spans) / pf_s, len(spans) / js_s, js_s / pf_s,
                         (pf_b - empty_pf) / len(spans), (js_b - empty_js) / len(spans)))
            if not kw:
                breakdown = packet_sizes(os.path.join(tmp, "bench.pftrace"))
        real = real_run(queue, args.launches, tmp)

    print()
    print(f"{'workload':28s} {'pftrace spans/s':>16s} {'json spans/s':>13s} {'speed ratio':>12s} "
          f"{'pftrace B/span':>15s} {'json B/span':>12s} {'size ratio':>11s}")
    for label, pf_rate, js_rate, speed, pf_b, js_b in rows:
        print(f"{label:28s} {pf_rate:16,.0f} {js_rate:13,.0f} {speed:11.2f}x {pf_b:15.1f} {js_b:12.1f} "
              f"{js_b / pf_b:10.1f}x")
    print(f"{'real PoCL launches':28s} {'':16s} {'':13s} {'':12s} {real['pftrace']:15.1f} {real['json']:12.1f} "
          f"{real['json'] / real['pftrace']:10.1f}x   ({real['spans']:.0f} spans)")
    print()
    print("plain kernel span, mean bytes per packet (framing included):")
    for kind, size in breakdown.items():
        print(f"  {kind:14s} {size:5.1f}")
    print(f"  {'total':14s} {sum(breakdown.values()):5.1f}")
    plain = rows[0]
    worst_rate = min(r[1] for r in rows)
    print()
    print(f"target >= {TARGET_SPANS_PER_S:,} spans/s: slowest workload {worst_rate:,.0f} spans/s "
          f"({'met' if worst_rate >= TARGET_SPANS_PER_S else 'NOT met'})")
    print(f"target <= {TARGET_BYTES_PER_KERNEL} B per plain kernel span: {plain[4]:.1f} B "
          f"({'met' if plain[4] <= TARGET_BYTES_PER_KERNEL else 'NOT met'})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
