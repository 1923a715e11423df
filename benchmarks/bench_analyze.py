"""``cltrace analyze`` on a 1M-span trace: seconds to read the file and seconds to analyse it.

The trace is synthesised (a busy in-order queue: ``step`` regions of ten kernels each, with
launch-shape attributes, plus a program rebuilt every 1000 steps and a blocking read every
100 steps so the rules have work) and written with the real ``.pftrace`` and Chrome JSON sinks.
The timed block is what ``cltrace analyze FILE`` does: ``read.load_columns`` (read), then the columns
and every analysis, findings included (analyse). Best of ``--repeat`` rounds. Each file is read on
both paths: ``native`` (the C scanner ``read/_scan.c`` into a SpanBatch, what runs by default) and
``fallback`` (the general readers, a ``Span`` per event: what runs without the C extension or with
``CLTRACE_NATIVE=0``).

Target (issue 8): read + analysis <= 10 s for 1M spans on this machine (the native path).

The ``memory`` row analyses a list of ``Span`` (the library API ``cltrace.analyze(spans)``): what the
analysis costs without reading.

    python benchmarks/bench_analyze.py [--spans 1000000] [--formats memory,pftrace,json]
                                       [--paths native,fallback] [--repeat 1]
"""
from __future__ import annotations

import argparse
import gc
import os
import sys
import tempfile
import threading
import time
from typing import Any

import numpy as np
import pyopencl as cl

import cltrace
from cltrace.analyzers.analysis import analyse_columns
from cltrace.analyzers.model import TraceData
from cltrace.export.chrome import ChromeTraceSink
from cltrace.export.perfetto import PerfettoTraceSink
from cltrace.read import load_columns, scan
from cltrace.read.tree import fill_paths
from cltrace.record.recorder import Recorder
from cltrace.timeline.spans import Span

TARGET_S = 10.0
SINKS = {"pftrace": PerfettoTraceSink, "json": ChromeTraceSink}


def workload(n: int, queue: Any) -> tuple[Recorder, list[Span]]:
    rec = Recorder()
    ident = threading.get_ident()
    th = rec.tracks.host_thread(ident)
    dt = rec.tracks.device_queue(queue, ident)
    ct = rec.tracks.compile_track()
    rng = np.random.default_rng(1)
    t = time.perf_counter_ns()
    d = t + 20_000
    off = 1_234
    sid = 0
    out: list[Span] = []
    shape = {"global_size": [65536], "local_size": [64]}
    steps = 0
    while len(out) < n:
        sid += 1
        rid, rhb, rds = sid, t, d
        t += 700
        if steps % 1000 == 0:
            sid += 1
            out.append(Span(sid, rid, "build saxpy", "build", ct, t, t + 2_000_000,
                            attrs={"source_hash": "ab" * 32, "options": ""}))
            t += 2_000_000
        for _ in range(10):
            sid += 1
            hb, he = t, t + int(rng.integers(2_000, 6_000))
            t = he + int(rng.integers(500, 3_000))
            ds = max(d, hb + 15_000)
            de = ds + int(rng.integers(5_000, 40_000))
            d = de + int(rng.integers(100, 1_000))
            out.append(Span(sid, rid, "saxpy", "kernel", th, hb, he, dt, ds - 3_000, ds - 1_000, ds, de,
                            ds + off, de + off, attrs=shape))
        if steps % 100 == 0:
            sid += 1
            ds = max(d, t + 15_000)
            out.append(Span(sid, rid, "copy DtoH", "transfer", th, t, ds + 5_000, dt, ds - 2_000, ds - 1_000, ds,
                            ds + 4_000, ds + off, ds + 4_000 + off, attrs={"bytes": 4096, "blocking": True}))
            t, d = ds + 5_500, ds + 4_000
        t += 700
        out.append(Span(rid, 0, "step", "region", th, rhb, t, dt, rds, rds, rds, d, rds + off, d + off))
        steps += 1
    return rec, out[:n]


def write(fmt: str, rec: Recorder, spans: list[Span], path: str) -> int:
    sink = SINKS[fmt](path)
    sink.start(rec)
    for i in range(0, len(spans), 65536):
        sink.write(spans[i:i + 65536])
    meta = rec.metadata()
    sink.flush(meta)
    sink.close(meta)
    return os.path.getsize(path)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spans", type=int, default=1_000_000)
    ap.add_argument("--formats", default="memory,pftrace,json")
    ap.add_argument("--paths", default="native,fallback")
    ap.add_argument("--repeat", type=int, default=1)
    args = ap.parse_args()
    queue = cltrace.profiling_queue(cl.Context([cltrace.default_device()]))
    rec, spans = workload(args.spans, queue)
    fill_paths({s.id: s for s in spans})  # as a reader or the recorder gives them
    print(f"{len(spans)} spans synthesised; target: read + analyse <= {TARGET_S:.0f} s (native path); "
          f"scanner: {scan.DETAIL}")
    head = f"| {'format':<8} | {'path':<8} | {'file MB':>8} | {'read s':>7} | {'analyse s':>9} | {'total s':>7} | " \
           f"{'target s':>8} | {'met':>3} | findings"
    print(head)
    print("|" + "|".join("-" * len(c) for c in head.split("|")[1:]))
    paths = {"native": scan.NATIVE, "fallback": None}
    with tempfile.TemporaryDirectory() as tmp:
        for fmt in args.formats.split(","):
            path = os.path.join(tmp, f"big.{fmt}")
            size = write(fmt, rec, spans, path) if fmt != "memory" else 0
            for how in (args.paths.split(",") if fmt != "memory" else ["-"]):
                if how == "native" and scan.NATIVE is None:
                    print(f"| {fmt:<8} | {how:<8} | (C scanner not built: {scan.WHY})")
                    continue
                best = None
                for _ in range(args.repeat):
                    gc.collect()
                    t0 = time.perf_counter()
                    got, meta = load_columns(path, scanner=paths[how]) if fmt != "memory" else (spans, rec.metadata())
                    t1 = time.perf_counter()
                    a = analyse_columns(TraceData(got, meta), path)
                    t2 = time.perf_counter()
                    del got
                    if best is None or t2 - t0 < best[0] + best[1]:
                        best = (t1 - t0, t2 - t1, a)
                r, an, a = best
                ok = "yes" if r + an <= TARGET_S else "no"
                print(f"| {fmt:<8} | {how:<8} | {size / 1e6:>8.1f} | {r:>7.2f} | {an:>9.2f} | {r + an:>7.2f} | "
                      f"{TARGET_S:>8.0f} | {ok:>3} | {','.join(f['rule'] for f in a.findings) or '-'}", flush=True)
            if fmt != "memory":
                os.remove(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
