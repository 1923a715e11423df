"""The columnar readers (``read/_scan.c`` into a ``SpanBatch``) against the general ``Span`` readers, and
the kernel table split per device.

On real traces made here (the demo, a two-device PoCL run) in both formats, complete and cut off at
any byte: the columns hold the same spans and metadata as the objects, ``cltrace summary`` and
``cltrace analyze`` say the same on either path. Files the scanner does not know fall back to the
general readers. The 1M-span benchmark is ``benchmarks/bench_analyze.py``, not a test.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cltrace.analyze.analysis import analyze
from cltrace.analyze.summary import summarize
from cltrace.read import load, load_columns, scan
from cltrace.read.tree import fill_paths, path_ids
from cltrace.timeline.batch import SpanBatch, Tables
from cltrace.timeline.spans import Span
from cltrace.timeline.stats import Stats

needs_scanner = pytest.mark.skipif(scan.NATIVE is None, reason=f"C scanner not in use: {scan.WHY}")
FIELDS = ("id", "parent", "name", "cat", "thread", "host_begin", "host_end", "device_track", "dev_start", "dev_end",
          "raw_start", "raw_end", "attrs", "status", "error", "path")


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from cltrace.cli.demo import run_demo

    out = tmp_path_factory.mktemp("demo")
    res = run_demo(out_dir=str(out), steps=8, formats=("json", "pftrace"))
    return {os.path.splitext(p)[1]: Path(p) for p in res.paths}


def same_spans(path: Path) -> SpanBatch:
    """Asserts the columns of ``path`` hold exactly the general reader's spans and metadata."""
    spans, meta = load(path)
    batch, cmeta = load_columns(path)
    assert isinstance(batch, SpanBatch), "the scanner fell back to the general reader"
    assert cmeta == meta
    got = batch.spans()
    assert len(got) == len(spans)
    for a, b in zip(spans, got):
        assert [getattr(a, f) for f in FIELDS] == [getattr(b, f) for f in FIELDS], (a, b)
        if path.suffix == ".json":  # the .pftrace carries no queued/submit stamps
            assert (a.dev_queued, a.dev_submit) == (b.dev_queued, b.dev_submit)
    return batch


def test_pftrace_goes_to_the_general_reader_until_the_scanner_reads_sites_and_memory(demo: dict[str, Path]) -> None:
    got, meta = load_columns(demo[".pftrace"])
    assert isinstance(got, list) and any(s.site for s in got) and meta.get("memory_samples")


@needs_scanner
@pytest.mark.parametrize("ext", [".json"])
def test_columns_hold_the_same_spans_as_the_objects(demo: dict[str, Path], ext: str) -> None:
    batch = same_spans(demo[ext])
    assert batch.n > 50 and (batch.track != 0).any() and any(batch.attrs)


@needs_scanner
@pytest.mark.parametrize("ext", [".json"])
def test_summary_and_analysis_are_the_same_on_either_path(demo: dict[str, Path], ext: str) -> None:
    spans, meta = load(demo[ext])
    stats = Stats()
    stats.add(sorted(spans, key=lambda s: s.host_begin))
    got, gmeta = summarize(demo[ext])
    assert got.as_dict() == stats.as_dict() and gmeta == meta
    fast = analyze(demo[ext]).as_dict()
    slow = analyze(spans, meta=meta).as_dict()
    fast.pop("source"), slow.pop("source")
    assert fast == slow


FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@needs_scanner
@FUZZ
@given(cut=st.floats(0.02, 0.999), ext=st.sampled_from([".json", ".pftrace"]))
def test_a_file_cut_anywhere_reads_the_same(demo: dict[str, Path], cut: float, ext: str, tmp_path_factory: Any) -> None:
    data = demo[ext].read_bytes()
    path = tmp_path_factory.mktemp("cut") / f"t{ext}"
    path.write_bytes(data[:max(int(len(data) * cut), 64)])
    try:
        spans, meta = load(path)
    except Exception as exc:  # the general reader refuses it: so must the columns, with the same line
        with pytest.raises(type(exc), match=".+") as info:
            load_columns(path)
        assert str(info.value) == str(exc)
        return
    batch, cmeta = load_columns(path)
    assert cmeta == meta
    if ext == ".json":  # a .pftrace cut exactly between packets reads as whole to the general reader
        assert "truncated" in meta
    if isinstance(batch, SpanBatch):
        batch = batch.spans()
    assert [[getattr(s, f) for f in FIELDS] for s in batch] == [[getattr(s, f) for f in FIELDS] for s in spans]


@needs_scanner
def test_cut_files_are_read_by_the_scanner_itself(demo: dict[str, Path], tmp_path: Path) -> None:
    """Cut between events (a run killed after a flush), the columns do the reading, not the fallback."""
    for ext, data in ((e, p.read_bytes()) for e, p in demo.items() if e == ".json"):
        path = tmp_path / f"cut{ext}"
        path.write_bytes(data[:len(data) // 2])
        batch = same_spans(path)
        assert batch.n and load_columns(path)[1]["truncated"]["read_bytes"] <= len(data) // 2


def test_foreign_and_damaged_files_fall_back_to_the_general_reader(demo: dict[str, Path], tmp_path: Path) -> None:
    events = [json.loads(ln.rstrip(",")) for ln in demo[".json"].read_text().splitlines()[1:-1]
              if ln.strip() not in ("", "]")]
    pretty = tmp_path / "pretty.json"
    pretty.write_text(json.dumps({"traceEvents": events}, indent=1))
    spaced = tmp_path / "spaced.json"
    spaced.write_text("[\n" + ",\n".join(json.dumps(e) for e in events) + "\n]\n")
    for p in (pretty, spaced):
        got, meta = load_columns(p)
        assert isinstance(got, list)  # the general reader's Span objects
        ref, rmeta = load(demo[".json"])
        assert [[getattr(s, f) for f in FIELDS] for s in got] == [[getattr(s, f) for f in FIELDS] for s in ref]
    broken = tmp_path / "broken.json"
    lines = demo[".json"].read_text().splitlines()
    lines[len(lines) // 2] = lines[len(lines) // 2][:20]  # a torn line in the middle: the general reader skips it
    broken.write_text("\n".join(lines) + "\n")
    got, meta = load_columns(broken)
    assert isinstance(got, list) and meta["truncated"]["skipped"] == 1


def test_without_the_scanner_the_general_readers_answer(demo: dict[str, Path]) -> None:
    for p in demo.values():
        got, meta = load_columns(p, scanner=None)
        spans, ref = load(p)
        assert isinstance(got, list) and meta == ref and len(got) == len(spans)


def test_paths_from_parent_links_match_fill_paths() -> None:
    rows = [(1, 0, "a"), (2, 1, "b"), (3, 2, "c"), (4, 99, "d"), (5, 1, "b"), (6, 0, "b")]
    spans = {i: Span(i, p, n, "region", 1, 0, 1) for i, p, n in rows}
    fill_paths(spans)
    t = Tables()
    import numpy as np

    ids = np.array([r[0] for r in rows])
    got = path_ids(ids, np.array([r[1] for r in rows]), np.array([t.names.id(r[2]) for r in rows]), t)
    assert [t.paths.values[k] for k in got] == [spans[i].path for i in ids.tolist()]
    loop = path_ids(np.array([1, 2]), np.array([2, 1]), np.array([t.names.id("x")] * 2), t)
    assert loop is None  # parent links in a circle: left to fill_paths


TWO_DEVICES = """
import sys
import numpy as np
import pyopencl as cl
import cltrace
PLAT = next(p for p in cl.get_platforms() if "Portable" in p.name)
PROF = cl.command_queue_properties.PROFILING_ENABLE
SRC = '''
__kernel void add(__global float *a) { a[get_global_id(0)] += 1.0f; }
__kernel void spin(__global float *a, const int n) {
    float x = a[get_global_id(0)]; for (int k = 0; k < n; ++k) x = x * 0.999f + 0.5f; a[get_global_id(0)] = x; }
'''
setups = []
for d in PLAT.get_devices():
    ctx = cl.Context([d])
    q = cl.CommandQueue(ctx, properties=PROF)
    prg = cl.Program(ctx, SRC).build()
    setups.append((q, prg, cl.Buffer(ctx, cl.mem_flags.READ_WRITE, 4 * 4096)))
cltrace.instrument()
cltrace.start(*sys.argv[1:])
for step in range(20):
    for k, (q, prg, buf) in enumerate(setups):
        prg.add(q, (4096,), None, buf)
        if k == 1:  # the second device also runs a longer kernel
            prg.spin(q, (4096,), None, buf, np.int32(2000))
for q, _, _ in setups:
    q.finish()
cltrace.stop()
"""


@pytest.fixture(scope="module")
def two_devices(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A trace of kernels on PoCL's two devices (``POCL_DEVICES="pthread pthread"``), in both formats."""
    out = tmp_path_factory.mktemp("two")
    env = {k: v for k, v in os.environ.items() if k not in ("CLTRACE", "CLTRACE_OUT", "PYOPENCL_CTX")}
    env.update(POCL_DEVICES="pthread pthread", CLTRACE_CACHE_DIR=str(out / "cache"), CLTRACE_QUIET="1")
    files = {ext: out / f"two{ext}" for ext in (".json", ".pftrace")}
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(TWO_DEVICES), *map(str, files.values())],
                          capture_output=True, text=True, timeout=240, env=env, cwd=out)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return files


@pytest.mark.parametrize("ext", [".json", ".pftrace"])
def test_kernel_table_is_split_per_device(two_devices: dict[str, Path], ext: str) -> None:
    a = analyze(two_devices[ext])
    devices = sorted(d["name"] for d in a.devices)
    assert devices == ["pthread-AMD EPYC #0", "pthread-AMD EPYC #1"]
    rows = {(r["device"], r["name"]): r for r in a.kernels}
    assert set(rows) == {(devices[0], "add"), (devices[1], "add"), (devices[1], "spin")}
    assert rows[devices[0], "add"]["count"] == rows[devices[1], "add"]["count"] == 20
    # % device is of each kernel's own device: the lone kernel of device 0 takes all its busy time
    assert rows[devices[0], "add"]["device_pct"] == pytest.approx(100.0, abs=0.01)
    assert sum(rows[devices[1], k]["device_pct"] for k in ("add", "spin")) == pytest.approx(100.0, abs=0.01)
    assert rows[devices[1], "spin"]["device_pct"] > rows[devices[1], "add"]["device_pct"]
    text = a.report(width=160)
    for d in devices:
        assert f"Kernels on {d} by total" in text
    doc = json.loads(a.to_json())
    assert all(r["device"] in devices for r in doc["kernels"])
    if scan.NATIVE is not None and ext == ".json":
        same_spans(two_devices[ext])


def test_diff_keeps_kernels_of_two_devices_apart(two_devices: dict[str, Path]) -> None:
    from cltrace.analyze.diff import diff

    a = analyze(two_devices[".json"])
    names = sorted(r.name for r in diff(a, a) if r.kind == "kernel")
    assert names == ["add on pthread-AMD EPYC #0", "add on pthread-AMD EPYC #1", "spin on pthread-AMD EPYC #1"]
