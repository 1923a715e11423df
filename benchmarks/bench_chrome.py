"""The Chrome JSON writer: batch encoders against the per-span f-string writer they replaced.

~200k realistic resolved spans (90 % kernel launches with a device slice and a flow, under 10 %
regions with a device slice; launch attrs shared per configuration, four threads, a queue per
thread), written in batches of 4096 as the pipeline's worker does, timed from ``start()`` to the
file closed. Rows, each against the per-span writer (a copy of the loop as it was, kept below):

  native        ChromeTraceSink with the C extension encoder (``_chrome``)
  python        ChromeTraceSink with the pure-Python encoder (the fallback, CLTRACE_NATIVE=0)
  per-span      the previous writer: one f-string per span over column lists

spans/s is wall time (best of the rounds); spans/CPU-s counts this process's CPU time only, the
steadier figure on a shared machine (it includes the kernel copying the text into the page cache).

All three files are checked first: the same event lines in the same order (new-track metadata
lines may sit elsewhere). Runs on the default OpenCL device only for track names.

    .venv/bin/python benchmarks/bench_chrome.py [--spans 200000] [--rounds 5]
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from typing import Any, Callable, Sequence

import numpy as np

import cltrace
from cltrace.export import chrome_lines
from cltrace.export.base import FixedTrace
from cltrace.export.chrome import ChromeTraceSink, _encode_attrs, _esc, _us
from cltrace.timeline.batch import NAMES, SpanBatch, Tables, as_batch
from cltrace.timeline.spans import REGION_CATS, Span
from cltrace.timeline.tracks import TrackRegistry

BATCH = 4096
_MS = tuple(f"{i:03d}" for i in range(1000))


class PerSpanSink(ChromeTraceSink):
    """The writer before batch encoders: its ``write`` loop and text caches, verbatim but for the flows' category
    (now the slice's own, as the product writes it, so the event lines still compare equal)."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self._old_heads: dict[str, tuple[str, str]] = {}
        self._old_hheads: dict[int, str] = {}
        self._old_dheads: dict[int, str] = {}
        self._old_attrs: dict[int, tuple[Any, str]] = {}

    def write(self, spans: Sequence[Span]) -> None:
        fh = self._fh
        if fh is None or not spans:
            return
        b = as_batch(spans, self._ctx.tables)
        tracks = self._ctx.tracks
        seen = self._tracks_written
        base = self._base
        host_pid = self._host_pid
        heads = self._old_heads
        hheads = self._old_hheads
        dheads = self._old_dheads
        enc_cache = self._old_attrs
        ms = _MS
        out: list[str] = []
        app = out.append
        packed = 0
        region_cats = REGION_CATS
        errors = b.errors
        hb_ = (b.host_begin - base).tolist()
        hd_ = (b.host_end - b.host_begin).tolist()
        ds_ = (b.dev_start - base).tolist()
        dd_ = (b.dev_end - b.dev_start).tolist()
        rows = zip(b.id.tolist(), b.parent.tolist(), b.name_list(), b.cat_list(), b.thread.tolist(), hb_, hd_,
                   b.track.tolist(), b.dev_queued.tolist(), b.dev_submit.tolist(), ds_, dd_,
                   b.raw_start.tolist(), b.raw_end.tolist(), b.status.tolist(), b.attrs)
        for i, (sid, parent, name, cat, th, hb, hd, dt, dq, dsub, ds, dd, rs, re_, bad, attrs) in enumerate(rows):
            if len(out) >= 256:
                self._emit_lines(out)
                out.clear()
            hh = hheads.get(th)
            if hh is None:
                if th not in seen:
                    self._track_meta(tracks.get(th), out)
                hh = f'"pid":{host_pid},"tid":{th},"ts":'
                if th in seen:
                    hheads[th] = hh
            head = heads.get(name)
            if head is None or head[0] != cat:
                if len(heads) >= 4096:
                    heads.clear()
                head = heads[name] = (cat, f'{{"ph":"X","cat":"{cat}","name":{_esc(name)},')
            xh = head[1]
            ts = f"{hb // 1000}.{ms[hb % 1000]}" if hb >= 0 else _us(hb)
            dur = f"{hd // 1000}.{ms[hd % 1000]}" if hd >= 0 else _us(hd)
            if attrs:
                hit = enc_cache.get(id(attrs))
                a = hit[1] if hit is not None and hit[0] is attrs else self._old_attrs_text(attrs)
            else:
                a = ""
            if dt:
                dev = (f',"source":"device","queued_host_ns":{dq},"submit_host_ns":{dsub},'
                       f'"device.start":{rs},"device.end":{re_}')
            else:
                dev = ',"source":"host"'
            if bad:
                dev += f',"status":"error","error":{_esc(errors.get(i) or "")}'
            args = f'{{"span":{sid},"parent":{parent}{dev}{a}}}'
            if not dt:
                app(f'{xh}{hh}{ts},"dur":{dur},"args":{args}}},')
                continue
            dh = dheads.get(dt)
            if dh is None:
                lead = f'{xh}{hh}{ts},"dur":{dur},"args":{args}}},\n'
                packed += 1
                if dt not in seen:
                    app(lead[:-1])
                    self._track_meta(tracks.get(dt), out)
                    lead = ""
                    packed -= 1
                dpid = self._pids[tracks.get(dt).process]
                dh = f'"pid":{dpid},"tid":{dt},"ts":'
                if dt in seen:
                    dheads[dt] = dh
            else:
                lead = None
            dts = f"{ds // 1000}.{ms[ds % 1000]}" if ds >= 0 else _us(ds)
            ddur = f"{dd // 1000}.{ms[dd % 1000]}" if dd >= 0 else _us(dd)
            if lead is None:
                if cat in region_cats:
                    app(f'{xh}{hh}{ts},"dur":{dur},"args":{args}}},\n{xh}{dh}{dts},"dur":{ddur},"args":{args}}},')
                    packed += 1
                else:
                    app(f'{xh}{hh}{ts},"dur":{dur},"args":{args}}},\n{xh}{dh}{dts},"dur":{ddur},"args":{args}}},\n'
                        f'{{"ph":"s","cat":"{cat}","name":"launch","id":{sid},{hh}{ts}}},\n'
                        f'{{"ph":"f","bp":"e","cat":"{cat}","name":"launch","id":{sid},{dh}{dts}}},')
                    packed += 3
            elif cat in region_cats:
                app(f'{lead}{xh}{dh}{dts},"dur":{ddur},"args":{args}}},')
            else:
                app(f'{lead}{xh}{dh}{dts},"dur":{ddur},"args":{args}}},\n'
                    f'{{"ph":"s","cat":"{cat}","name":"launch","id":{sid},{hh}{ts}}},\n'
                    f'{{"ph":"f","bp":"e","cat":"{cat}","name":"launch","id":{sid},{dh}{dts}}},')
                packed += 2
        self.events_written += packed
        if out:
            self._emit_lines(out)
        self._since_flush += b.n
        if self._since_flush >= self.flush_every:
            self._flush_os()

    def _old_attrs_text(self, attrs: dict[str, Any]) -> str:
        cache = self._old_attrs
        if len(cache) >= 4096:
            cache.clear()
        a = _encode_attrs(attrs)
        a = "," + a[1:-1] if len(a) > 2 else ""
        cache[id(attrs)] = (attrs, a)
        return a


def workload(n: int) -> tuple[Any, list[SpanBatch]]:
    """n resolved spans as the resolver hands them over: regions of 9 kernel launches on 4 threads."""
    q = cltrace.profiling_queue()
    tracks = TrackRegistry()
    tables = Tables()
    threads = [tracks.host_thread(100 + k, f"worker-{k}") for k in range(4)]
    queues = [tracks.device_queue(q, 100 + k) for k in range(4)]
    configs = [{"global": [4096 * (k + 1)], "local": [64], "kernel.args": 3} for k in range(3)]
    kernels = ["matmul_tile", "softmax", "layer_norm"]
    rng = np.random.default_rng(1)
    rows: dict[str, list[int]] = {c: [] for c in NAMES}
    attrs: list[Any] = []
    start = 5_000_000_000
    t = start + 1000
    region_id = 0
    name_id = {nm: tables.names.id(nm) for nm in kernels + ["step"]}
    cat_id = {c: tables.cats.id(c) for c in ("kernel", "region")}
    path_id = tables.paths.id(("step",))
    for i in range(n):
        k = i % 4
        step = i % 10 == 0
        hd = int(rng.integers(2_000, 9_000)) if not step else 120_000
        dq = t + 300
        ds = t + int(rng.integers(2_000, 40_000))
        dd = int(rng.integers(1_000, 80_000))
        if step:
            region_id = i + 1
        j = (i // 4) % 3
        row = (i + 1, 0 if step else region_id, name_id["step" if step else kernels[j]],
               cat_id["region" if step else "kernel"], threads[k], t, t + hd, queues[k], dq, dq + 500, ds, ds + dd,
               ds + 7_777_000_000, ds + dd + 7_777_000_000, 0, path_id, -1)  # -1: no call site
        for c, v in zip(NAMES, row):
            rows[c].append(v)
        attrs.append(None if step else configs[j])
        t += int(rng.integers(3_000, 12_000))
    cols = {c: np.array(v) for c, v in rows.items()}
    whole = SpanBatch(tables, cols, attrs)
    batches = [whole.take(slice(i, i + BATCH)) for i in range(0, n, BATCH)]
    return FixedTrace(tracks, tables, start), batches


def run(make: Callable[[str], ChromeTraceSink], rec: Any, batches: list[SpanBatch], path: str) -> tuple[float, float]:
    """(wall, process CPU) seconds from a new sink's start to its file closed; a new file each time."""
    if os.path.exists(path):
        os.unlink(path)
    t0, c0 = time.perf_counter(), time.process_time()
    sink = make(path)
    sink.start(rec)
    for b in batches:
        sink.write(b)
    sink.close({"bench": True})
    return time.perf_counter() - t0, time.process_time() - c0


def event_lines(path: str) -> list[bytes]:
    with open(path, "rb") as fh:
        return [ln for ln in fh.read().split(b"\n") if ln.startswith(b'{"ph":"')]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--spans", type=int, default=200_000)
    ap.add_argument("--rounds", type=int, default=5, help="best of this many runs per writer")
    args = ap.parse_args()
    rec, batches = workload(args.spans)
    n = sum(b.n for b in batches)
    writers: list[tuple[str, Callable[[str], ChromeTraceSink]]] = []
    if chrome_lines.NATIVE is not None:
        writers.append(("native (C extension)", lambda p: ChromeTraceSink(p)))
    else:
        print(f"native encoder not available: {chrome_lines.WHY}")
    writers.append(("python encoder", lambda p: ChromeTraceSink(p, native=False)))
    writers.append(("per-span f-strings (before)", PerSpanSink))
    print(f"python {sys.version.split()[0]}; default encoder path: {chrome_lines.DETAIL}; {n:,} spans "
          f"in batches of {BATCH}; best of {args.rounds}")
    with tempfile.TemporaryDirectory() as tmp:
        paths = [os.path.join(tmp, f"w{i}.json") for i in range(len(writers))]
        for (name, make), path in zip(writers, paths):
            run(make, rec, batches, path)
        want = event_lines(paths[-1])
        for (name, _), path in zip(writers, paths):
            if event_lines(path) != want:
                raise SystemExit(f"{name}: its event lines differ from the per-span writer's")
        size = os.path.getsize(paths[-1])
        wall = {name: float("inf") for name, _ in writers}
        cpu = dict(wall)
        for _ in range(args.rounds):  # interleaved: a busy machine slows every writer alike
            for (name, make), path in zip(writers, paths):
                w, c = run(make, rec, batches, path)
                wall[name], cpu[name] = min(wall[name], w), min(cpu[name], c)
    base = wall[writers[-1][0]]
    print(f"same event lines from every writer; {size / n:.0f} B per span in the file; load average "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs\n")
    print(f"{'writer':30} {'spans/s':>12} {'MB/s':>8} {'speed-up':>9} {'spans/CPU-s':>12}")
    for name, _ in writers:
        print(f"{name:30} {n / wall[name]:>12,.0f} {size / wall[name] / 1e6:>8.0f} {base / wall[name]:>8.2f}x "
              f"{n / cpu[name]:>12,.0f}")


if __name__ == "__main__":
    main()
