"""The windowed readers (``read/windows.py`` for .pftrace, ``read/chrome_windows.py`` for .json) against the
whole-file readers, and loading by windows.

Real traces (the demo run here, the H200 demo kept in ``traces/``, a program with call sites, attributes
and a failed region, a 40k-span run written by the real sinks, packed and plain, each as .pftrace and
.json), read with windows from 2 KiB (a .pftrace window per packed chunk, most empty, each doubling until
a packet fits) to 4 MiB: the same spans
(every field: paths, sites, attributes, errors) and the same metadata as ``load_columns``, whole or cut
off anywhere. A file outside cltrace's layout is left to the whole-file readers. Memory: reading in
windows holds a fraction of what the whole file holds (traced allocations). The store holds the same
rows whichever way a file was loaded.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from big_trace import write_big_trace
from cltrace.read import load_columns, scan
from cltrace.read.inflate import expand
from cltrace.read.window_base import SidSet
from cltrace.read.windows import open_windows
from cltrace.timeline.batch import SpanBatch

pytestmark = pytest.mark.skipif(scan.NATIVE is None, reason=f"C scanner not in use: {scan.WHY}")
FIELDS = ("id", "parent", "name", "cat", "thread", "host_begin", "host_end", "device_track", "dev_queued",
          "dev_submit", "dev_start", "dev_end", "raw_start", "raw_end", "attrs", "status", "error", "path", "site")
HERE = Path(__file__).resolve().parent
WINDOWS = (2 << 10, 64 << 10, 4 << 20)

PROGRAM = r"""
import sys
import numpy as np
import pyopencl as cl
import cltrace
ctx = cl.Context([cltrace.default_device()])
q = cltrace.profiling_queue(ctx)
prg = cl.Program(ctx, "__kernel void inc(__global float *a) { a[get_global_id(0)] += 1.0f; }").build()
buf = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, 4096)

def forward():
    cltrace.launch(prg.inc, q, (1024,), None, buf)

from cltrace.export.perfetto import PerfettoTraceSink

cltrace.configure(stack_depth=2)
with cltrace.trace(PerfettoTraceSink(sys.argv[1], flush_every=64), sys.argv[2]):
    host = np.zeros(1024, np.float32)
    with cltrace.region("train", attrs={"lr": 0.1}):
        for step in cltrace.steps(range(40), q):
            with cltrace.region("forward", q, attrs={"batch": step}):
                forward()
            cltrace.copy(q, host, buf)
            try:
                with cltrace.region("check"):
                    if step == 7:
                        raise ValueError("loss is nan")
            except ValueError:
                pass
    q.finish()
"""


def records(spans: Any) -> list[tuple[Any, ...]]:
    return sorted((tuple(getattr(s, f) for f in FIELDS) for s in spans), key=lambda r: (r[5], r[0]))


def windowed(path: Path, window: int) -> tuple[list[tuple[Any, ...]], dict[str, Any], int]:
    wt = open_windows(path, window_bytes=window)
    assert wt is not None, "the windowed reader refused a file of cltrace's own"
    batches = list(wt.batches())
    assert all(isinstance(b, SpanBatch) for b in batches)
    return records(s for b in batches for s in b), wt.metadata(), len(batches)


def same(path: Path, window: int) -> int:
    """Asserts the windows hold the whole file's spans and metadata; the batches they came in."""
    whole, meta = load_columns(path)
    got, wmeta, n = windowed(path, window)
    assert wmeta == meta
    assert got == records(whole)
    return n


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("windows")
    from cltrace.cli.demo import run_demo

    demo = run_demo(out_dir=str(out / "demo"), steps=8, formats=("pftrace", "json"))
    env = {k: v for k, v in os.environ.items() if k not in ("CLTRACE", "CLTRACE_OUT", "PYOPENCL_CTX")}
    env.update(CLTRACE_CACHE_DIR=str(out / "cache"), CLTRACE_QUIET="1")
    program = out / "program.pftrace"
    proc = subprocess.run([sys.executable, "-c", PROGRAM, str(program), str(out / "program.json")],
                          capture_output=True, text=True, timeout=240, env=env, cwd=out)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    big = out / "big.pftrace"
    write_big_trace(40_000, str(big), str(out / "big.json"))
    plain = out / "plain.pftrace"
    plain.write_bytes(expand(big.read_bytes()).data)
    traces = HERE.parent / "traces"
    by_ext = {os.path.splitext(p)[1]: Path(p) for p in demo.paths}
    return {"demo": by_ext[".pftrace"], "h200": traces / "h200-demo.pftrace", "program": program, "big": big,
            "plain": plain, "demo.json": by_ext[".json"], "h200.json": traces / "h200-demo.json",
            "program.json": out / "program.json", "big.json": out / "big.json"}


@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("name", ["demo", "h200", "program", "big", "plain", "demo.json", "h200.json",
                                  "program.json", "big.json"])
def test_windows_hold_the_whole_files_spans_and_metadata(files: dict[str, Path], name: str, window: int) -> None:
    n = same(files[name], window)
    if name in ("plain", "big.json") and window == WINDOWS[0]:
        assert n > 3  # the spans came out window by window, not all at the end


@pytest.mark.parametrize("name", ["program", "program.json"])
def test_a_file_of_errors_attributes_and_sites_keeps_them(files: dict[str, Path], name: str) -> None:
    got, _, _ = windowed(files[name], WINDOWS[0])
    by = {f: i for i, f in enumerate(FIELDS)}
    failed = [r for r in got if r[by["status"]] == "error"]
    assert [(r[by["name"]], r[by["error"]]) for r in failed] == [("check", "ValueError: loss is nan")]
    assert any(r[by["site"]] is not None for r in got if r[by["cat"]] == "kernel")
    assert {r[by["attrs"]]["batch"] for r in got if r[by["name"]] == "forward"} == set(range(40))
    assert {r[by["path"]] for r in got if r[by["cat"]] == "kernel"} == {("train", "forward", "inc")}


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cut=st.floats(0.01, 0.999), name=st.sampled_from(["big", "plain", "program", "big.json", "program.json"]))
def test_a_file_cut_anywhere_reads_as_the_whole_file_reader_reads_it(files: dict[str, Path], cut: float, name: str,
                                                                      tmp_path_factory: Any) -> None:
    data = files[name].read_bytes()
    path = tmp_path_factory.mktemp("cut") / f"t{files[name].suffix}"
    path.write_bytes(data[:max(int(len(data) * cut), 64)])
    whole, meta = load_columns(path)
    if not isinstance(whole, SpanBatch):  # the whole-file scanner left it to the general reader: so do windows
        assert open_windows(path, window_bytes=WINDOWS[1]) is None
        return
    got, wmeta, _ = windowed(path, WINDOWS[1])
    assert wmeta == meta and "truncated" in meta
    assert got == records(whole)


def test_a_file_outside_the_layout_is_left_to_the_whole_file_readers(files: dict[str, Path], tmp_path: Path) -> None:
    from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

    data = expand(files["demo"].read_bytes()).data
    extra = pb.Trace()
    p = extra.packet.add()
    p.trusted_packet_sequence_id = 99
    p.track_event.name = "inline name"  # a slice's name not interned: not cltrace's layout
    p.track_event.type = pb.TrackEvent.TYPE_SLICE_BEGIN
    path = tmp_path / "foreign.pftrace"
    path.write_bytes(data + extra.SerializeToString())
    assert not isinstance(load_columns(path)[0], SpanBatch)  # the whole-file scanner also leaves it
    assert open_windows(path) is None
    other = tmp_path / "other.pftrace"
    other.write_bytes(extra.SerializeToString())
    assert open_windows(other) is None
    lines = files["demo.json"].read_text().splitlines()
    for k, bad in enumerate(('{"ph": "X", "cat": "region", "name": "spaced", "pid": 1, "tid": 1, "ts": 5.0, "dur": 1.0, "args": '
                              '{"span": 99999, "parent": 0}},', '{"torn": ',)):
        path = tmp_path / f"foreign{k}.json"  # a span in another layout; a torn line before readable ones
        path.write_text("\n".join(lines[:5] + [bad] + lines[5:]) + "\n")
        assert not isinstance(load_columns(path)[0], SpanBatch)
        assert open_windows(path, window_bytes=WINDOWS[0]) is None


def test_reading_in_windows_holds_a_fraction_of_the_whole_file(tmp_path: Path) -> None:
    """Traced allocations (numpy's and the scanner's own): windows of 256 KiB against the whole file. Plain
    packets (a packed chunk of the sink is 65536 spans, the least a window holds)."""
    path = tmp_path / "t.pftrace"
    n = write_big_trace(400_000, str(path))
    path.write_bytes(expand(path.read_bytes()).data)

    def peak(read: Any) -> int:
        tracemalloc.start()
        try:
            read()
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    def in_windows() -> None:
        wt = open_windows(path, window_bytes=256 << 10)
        assert wt is not None and sum(b.n for b in wt.batches()) == n

    whole = peak(lambda: load_columns(path))
    windows = peak(in_windows)
    assert windows < whole / 4, (windows, whole)


def test_span_id_sets_dense_and_sparse() -> None:
    import numpy as np

    s = SidSet()
    s.add(np.array([1, 5, 9, 1 << 40, -3], np.int64))
    s.add(np.array([2, 1 << 40], np.int64))
    got = s.contains(np.array([1, 2, 3, 5, 9, 10, 1 << 40, (1 << 40) + 1, -3, -4, 1 << 20], np.int64))
    assert got.tolist() == [True, True, False, True, True, False, True, False, True, False, False]


def test_the_store_holds_the_same_rows_loaded_whole_or_by_windows(files: dict[str, Path], tmp_path: Path) -> None:
    pytest.importorskip("chdb")
    from cltrace.store import Store
    from cltrace.store.load import load_file

    rows = []
    for k, windowed_from in enumerate((1 << 62, 0)):
        with Store(tmp_path / f"s{k}") as store:
            for name in ("program", "big", "program.json"):
                r = load_file(store.client, str(files[name]), store.database, store.table, windowed_from=windowed_from,
                              chunk_rows=5000)
                assert not r.skipped and r.spans > 1
            q = store.client.query
            rows.append([q(f'SELECT * FROM "{store.database}"."{t}" ORDER BY TraceId, SpanId').result_rows
                         for t in (store.table, "cltrace_spans")])
    assert rows[0] == rows[1]
    assert len(rows[0][0]) == len(rows[0][1]) > 40_000
