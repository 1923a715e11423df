"""The columnar readers (``read/_scan.c`` into a ``SpanBatch``) against the general ``Span`` readers, and
the kernel table split per device.

On real traces made here (the demo under its schedule, a two-device PoCL run, a program with call
stacks and device-memory counters) in both formats, complete and cut off at any byte: the columns hold
the same spans (call sites included) and metadata (memory samples included) as the objects, ``cltrace
summary`` and ``cltrace analyze`` say the same on either path. Files the scanner does not know fall
back to the general readers. The 1M-span benchmark is ``benchmarks/bench_analyze.py``, not a test.
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

from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

from cltrace.analyzers.analysis import analyze
from cltrace.export.protowire import varint
from cltrace.analyzers.summary import summarize
from cltrace.read import load, load_columns, scan
from cltrace.read.inflate import expand
from cltrace.read.perfetto import iter_packets
from conftest import POCL_PLATFORM, file_packets, pocl_platform  # noqa: E402  (tests/ is on sys.path under pytest)

POCL = pocl_platform().get_devices()[0].name.strip()  # the device name of PoCL's two devices below
from cltrace.read.tree import fill_paths, path_ids
from cltrace.timeline.batch import SpanBatch, Tables
from cltrace.timeline.spans import Span
from cltrace.timeline.stats import Stats

needs_scanner = pytest.mark.skipif(scan.NATIVE is None, reason=f"C scanner not in use: {scan.WHY}")
FIELDS = ("id", "parent", "name", "cat", "thread", "host_begin", "host_end", "device_track", "dev_start", "dev_end",
          "raw_start", "raw_end", "attrs", "status", "error", "path", "site")


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


@needs_scanner
@pytest.mark.parametrize("ext", [".json", ".pftrace"])
def test_columns_hold_the_same_spans_as_the_objects(demo: dict[str, Path], ext: str) -> None:
    batch = same_spans(demo[ext])
    assert batch.n > 50 and (batch.track != 0).any() and any(batch.attrs)
    assert (batch.site >= 0).any() and load_columns(demo[ext])[1]["memory_samples"]


@needs_scanner
@pytest.mark.parametrize("ext", [".json", ".pftrace"])
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
    assert cmeta == meta and "truncated" in meta  # the .pftrace's closing metadata is its last packet
    if isinstance(batch, SpanBatch):
        batch = batch.spans()
    assert [[getattr(s, f) for f in FIELDS] for s in batch] == [[getattr(s, f) for f in FIELDS] for s in spans]


def test_a_pftrace_cut_right_after_a_flush_reads_as_cut(demo: dict[str, Path], tmp_path: Path) -> None:
    """Only the metadata written at close says a .pftrace is whole: cut exactly after the metadata of a
    flush (a run killed there), the file still reads as cut off, on either path."""
    data = demo[".pftrace"].read_bytes()
    ends = []
    for end, held in file_packets(data):
        for raw in held:
            te = pb.TracePacket.FromString(raw).track_event
            if te.name == "cltrace.metadata":
                ends.append((end, "recorded_spans" in te.debug_annotations[0].string_value))
    assert len(ends) >= 3 and ends[-1] == (len(data), True)  # at start, at a flush, at close
    path = tmp_path / "cut.pftrace"
    for end, _ in ends[:-1]:
        path.write_bytes(data[:end])
        spans, meta = load(path)
        got, cmeta = load_columns(path)
        assert cmeta == meta and meta["truncated"]["read_bytes"] == end, end
    assert [closing for _, closing in ends] == [False] * (len(ends) - 1) + [True]
    assert "truncated" not in load_columns(demo[".pftrace"])[1]


@needs_scanner
def test_cut_files_are_read_by_the_scanner_itself(demo: dict[str, Path], tmp_path: Path) -> None:
    """Cut between events (a run killed after a flush), the columns do the reading, not the fallback."""
    for ext, data in ((e, p.read_bytes()) for e, p in demo.items()):
        if ext == ".pftrace":  # as a plain one (``compress=False``): cut between packets, not inside a packed chunk
            data = expand(data).data
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
from cltrace.record.probe import verdict
PLAT = %s
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
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(TWO_DEVICES) % POCL_PLATFORM, *map(str, files.values())],
                          capture_output=True, text=True, timeout=240, env=env, cwd=out)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return files


@pytest.mark.parametrize("ext", [".json", ".pftrace"])
def test_kernel_table_is_split_per_device(two_devices: dict[str, Path], ext: str) -> None:
    a = analyze(two_devices[ext])
    devices = sorted(d["name"] for d in a.devices)
    assert devices == [f"{POCL} #0", f"{POCL} #1"]
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
    if scan.NATIVE is not None:
        same_spans(two_devices[ext])


def test_diff_keeps_kernels_of_two_devices_apart(two_devices: dict[str, Path]) -> None:
    from cltrace.analyzers.diff import diff

    names = sorted(r.name for r in diff(two_devices[".json"], two_devices[".json"]) if r.kind == "kernel")
    assert names == [f"add on {POCL} #0", f"add on {POCL} #1", f"spin on {POCL} #1"]


SITES_AND_MEMORY = """
import gc
import sys
import numpy as np
import pyopencl as cl
import cltrace
ctx = cl.Context([cltrace.default_device()])
q = cltrace.profiling_queue(ctx)
prg = cl.Program(ctx, "__kernel void inc(__global float *a) { a[get_global_id(0)] += 1.0f; }").build()
RW = cl.mem_flags.READ_WRITE

def forward(buf):
    cltrace.launch(prg.inc, q, (1024,), None, buf)

def backward(buf):
    cltrace.launch(prg.inc, q, (1024,), None, buf)
    cltrace.launch(prg.inc, q, (1024,), None, buf)

cltrace.configure(stack_depth=int(sys.argv[1]))
with cltrace.trace(*sys.argv[2:]):
    host = np.zeros(1024, np.float32)
    for step in cltrace.steps(range(6), q):
        acts = [cltrace.Buffer(ctx, RW, 4096 * (step + 1)) for _ in range(3)]
        with cltrace.region("forward", q):
            forward(acts[0])
        with cltrace.region("backward", q):
            backward(acts[1])
        cltrace.copy(q, host, acts[2])
        try:
            with cltrace.region("check", q):
                if step == 4:
                    raise ValueError("loss is nan")
        except ValueError:
            pass
        if step % 2:
            acts[0].release()
        del acts
        gc.collect()
    q.finish()
"""


@pytest.fixture(scope="module", params=[1, 3], ids=["depth1", "depth3"])
def sites_and_memory(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A program launching from two functions (call sites, with callers at stack depth 3), allocating and
    releasing ``cltrace.Buffer``s every step (device-memory counters), with a failed region, in both formats."""
    out = tmp_path_factory.mktemp(f"sites_depth{request.param}")
    env = {k: v for k, v in os.environ.items() if k not in ("CLTRACE", "CLTRACE_OUT", "PYOPENCL_CTX")}
    env.update(CLTRACE_CACHE_DIR=str(out / "cache"), CLTRACE_QUIET="1")
    files = {ext: out / f"sites{ext}" for ext in (".json", ".pftrace")}
    proc = subprocess.run([sys.executable, "-c", SITES_AND_MEMORY, str(request.param), *map(str, files.values())],
                          capture_output=True, text=True, timeout=240, env=env, cwd=out)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return files


@needs_scanner
def test_columns_of_a_pftrace_hold_call_sites_and_memory_samples(sites_and_memory: dict[str, Path]) -> None:
    """What the .pftrace's columns used to drop: interned source locations (with their callers) and the
    device-memory counter tracks."""
    batch = same_spans(sites_and_memory[".pftrace"])
    launched = [s for s in batch.spans() if s.cat == "kernel"]
    assert len(launched) == 18 and all(s.site for s in launched)
    assert {s.site.function for s in launched} == {"forward", "backward"}
    deep = "depth3" in sites_and_memory[".pftrace"].parent.name  # the launching function's caller: the module
    assert all([c.function for c in s.site.callers] == (["<module>"] if deep else []) for s in launched)
    assert not any(k.startswith("code.") for s in batch.spans() for k in (s.attrs or {}))
    (failed,) = [s for s in batch.spans() if s.status == "error"]
    assert failed.name == "check" and "loss is nan" in failed.error
    samples = load_columns(sites_and_memory[".pftrace"])[1]["memory_samples"]
    assert len(samples) == 1 and len(next(iter(samples.values()))) >= 6 * 3


def test_call_sites_and_memory_peak_are_the_same_from_either_format(sites_and_memory: dict[str, Path]) -> None:
    """``analyze --by callsite`` and the memory section of the .pftrace are the .json's (on either path)."""
    got = {ext: analyze(str(p), by="callsite") for ext, p in sites_and_memory.items()}
    rows = {ext: sorted((r["name"], r["site"], r["count"]) for r in a.kernels) for ext, a in got.items()}
    assert rows[".pftrace"] == rows[".json"]
    assert {site.rsplit("(", 1)[1] for _, site, _ in rows[".json"]} == {"forward)", "backward)"}
    assert sorted(c for _, _, c in rows[".json"]) == [6, 6, 6]  # a line each
    mem = {ext: a.memory["contexts"] for ext, a in got.items()}
    assert [(c["peak_bytes"], c["end_bytes"], c["samples"], c["during"]) for c in mem[".pftrace"]] == \
           [(c["peak_bytes"], c["end_bytes"], c["samples"], c["during"]) for c in mem[".json"]]
    assert mem[".json"][0]["peak_bytes"] >= 3 * 4096 * 6


def test_inline_and_unknown_source_locations_read_as_the_general_reader_reads_them(
        sites_and_memory: dict[str, Path], tmp_path: Path) -> None:
    """Slices with an inline ``TrackEvent.source_location`` (cltrace interns them, other writers may not)
    or an iid never interned: the columns give what the general reader gives."""
    packets = [pb.TracePacket.FromString(raw) for _, raw in iter_packets(sites_and_memory[".pftrace"].read_bytes())]
    with_site = [p for p in packets if p.HasField("track_event") and p.track_event.HasField("source_location_iid")]
    assert len(with_site) > 4
    with_site[1].track_event.source_location.CopyFrom(pb.SourceLocation(file_name="inline.py", function_name="f",
                                                                        line_number=7))
    with_site[2].track_event.source_location.CopyFrom(pb.SourceLocation(file_name="inline.py", function_name="f",
                                                                        line_number=7))
    with_site[3].track_event.source_location_iid = 999
    path = tmp_path / "inline.pftrace"
    path.write_bytes(b"".join(b"\x0a" + varint(p.ByteSize()) + p.SerializeToString() for p in packets))
    spans, _ = load(path)
    assert sum(1 for s in spans if s.site and s.site.file == "inline.py") == 2
    if scan.NATIVE is not None:
        got = same_spans(path).spans()
        assert sum(1 for s in got if s.site is None) == sum(1 for s in spans if s.site is None) >= 1
