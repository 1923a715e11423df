"""Chrome JSON lines (``cltrace.export.chrome_lines``): the C batch path and the Python encoder write
byte-identical files, on batches traced from real PoCL programs and on batches built by hand,
and the text is what the per-span writer wrote before (field order, separators, numbers).

The native tests fail, not skip, when the extension is not active: CI must exercise both paths.
Only ``CLTRACE_NATIVE=0`` (the fallback-only run) skips them.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

import numpy as np
import pyopencl as cl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import cltrace
from cltrace.export.processes import program_name
from cltrace.export import chrome, chrome_lines
from cltrace.export.base import FixedTrace
from cltrace.export.chrome import ChromeTraceSink
from cltrace.record.recorder import RECORDER
from cltrace.timeline.batch import SpanBatch, Tables
from cltrace.timeline.spans import Span
from cltrace.timeline.tracks import TrackRegistry

DISABLED = os.environ.get("CLTRACE_NATIVE", "").strip() == "0"


def native() -> chrome_lines.Batch:
    if DISABLED:
        pytest.skip("CLTRACE_NATIVE=0: fallback-only run")
    if chrome_lines.NATIVE is None:
        pytest.fail(f"the C extension is not active ({chrome_lines.WHY}): reinstall with "
                    "`pip install -e .` where a C compiler exists, or run with CLTRACE_NATIVE=0")
    return chrome_lines.NATIVE


@pytest.fixture(params=["native", "python"])
def encoder(request: Any) -> bool:
    """Whether the sink writes through the C batch path (True) or the Python encoder (False)."""
    return request.param == "native" and native() is not None


def lines(path: Any) -> list[str]:
    """The file's lines (split at "\\n" only: U+2028 inside a name is not a line break here)."""
    with open(path, encoding="utf-8", newline="") as fh:
        return fh.read().split("\n")


def write(path: Any, recorder: Any, batches: list[Any], native: bool) -> bytes:
    sink = ChromeTraceSink(path, native=native)
    sink.start(recorder)
    for b in batches:
        sink.write(b)
    sink.close({"end": True})
    with open(path, "rb") as fh:
        data = fh.read()
    events = json.loads(data)  # loads as it is, every line
    assert len(events) == sink.events_written and len(data) == sink.bytes_written
    return data


def test_the_active_encoder_is_native_unless_disabled() -> None:
    if DISABLED:
        assert (chrome_lines.PATH, chrome_lines.NATIVE) == ("python", None)
        assert chrome_lines.DETAIL == "python (fallback: CLTRACE_NATIVE=0)"
    else:
        assert native() == (sys.modules["cltrace._ext"].chrome.scan, sys.modules["cltrace._ext"].chrome.fill)
        assert (chrome_lines.PATH, chrome_lines.DETAIL) == ("native", "native (C extension)")


def test_cltrace_native_0_forces_the_python_encoder() -> None:
    code = "from cltrace.export import chrome_lines as c; print(c.PATH, c.NATIVE is None)"
    env = {k: v for k, v in os.environ.items() if k != "CLTRACE_NATIVE"}
    runs = {"0": "python True"}
    if not DISABLED:
        native()
        runs[""] = "native False"
    for value, want in runs.items():
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                              env=dict(env, CLTRACE_NATIVE=value))
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.strip() == want


# --- the text itself: what the per-span f-string writer wrote before this encoder ----------------

class Named:
    def __str__(self) -> str:
        return "<named ✓>"


def crafted(queue: Any) -> tuple[Any, list[Span]]:
    """Every kind of row: regions with and without a device slice, kernels sharing an attrs dict,
    a transfer, failed spans (quotes, newline, tab, backslash, unicode; none at all), a name with a
    quote and U+2028, negative relative times and durations, a compile-track span, two threads."""
    tracks = TrackRegistry()
    t1 = tracks.host_thread(11, "main")
    t2 = tracks.host_thread(22, "worker ✓")
    d1 = tracks.device_queue(queue, 11)
    d2 = tracks.device_queue(queue, 22)
    c = tracks.compile_track()
    B = 10_000_000
    launch = {"global": [4096], "local": None}

    def dev(s: Span, dt: int, q0: int, st: int, en: int, raw: int = 5_000_000_000) -> Span:
        s.device_track, s.dev_queued, s.dev_submit, s.dev_start, s.dev_end = dt, B + q0, B + q0 + 7, B + st, B + en
        s.raw_start, s.raw_end = raw + st, raw + en
        return s

    spans = [
        dev(Span(1, 0, "step", "region", t1, B + 1000, B + 90_000, attrs={"k": 'é"x', "n": 3}, path=("step",)),
            d1, 900, 1500, 89_000),
        dev(Span(2, 1, "add", "kernel", t1, B + 2000, B + 2500, attrs=launch, path=("step", "add")), d1, 2100, 3000, 4000),
        dev(Span(3, 1, "add", "kernel", t1, B + 5000, B + 5999, attrs=launch, path=("step", "add")), d1, 5100, 6000, 6001),
        Span(4, 0, "host-only", "region", t2, B - 1500, B - 501, path=("host-only",)),
        Span(5, 0, "broken", "region", t2, B + 7000, B + 8000, status="error",
             error='OSError: disk "full"\nsecond line — ünïcödé ✓ \\ \t', attrs={}, path=("broken",)),
        dev(Span(6, 0, "add", "kernel", t1, B + 9000, B + 9100, attrs=launch, status="error",
                 error="command failed: OUT_OF_RESOURCES (-5)"), d1, 9050, 9050, 9050),
        dev(Span(7, 0, "h2d", "transfer", t2, B + 10_000, B + 10_300, attrs={"bytes": 16384}), d2, -3000, -999, 1),
        dev(Span(8, 0, 'k"ernel ✓\u2028', "kernel", t2, B + 11_000, B + 11_400,
                 attrs={"f": float("nan"), "l": [1, 2.5, None, True], "o": Named()}), d2, 11_100, 11_200, 1_011_300),
        Span(9, 0, "build", "build", c, B + 12_000, B + 15_000_000, attrs={"source_hash": "ab"}),
        Span(10, 0, "late", "kernel", t1, B + 123_456_789_012, B + 123_456_789_010, status="error", error=None),
    ]
    return FixedTrace(tracks, Tables(), B), spans


# Written by the per-span writer this encoder replaced (the commit before it), HOST for the host pid;
# flow events since in their slices' category (Chrome DevTools binds flows only within one category).
BEFORE = [
    '{"ph":"X","cat":"region","name":"step","pid":HOST,"tid":1,"ts":1.000,"dur":89.000,"args":{"span":1,"parent":0,"source":"device","queued_host_ns":10000900,"submit_host_ns":10000907,"device.start":5000001500,"device.end":5000089000,"k": "é\\"x", "n": 3}},',
    '{"ph":"X","cat":"region","name":"step","pid":1000001,"tid":3,"ts":1.500,"dur":87.500,"args":{"span":1,"parent":0,"source":"device","queued_host_ns":10000900,"submit_host_ns":10000907,"device.start":5000001500,"device.end":5000089000,"k": "é\\"x", "n": 3}},',
    '{"ph":"X","cat":"kernel","name":"add","pid":HOST,"tid":1,"ts":2.000,"dur":0.500,"args":{"span":2,"parent":1,"source":"device","queued_host_ns":10002100,"submit_host_ns":10002107,"device.start":5000003000,"device.end":5000004000,"global": [4096], "local": null}},',
    '{"ph":"X","cat":"kernel","name":"add","pid":1000001,"tid":3,"ts":3.000,"dur":1.000,"args":{"span":2,"parent":1,"source":"device","queued_host_ns":10002100,"submit_host_ns":10002107,"device.start":5000003000,"device.end":5000004000,"global": [4096], "local": null}},',
    '{"ph":"s","cat":"kernel","name":"launch","id":2,"pid":HOST,"tid":1,"ts":2.000},',
    '{"ph":"f","bp":"e","cat":"kernel","name":"launch","id":2,"pid":1000001,"tid":3,"ts":3.000},',
    '{"ph":"X","cat":"kernel","name":"add","pid":HOST,"tid":1,"ts":5.000,"dur":0.999,"args":{"span":3,"parent":1,"source":"device","queued_host_ns":10005100,"submit_host_ns":10005107,"device.start":5000006000,"device.end":5000006001,"global": [4096], "local": null}},',
    '{"ph":"X","cat":"kernel","name":"add","pid":1000001,"tid":3,"ts":6.000,"dur":0.001,"args":{"span":3,"parent":1,"source":"device","queued_host_ns":10005100,"submit_host_ns":10005107,"device.start":5000006000,"device.end":5000006001,"global": [4096], "local": null}},',
    '{"ph":"s","cat":"kernel","name":"launch","id":3,"pid":HOST,"tid":1,"ts":5.000},',
    '{"ph":"f","bp":"e","cat":"kernel","name":"launch","id":3,"pid":1000001,"tid":3,"ts":6.000},',
    '{"ph":"X","cat":"region","name":"host-only","pid":HOST,"tid":2,"ts":-1.500,"dur":0.999,"args":{"span":4,"parent":0,"source":"host"}},',
    '{"ph":"X","cat":"region","name":"broken","pid":HOST,"tid":2,"ts":7.000,"dur":1.000,"args":{"span":5,"parent":0,"source":"host","status":"error","error":"OSError: disk \\"full\\"\\nsecond line — ünïcödé ✓ \\\\ \\t"}},',
    '{"ph":"X","cat":"kernel","name":"add","pid":HOST,"tid":1,"ts":9.000,"dur":0.100,"args":{"span":6,"parent":0,"source":"device","queued_host_ns":10009050,"submit_host_ns":10009057,"device.start":5000009050,"device.end":5000009050,"status":"error","error":"command failed: OUT_OF_RESOURCES (-5)","global": [4096], "local": null}},',
    '{"ph":"X","cat":"kernel","name":"add","pid":1000001,"tid":3,"ts":9.050,"dur":0.000,"args":{"span":6,"parent":0,"source":"device","queued_host_ns":10009050,"submit_host_ns":10009057,"device.start":5000009050,"device.end":5000009050,"status":"error","error":"command failed: OUT_OF_RESOURCES (-5)","global": [4096], "local": null}},',
    '{"ph":"s","cat":"kernel","name":"launch","id":6,"pid":HOST,"tid":1,"ts":9.000},',
    '{"ph":"f","bp":"e","cat":"kernel","name":"launch","id":6,"pid":1000001,"tid":3,"ts":9.050},',
    '{"ph":"X","cat":"transfer","name":"h2d","pid":HOST,"tid":2,"ts":10.000,"dur":0.300,"args":{"span":7,"parent":0,"source":"device","queued_host_ns":9997000,"submit_host_ns":9997007,"device.start":4999999001,"device.end":5000000001,"bytes": 16384}},',
    '{"ph":"X","cat":"transfer","name":"h2d","pid":1000001,"tid":4,"ts":-0.999,"dur":1.000,"args":{"span":7,"parent":0,"source":"device","queued_host_ns":9997000,"submit_host_ns":9997007,"device.start":4999999001,"device.end":5000000001,"bytes": 16384}},',
    '{"ph":"s","cat":"transfer","name":"launch","id":7,"pid":HOST,"tid":2,"ts":10.000},',
    '{"ph":"f","bp":"e","cat":"transfer","name":"launch","id":7,"pid":1000001,"tid":4,"ts":-0.999},',
    '{"ph":"X","cat":"kernel","name":"k\\"ernel ✓\u2028","pid":HOST,"tid":2,"ts":11.000,"dur":0.400,"args":{"span":8,"parent":0,"source":"device","queued_host_ns":10011100,"submit_host_ns":10011107,"device.start":5000011200,"device.end":5001011300,"f": NaN, "l": [1, 2.5, null, true], "o": "<named ✓>"}},',
    '{"ph":"X","cat":"kernel","name":"k\\"ernel ✓\u2028","pid":1000001,"tid":4,"ts":11.200,"dur":1000.100,"args":{"span":8,"parent":0,"source":"device","queued_host_ns":10011100,"submit_host_ns":10011107,"device.start":5000011200,"device.end":5001011300,"f": NaN, "l": [1, 2.5, null, true], "o": "<named ✓>"}},',
    '{"ph":"s","cat":"kernel","name":"launch","id":8,"pid":HOST,"tid":2,"ts":11.000},',
    '{"ph":"f","bp":"e","cat":"kernel","name":"launch","id":8,"pid":1000001,"tid":4,"ts":11.200},',
    '{"ph":"X","cat":"build","name":"build","pid":HOST,"tid":5,"ts":12.000,"dur":14988.000,"args":{"span":9,"parent":0,"source":"host","source_hash": "ab"}},',
    '{"ph":"X","cat":"kernel","name":"late","pid":HOST,"tid":1,"ts":123456789.012,"dur":-0.002,"args":{"span":10,"parent":0,"source":"host","status":"error","error":""}},',
]


def test_the_lines_are_the_ones_the_per_span_writer_wrote(tmp_path: Any, queue: Any,
                                                         encoder: bool) -> None:
    rec, spans = crafted(queue)
    path = tmp_path / "crafted.json"
    # A list of spans, then a SpanBatch with interning tables of its own: every way into a sink.
    write(path, rec, [spans[:6], SpanBatch.from_spans(Tables(), spans[6:])], encoder)
    got = lines(path)
    host = rec.tracks.pid
    assert [ln for ln in got if ln.startswith('{"ph":"') and '"ph":"i"' not in ln] == \
        [ln.replace('"pid":HOST,', f'"pid":{host},') for ln in BEFORE]
    # Metadata: the same lines as before, each batch's new tracks ahead of its events, in the
    # order the rows first name them (thread, then its device track): pids and names unchanged.
    meta = [json.loads(ln.rstrip(",")) for ln in got if ln.startswith('{"ph": "M"')]
    dev_pid = 1_000_001
    name = rec.tracks.get
    assert [(m["name"], m["pid"], m["tid"], m["args"]) for m in meta] == [
        ("process_name", host, 0, {"name": program_name()}),
        ("process_sort_index", host, 0, {"sort_index": 0}),
        ("thread_name", host, 1, {"name": "main"}), ("thread_sort_index", host, 1, {"sort_index": 1}),
        ("process_name", dev_pid, 0, {"name": name(3).process}), ("process_sort_index", dev_pid, 0, {"sort_index": 2}),
        ("thread_name", dev_pid, 3, {"name": name(3).name}), ("thread_sort_index", dev_pid, 3, {"sort_index": 3}),
        ("thread_name", host, 2, {"name": "worker ✓"}), ("thread_sort_index", host, 2, {"sort_index": 2}),
        # second batch
        ("thread_name", dev_pid, 4, {"name": name(4).name}), ("thread_sort_index", dev_pid, 4, {"sort_index": 4}),
        ("thread_name", host, 5, {"name": "OpenCL compile"}), ("thread_sort_index", host, 5, {"sort_index": 5}),
    ]
    first_event = next(i for i, ln in enumerate(got) if ln.startswith('{"ph":"X"'))
    second = got.index([ln for ln in got if '"span":7,' in ln][0])
    assert all(not ln.startswith('{"ph": "M"') for ln in got[first_event:second - 4])
    assert all(ln.startswith('{"ph": "M"') for ln in got[second - 4:second])


def test_lone_surrogates_are_escaped_and_nothing_is_lost(tmp_path: Any, queue: Any,
                                                         encoder: bool) -> None:
    """A name, error or attribute that has no UTF-8 form is written \\u-escaped (it used to fail the batch)."""
    rec, spans = crafted(queue)
    odd = "bad \ud800 name"
    spans[0].name = odd
    spans[4].error = f"error {odd}"
    spans[1].attrs = {"k": odd}
    path = tmp_path / "odd.json"
    write(path, rec, [spans], encoder)
    with open(path, encoding="utf-8") as fh:  # valid UTF-8
        events = json.load(fh)
    x = [e for e in events if e["ph"] == "X"]
    assert [e["name"] for e in x if e["args"]["span"] == 1] == [odd, odd]
    assert [e["args"]["error"] for e in x if e["args"]["span"] == 5] == [f"error {odd}"]
    assert [e["args"]["k"] for e in x if e["args"]["span"] == 2] == [odd, odd]
    assert len(x) == len(spans) + sum(1 for s in spans if s.device_track)


# --- native == python -----------------------------------------------------------------------------

def traced_program(cl_ctx: Any, queue: Any, kernels: Any) -> SpanBatch:
    """A real PoCL run into memory: regions on queues, kernels, transfers with byte counts, host-only
    spans, failed regions and a failed command, out-of-order lanes, several threads."""
    ooo = cltrace.profiling_queue(cl_ctx, out_of_order=True)
    failing = cl.CommandQueue(cl_ctx, properties=cl.command_queue_properties.PROFILING_ENABLE)
    host = np.arange(kernels.n, dtype=np.float32)
    bufs = [cl.Buffer(cl_ctx, cl.mem_flags.READ_WRITE, 4 * kernels.n) for _ in range(4)]

    def worker(k: int) -> None:
        add = kernels.kernel("add")
        with cltrace.region(f"worker {k} ✓", queue, {"thread": k}):
            for _ in range(5):
                kernels.launch_add(queue, add)
            with cltrace.region("host part"):
                t = time.perf_counter_ns()
                cltrace.record_launch("host-only", None, None, t, t + 10)

    with cltrace.trace():
        with cltrace.region("io", queue):
            cltrace.copy(queue, kernels.a, host, "h2d")
            cltrace.copy(queue, host, kernels.a)
        for step in range(2):
            with cltrace.region("step", ooo, {"step": step}):
                spin = kernels.kernel("spin")
                for i, buf in enumerate(bufs):
                    cltrace.launch(spin, ooo, (kernels.n,), None, buf, np.int32(50 + 40 * i))
        threads = [threading.Thread(target=worker, args=(k,)) for k in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        with pytest.raises(ValueError):
            with cltrace.region("broken", queue):
                kernels.launch_add(queue)
                raise ValueError('bad "value"\nline two — ünïcödé ✓')
        gate = cl.UserEvent(cl_ctx)
        doomed = kernels.add(failing, (kernels.n,), None, kernels.a, kernels.b, wait_for=[gate])
        t = time.perf_counter_ns()
        cltrace.record_launch("doomed", failing, doomed, t, t + 10)
        gate.set_status(-5)
        queue.finish()
        ooo.finish()
    batch = RECORDER.batch()
    kinds = set(batch.cat_list())
    assert {"region", "kernel", "transfer"} <= kinds
    assert batch.status.sum() >= 2 and len(batch.errors) >= 2, "a failed region and a failed command"
    assert (batch.track == 0).any() and (batch.track != 0).any()
    assert len(set(batch.thread.tolist())) >= 4 and len(set(batch.track.tolist()) - {0}) >= 4
    return batch


def test_native_and_python_write_the_same_file_for_a_traced_program(tmp_path: Any, cl_ctx: Any, queue: Any,
                                                                  kernels: Any, chrome: Any) -> None:
    native()
    batch = traced_program(cl_ctx, queue, kernels)
    parts = [batch.take(slice(0, 7)), batch.take(slice(7, 8)), batch.take(slice(8, None))]
    mid = int(np.median(batch.host_begin))  # a later trace start: negative relative times
    for start_ns in (RECORDER.start_ns, mid):
        rec = FixedTrace(RECORDER.tracks, RECORDER.tables, start_ns)
        a = write(tmp_path / "native.json", rec, parts, True)
        b = write(tmp_path / "python.json", rec, parts, False)
        assert a == b
        tr = chrome.read(tmp_path / "native.json")
        assert len(tr.slices) == batch.n + int((batch.track != 0).sum())
        assert ('"ts":-' in a.decode()) == (start_ns == mid)
    errors = [e["args"]["error"] for e in tr.slices if e["args"].get("status") == "error"]
    assert any('bad "value"\nline two — ünïcödé ✓' in e for e in errors)
    assert any(e.startswith("command failed") for e in errors)


def spans_strategy() -> Any:
    big = st.integers(-(1 << 61), 1 << 61)  # sums of two (begin + duration) stay inside int64
    small = st.integers(-5_000, 5_000)
    text = st.text(max_size=12)
    attrs = st.one_of(st.none(), st.dictionaries(st.text(max_size=4), st.one_of(st.integers(), st.floats(), text,
                                                                               st.none(), st.booleans()), max_size=3))
    return st.lists(st.tuples(big, big, st.sampled_from(["k", "r", 'q"✓', "x\u2028"]),
                              st.sampled_from(["kernel", "region", "transfer", "trial"]),
                              st.integers(0, 2), st.one_of(small, big), st.one_of(small, big),
                              st.booleans(), st.one_of(small, big), st.one_of(small, big), big, big,
                              st.one_of(st.none(), text), attrs, st.integers(0, 3)), min_size=1, max_size=40)


@pytest.mark.skipif(DISABLED, reason="CLTRACE_NATIVE=0: fallback-only run")
@settings(max_examples=150, deadline=None)
@given(rows=spans_strategy())
def test_encoders_agree_on_batches_built_from_spans(rows: list[tuple], reset: Any) -> None:
    """Any column values (extreme, negative, mixed), names, errors and attrs: the C batch path writes the
    Python encoder's bytes, each line is JSON, and each time is written as exactly the nanoseconds it came from."""
    native()
    tracks = TrackRegistry()
    threads = [tracks.host_thread(i + 1, f"t{i}") for i in range(3)]
    qs = [tracks._add(("queue", i), "queue", f"q{i}", f"OpenCL: dev{i % 2}", device=f"dev{i % 2}") for i in range(3)]
    tables = Tables()
    shared = {"shared": 1}
    spans = []
    for i, (sid, par, name, cat, th, hb, hd, dev, ds, dd, rs, re_, err, attrs, share) in enumerate(rows):
        s = Span(sid, par, name, cat, threads[th], hb, hb + hd, attrs=shared if share == 3 else attrs,
                 status="ok" if err is None else "error", error=err or None)
        if dev:
            s.device_track, s.dev_queued, s.dev_submit = qs[th], rs, re_
            s.dev_start, s.dev_end, s.raw_start, s.raw_end = ds, ds + dd, rs, re_
        spans.append(s)
    rec = FixedTrace(tracks, tables, 0)
    sink = ChromeTraceSink(os.devnull)
    sink.start(rec)
    batch = SpanBatch.from_spans(tables, spans)
    ints, idx, t = sink._prepare(batch)
    whole = chrome_lines.encode_python(ints, idx, t, 0, batch.n)
    cut = batch.n // 2  # chunks join to the whole
    assert chrome_lines.encode_python(ints, idx, t, 0, cut) + chrome_lines.encode_python(ints, idx, t, cut, batch.n) == whole
    with tempfile.TemporaryDirectory() as d:  # the batch path (scan + fill), as the sink runs it: the same file
        files = [write(os.path.join(d, f"{k}.json"), rec, [batch], e) for k, e in (("n", True), ("p", False))]
        assert files[0] == files[1] and whole in files[0]
    events = [json.loads(ln.rstrip(",")) for ln in whole.decode().split("\n")[:-1]]
    xs = iter(e for e in events if e["ph"] == "X")
    for s in spans:
        for begin, dur in [(s.host_begin, s.host_end - s.host_begin)] + \
                          ([(s.dev_start, s.dev_end - s.dev_start)] if s.device_track else []):
            assert next(xs)["args"]["span"] == s.id
            assert f'"ts":{chrome._us(begin)},"dur":{chrome._us(dur)},"args":{{"span":{s.id},'.encode() in whole
    sink.close({})


def test_a_batch_larger_than_a_chunk(tmp_path: Any, queue: Any) -> None:
    native()
    rec, spans = crafted(queue)
    many = [spans[i % len(spans)] for i in range(2 * chrome._CHUNK + 123)]
    batch = SpanBatch.from_spans(rec.tables, many)
    a = write(tmp_path / "n.json", rec, [batch], True)
    b = write(tmp_path / "p.json", rec, [batch], False)
    assert a == b
    assert sum(1 for ln in lines(tmp_path / "n.json") if ln.startswith('{"ph":"X"')) == \
        len(many) + sum(1 for s in many if s.device_track)

