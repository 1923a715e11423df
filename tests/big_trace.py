"""A trace of N spans written fast with the real sinks, for tests of reading large files.

Steps of a ``step`` region holding ten ``saxpy`` kernels on an in-order queue and a ``finish`` are made as
columns, 65 536 spans a write, and handed to ``PerfettoTraceSink`` / ``ChromeTraceSink`` as a traced run
hands them its batches (benchmarks/bench_bigread.py and bench_store.py write their traces with it, as bench_otlp uses tests/otlp_collector.py).
Run as a script, it writes the files named: ``python tests/big_trace.py N OUT.pftrace [OUT.json]``.
"""
from __future__ import annotations

import sys
import threading

import numpy as np

PER_STEP = 12


def write_big_trace(n: int, *paths: str, seed: int = 0, slow: bool = False) -> int:
    """Write about ``n`` spans to each path (by suffix); returns the span count. ``slow``: kernels 1.5 times as
    long (a straggler rank, benchmarks/bench_store.py)."""
    import pyopencl as cl

    import cltrace
    from cltrace.export.chrome import ChromeTraceSink
    from cltrace.export.perfetto import PerfettoTraceSink
    from cltrace.record.recorder import Recorder
    from cltrace.timeline.batch import SpanBatch

    queue = cltrace.profiling_queue(cl.Context([cltrace.default_device()]))
    rec = Recorder()
    ident = threading.get_ident()
    th, dt = rec.tracks.host_thread(ident), rec.tracks.device_queue(queue, ident)
    t = rec.tables
    k = 10
    sinks = [PerfettoTraceSink(p) if p.endswith(".pftrace") else ChromeTraceSink(p) for p in paths]
    for s in sinks:
        s.start(rec)
    total = max(n // PER_STEP, 1)
    rng = np.random.default_rng(seed)
    t_next = rec.start_ns + 1_000_000
    written = 0
    for first in range(0, total, 65_536 // PER_STEP):
        steps = min(65_536 // PER_STEP, total - first)
        kdur = rng.integers(20_000, 40_000, (steps, k)) * (3 if slow else 2) // 2  # device ns of each kernel
        step_len = kdur.sum(1) + 30_000
        s0 = t_next + np.r_[0, np.cumsum(step_len)[:-1]]
        t_next = int(s0[-1] + step_len[-1])
        ids = np.arange(steps * PER_STEP, dtype=np.int64).reshape(steps, PER_STEP) + 1 + first * PER_STEP
        parent = np.repeat(ids[:, :1], PER_STEP, 1)
        parent[:, 0] = 0
        hb = np.empty((steps, PER_STEP), np.int64)
        he = np.empty_like(hb)
        ds = np.zeros_like(hb)
        de = np.zeros_like(hb)
        kstart = s0[:, None] + 10_000 + np.c_[np.zeros(steps, np.int64), np.cumsum(kdur, 1)[:, :-1]]
        hb[:, 1:1 + k] = s0[:, None] + 1_000 + np.arange(k) * 800
        he[:, 1:1 + k] = hb[:, 1:1 + k] + 600
        ds[:, 1:1 + k] = kstart
        de[:, 1:1 + k] = kstart + kdur
        hb[:, 1 + k], he[:, 1 + k] = s0 + 9_000, s0 + step_len - 5_000
        hb[:, 0], he[:, 0] = s0, s0 + step_len - 4_000
        ds[:, 0], de[:, 0] = s0 + 10_000, de[:, k]
        track = np.zeros((steps, PER_STEP), np.int64)
        track[:, :1 + k] = dt
        cat = np.zeros((steps, PER_STEP), np.int16)
        cat[:, 0], cat[:, 1:1 + k], cat[:, 1 + k] = t.cats.id("region"), t.cats.id("kernel"), t.cats.id("sync")
        name = np.zeros((steps, PER_STEP), np.int32)
        name[:, 0], name[:, 1:1 + k], name[:, 1 + k] = t.names.id("step"), t.names.id("saxpy"), t.names.id("finish")
        path = np.zeros((steps, PER_STEP), np.int32)
        path[:, 0] = t.paths.id(("step",))
        path[:, 1:1 + k] = t.paths.id(("step", "saxpy"))
        path[:, 1 + k] = t.paths.id(("step", "finish"))
        attrs = ([None] + [{"global_size": [65536], "local_size": [64]}] * k + [{"blocking": True}]) * steps
        cols = {"id": ids, "parent": parent, "name": name, "cat": cat, "thread": np.full_like(ids, th),
                "host_begin": hb, "host_end": he, "track": track, "dev_queued": ds - 3_000 * (track != 0),
                "dev_submit": ds - 1_000 * (track != 0), "dev_start": ds, "dev_end": de,
                "raw_start": ds + 1_234 * (track != 0), "raw_end": de + 1_234 * (track != 0), "path": path}
        batch = SpanBatch(t, {c: v.reshape(-1) for c, v in cols.items()}, attrs)
        for s in sinks:
            s.write(batch)
        written += batch.n
    meta = rec.metadata()
    meta["recorded_spans"] = written
    for s in sinks:
        s.flush(meta)
        s.close(meta)
    return written


if __name__ == "__main__":
    print(write_big_trace(int(sys.argv[1]), *sys.argv[2:]))
