"""The Chrome JSON writer's file, byte for byte: the same batches give the same file on the native path
(the C extension's batch path) and the pure-Python fallback, and that file is the one the writer wrote
before the batch path existed (its SHA-256, taken from that writer on these batches).

The batches hold every kind of row the writer treats apart: device slices with and without flows, host-only
spans, failed spans (escapes, no message, a lone surrogate), attrs shared, per row, empty and renamed,
call sites, negative relative times, tracks first named in a later batch, more distinct names than the
head cache keeps, a batch with interning tables of its own, and flushes between batches.
"""
from __future__ import annotations

import errno

import hashlib
import os
import sys
import threading
import time
from typing import Any

import numpy as np
import pytest

from cltrace.export import chrome, chrome_lines
from cltrace.export.base import FixedTrace
from cltrace.export.chrome import ChromeTraceSink
from cltrace.timeline.batch import COLUMNS, SpanBatch, Tables
from cltrace.timeline.sites import CallSite
from cltrace.timeline.tracks import DEVICE_QUEUE, Track, TrackRegistry

from test_chrome_native import DISABLED, native

# SHA-256 of the file the writer wrote before its batch path (commit 95f1131, either encoder).
PINNED = "5a804a68a6f1abbc4f806c030263e305d55ee3a963629c7ef2edaad26403f0a2"
START = 5_000_000_000


def recorder() -> Any:
    tracks = TrackRegistry()
    tracks.pid = 4242
    for i in range(4):
        tracks.host_thread(100 + i, f"thread {i} ✓")
    for i in range(4):
        tracks._add(("queue", i), DEVICE_QUEUE, f"queue {i}", f"OpenCL: dev{i % 2}", device=f"dev{i % 2}")
    tracks.host_thread(200, "late thread")
    tracks._add(("queue", 9), DEVICE_QUEUE, "late queue", "OpenCL: dev2", device="dev2")
    return FixedTrace(tracks, Tables(), START, process_names={4242: "pinned program ✓"})


class Rand:
    """Seeded numbers by splitmix64 in numpy integer arithmetic: the same on every numpy version
    (``np.random`` streams may change between versions, and the file is pinned)."""

    def __init__(self, seed: int) -> None:
        self.state = np.uint64(seed)

    def bits(self, n: int) -> np.ndarray:
        with np.errstate(over="ignore"):
            x = np.arange(1, n + 1, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15) + self.state
            self.state = x[-1]
            x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
            x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
            return x ^ (x >> np.uint64(31))

    def integers(self, lo: int, hi: int, n: int) -> np.ndarray:
        return lo + (self.bits(n) % np.uint64(hi - lo)).astype(np.int64)

    def random(self, n: int) -> np.ndarray:
        return (self.bits(n) >> np.uint64(11)).astype(np.float64) / float(1 << 53)


def batch(tables: Tables, n: int, seed: int, *, names: int = 3, late: bool = False) -> SpanBatch:
    """n rows of every kind, from a seeded generator; ``names`` distinct kernel names (k0, k1, ...)."""
    rng = Rand(seed)
    cats = [tables.cats.id(c) for c in ("kernel", "region", "transfer", "build")]
    kind = rng.integers(0, 4, n)
    cols: dict[str, Any] = {}
    cols["id"] = np.arange(1, n + 1) + seed * 1_000_000
    cols["parent"] = np.where(rng.random(n) < 0.3, 0, cols["id"] - 1)
    cols["name"] = np.array([tables.names.id(f"k{i}" if k != 1 else 'step "✓"\u2028')
                             for i, k in zip(rng.integers(0, names, n).tolist(), kind.tolist())], np.int32)
    cols["cat"] = np.array(cats, np.int16)[kind]
    threads = 5 if late else 4
    cols["thread"] = 1 + rng.integers(0, threads - 1, n)
    if late:
        cols["thread"][n // 2:] = np.where(rng.random(n - n // 2) < 0.5, 9, cols["thread"][n // 2:])
    begin = START + rng.integers(-50_000, 10**12, n)
    begin[::97] = START - rng.integers(1, 10**6, len(begin[::97]))  # before the trace start
    cols["host_begin"] = begin
    cols["host_end"] = begin + rng.integers(-5, 10**7, n)
    dev = (kind != 3) & (rng.random(n) < 0.9)
    queue = 5 + rng.integers(0, 4, n)
    if late:
        queue[n // 2:] = np.where(rng.random(n - n // 2) < 0.5, 10, queue[n // 2:])
    cols["track"] = np.where(dev, queue, 0)
    start = begin + rng.integers(-3_000, 40_000, n)
    for c, v in (("dev_queued", begin + 300), ("dev_submit", begin + 800), ("dev_start", start),
                 ("dev_end", start + rng.integers(0, 10**6, n)), ("raw_start", start + 7_777_000_000_123),
                 ("raw_end", start + 7_777_001_000_456)):
        cols[c] = np.where(dev, v, 0)
    cols["status"] = (rng.random(n) < 0.02).astype(np.int8)
    cols["path"] = np.zeros(n, np.int32) + tables.paths.id(("step",))
    here = CallSite("/src/train ✓.py", 12, "step")
    deep = CallSite("/src/model.py", 7, "forward", (CallSite("/src/train ✓.py", 30, "main"),))
    sites = [-1, tables.sites.id(here), tables.sites.id(deep)]
    cols["site"] = np.array(sites, np.int32)[rng.integers(0, 3, n)]
    configs = [{"global": [4096], "local": None}, {"global": [64, 64], "local": [8, 8], "kernel.args": 3},
               {"span": "mine", "f": float("nan"), "u": "é\"\\\t"}, {}]
    attrs: list[Any] = []
    for i, a in enumerate(rng.integers(0, 6, n).tolist()):
        attrs.append(configs[a] if a < 4 else None if a == 4 else {"row": i, "s": f"r{i} ✓"})
    messages = ['OSError: disk "full"\nline two — ✓ \\ \t', None, "bad \ud800 text", ""]
    errors = {i: messages[i % 4] for i in np.flatnonzero(cols["status"]).tolist() if messages[i % 4] is not None}
    for c, dtype in COLUMNS:
        cols[c] = np.asarray(cols[c], dtype)
    return SpanBatch(tables, cols, attrs, errors)


def write(path: Any, native: bool) -> bytes:
    rec = recorder()
    t = rec.tables
    parts = [batch(t, 4096, 1), batch(t, 700, 2, names=5000), batch(t, 5000, 3, late=True),
             batch(Tables(), 300, 4), batch(t, 1, 5), batch(t, 2500, 6, names=50)]
    sink = ChromeTraceSink(path, flush_every=3000, native=native)
    sink.start(rec)
    for b in parts:
        sink.write(b)
    sink.close({"pinned": True, "clocks": [1, 2.5]})
    with open(path, "rb") as fh:
        data = fh.read()
    assert len(data) == sink.bytes_written
    return data


def test_the_fallback_writes_the_pinned_file(tmp_path: Any) -> None:
    data = write(tmp_path / "python.json", False)
    assert hashlib.sha256(data).hexdigest() == PINNED


def test_the_native_batch_path_writes_the_same_file(tmp_path: Any, monkeypatch: Any) -> None:
    native()
    calls: list[int] = []
    fill = chrome_lines.NATIVE.fill  # type: ignore[union-attr]

    def counted(*args: Any) -> Any:
        calls.append(1)
        return fill(*args)

    monkeypatch.setattr(chrome_lines, "NATIVE", chrome_lines.NATIVE._replace(fill=counted))  # type: ignore[union-attr]
    data = write(tmp_path / "native.json", True)
    assert calls, "the batch path did not run"
    assert data == write(tmp_path / "python.json", False)
    assert hashlib.sha256(data).hexdigest() == PINNED


@pytest.mark.skipif(DISABLED, reason="CLTRACE_NATIVE=0: fallback-only run")
def test_rows_larger_than_the_buffer_and_track_ids_past_the_tables(tmp_path: Any, monkeypatch: Any) -> None:
    """A row longer than the whole buffer gets a larger buffer; a track id no lookup table covers sends the
    batch to the numpy path; both write what the fallback writes."""
    native()
    monkeypatch.setattr(chrome, "_BUFFER", 4096)
    far_id = chrome._NO_TRACK + 5

    def run(path: Any, native: bool) -> bytes:
        rec = recorder()
        rec.tracks._tracks[far_id] = Track(far_id, DEVICE_QUEUE, "far queue", "OpenCL: dev0", device="dev0")
        b = batch(rec.tables, 200, 7)
        b.attrs[3] = {"big": "x" * 10_000}
        far = batch(rec.tables, 50, 8)
        far.track[far.track != 0] = far_id
        sink = ChromeTraceSink(path, native=native)
        sink.start(rec)
        sink.write(b)
        sink.write(far)
        sink.write(b)
        sink.close({})
        with open(path, "rb") as fh:
            return fh.read()

    data = run(tmp_path / "n.json", True)
    assert b'"big": "xxxx' in data and b'"tid":%d,' % far_id in data
    assert data == run(tmp_path / "p.json", False)


@pytest.mark.skipif(DISABLED, reason="CLTRACE_NATIVE=0: fallback-only run")
def test_fill_lets_other_threads_run(tmp_path: Any, monkeypatch: Any) -> None:
    """The rows are written without the GIL: a Python thread counts while ``fill`` runs (with the GIL held
    it could not: the switch interval is far longer than the call)."""
    native()
    args: list[Any] = []
    fill = chrome_lines.NATIVE.fill  # type: ignore[union-attr]
    monkeypatch.setattr(chrome_lines, "NATIVE", chrome_lines.NATIVE._replace(  # type: ignore[union-attr]
        fill=lambda *a: args.append(a) or fill(*a)))
    rec = recorder()
    sink = ChromeTraceSink(tmp_path / "g.json")
    sink.start(rec)
    sink.write(batch(rec.tables, 20_000, 1))
    sink.close({})
    _, _, _, n, base, cols, luts, ncat, tables, _fd = args[0]
    out = bytearray(1000 * n)
    count = [0]
    stop = threading.Event()

    def counter() -> None:
        while not stop.is_set():
            count[0] += 1

    old = sys.getswitchinterval()
    sys.setswitchinterval(0.5)
    t = threading.Thread(target=counter)
    try:
        t.start()
        time.sleep(0.01)  # the counter runs; it gives the GIL back within 0.5 s of this thread asking
        progress = []
        t0 = time.monotonic()
        # ~2 ms a call: well inside the interval. Until the counter moves (a loaded host may not schedule
        # it during one call); every call stays far inside the 0.5 s a held GIL would keep it still.
        while not any(progress) and len(progress) < 100 and time.monotonic() - t0 < 0.3:
            before = count[0]
            row, _, _ = fill(out, 0, 0, n, base, cols, luts, ncat, tables)
            progress.append(count[0] - before)
            assert row == n
    finally:
        stop.set()
        sys.setswitchinterval(old)
        t.join()
    assert max(progress) > 0, progress


@pytest.mark.skipif(DISABLED or os.name != "posix", reason="the native path's writes to a descriptor")
def test_fill_writes_full_buffers_itself_one_call_a_batch(tmp_path: Any, monkeypatch: Any) -> None:
    """With the file's descriptor, ``fill`` hands each full buffer to the file in its own pass: one call
    (one hand-over of the GIL) a batch however small the buffer, the same bytes; a write that fails is an
    OSError naming the cause."""
    native()
    monkeypatch.setattr(chrome, "_BUFFER", 8192)
    calls: list[Any] = []
    fill = chrome_lines.NATIVE.fill  # type: ignore[union-attr]
    monkeypatch.setattr(chrome_lines, "NATIVE", chrome_lines.NATIVE._replace(  # type: ignore[union-attr]
        fill=lambda *a: calls.append(a) or fill(*a)))
    rec = recorder()
    b = batch(rec.tables, 3000, 4)
    sink = ChromeTraceSink(tmp_path / "fd.json")
    sink.start(rec)
    sink.write(b)
    assert len(calls) == 1 and os.path.getsize(tmp_path / "fd.json") > 100 * 8192
    sink.close({})
    monkeypatch.setattr(chrome, "_FILL_FD", False)
    plain = ChromeTraceSink(tmp_path / "plain.json")
    plain.start(rec)
    plain.write(b)
    plain.close({})
    assert len(calls) > 2
    assert (tmp_path / "fd.json").read_bytes() == (tmp_path / "plain.json").read_bytes()
    out, _, _, n, base, cols, luts, ncat, tables, _ = calls[0]
    with open(tmp_path / "fd.json", "rb") as ro:
        with pytest.raises(OSError) as err:
            fill(bytearray(8192), 0, 0, n, base, cols, luts, ncat, tables, ro.fileno())
    assert err.value.errno == errno.EBADF


def test_columns_that_are_strided_views(tmp_path: Any) -> None:
    """A batch whose columns are views with strides (every other row of another batch's arrays) is written
    as its rows (the native path copies such columns before the C extension reads them)."""
    def run(path: Any, native: bool) -> bytes:
        rec = recorder()
        whole = batch(rec.tables, 400, 9)
        cols = {c: getattr(whole, c)[::2] for c, _ in COLUMNS}
        assert not cols["id"].flags.c_contiguous
        errors = {i // 2: e for i, e in whole.errors.items() if i % 2 == 0}
        half = SpanBatch(rec.tables, cols, whole.attrs[::2], errors)
        sink = ChromeTraceSink(path, native=native)
        sink.start(rec)
        sink.write(half)
        sink.close({})
        with open(path, "rb") as fh:
            return fh.read()

    data = run(tmp_path / "a.json", True)
    assert data == run(tmp_path / "p.json", False)
    assert data.count(b'"ph":"X"') > 200
