"""The Chrome JSON exporter (streaming, crash safety, format) and reading traces back."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import textwrap
import threading

import pytest

import cltrace
from cltrace import TraceFileError
from cltrace import read as tracefile
from cltrace.analyzers.summary import summarize
from cltrace.export.chrome import ChromeTraceSink
from cltrace.export.processes import program_name
from cltrace.record.recorder import RECORDER


def _us(ns: int) -> str:
    sign = "-" if ns < 0 else ""
    ns = abs(ns)
    return f"{sign}{ns // 1000}.{ns % 1000:03d}"


def _same(a, b) -> None:
    assert (a.id, a.parent, a.name, a.cat, a.host_begin, a.host_end, a.status, a.error, a.path) == \
        (b.id, b.parent, b.name, b.cat, b.host_begin, b.host_end, b.status, b.error, b.path)
    assert (a.dev_start, a.dev_end, a.raw_start, a.raw_end) == (b.dev_start, b.dev_end, b.raw_start, b.raw_end)


def test_round_trip_through_tracefile_load(tmp_path, queue, kernels, clock_domain):
    path = tmp_path / "rt.json"
    with cltrace.trace(path):
        with cltrace.region("outer", queue):
            kernels.launch_add(queue)
            with cltrace.region("host_only"):
                kernels.launch_spin(queue)
        with pytest.raises(OSError):
            with cltrace.region("broken"):
                raise OSError("disk \"full\"\nsecond line")
    mem = {s.id: s for s in RECORDER.spans()}
    spans, meta = tracefile.load(path)
    assert len(spans) == len(mem) == 5
    for s in spans:
        # Host times are relative to the trace start in the file; shift back to compare.
        s.host_begin += RECORDER.start_ns
        s.host_end += RECORDER.start_ns
        if s.dev_start is not None:
            s.dev_start += RECORDER.start_ns
            s.dev_end += RECORDER.start_ns
        _same(s, mem[s.id])
    assert meta["recorded_spans"] == 5 and meta["dropped_spans"] == 0
    assert all(c["domain"] == clock_domain for c in meta["clocks"].values())
    stats, _ = summarize(path)
    assert stats.as_dict()["outer/host_only/spin"]["device"]["count"] == 1


def test_timestamps_are_microseconds_with_three_decimals_from_the_trace_start(tmp_path, queue, kernels):
    path = tmp_path / "ts.json"
    with cltrace.trace(path):
        for _ in range(5):
            with cltrace.region("r", queue):
                kernels.launch_add(queue)
    spans = {s.id: s for s in RECORDER.spans()}
    base = RECORDER.start_ns
    text = path.read_text()
    lines = [ln for ln in text.splitlines() if ln.startswith('{"ph":"X"')]
    assert len(lines) == 2 * len(spans)
    host_pid = json.loads(text)[0]["pid"]
    for ln in lines:
        m = re.search(r'"ts":(-?\d+\.\d{3}),"dur":(\d+\.\d{3}),', ln)
        assert m, ln
        ev = json.loads(ln.rstrip(","))
        s = spans[ev["args"]["span"]]
        if ev["pid"] == host_pid:
            assert m.groups() == (_us(s.host_begin - base), _us(s.host_end - s.host_begin))
        else:
            assert m.groups() == (_us(s.dev_start - base), _us(s.dev_end - s.dev_start))
            assert ev["args"]["source"] == "device"
            assert ev["args"]["queued_host_ns"] == s.dev_queued


def test_metadata_names_host_threads_and_device_queues(tmp_path, cl_ctx, queue, kernels, chrome):
    path = tmp_path / "names.json"
    second = cltrace.profiling_queue(cl_ctx)

    def worker() -> None:
        with cltrace.region("in_worker", second):
            kernels.launch_add(second, kernels.kernel("add"))

    with cltrace.trace(path):
        with cltrace.region("in_main", queue):
            kernels.launch_add(queue)
        t = threading.Thread(target=worker, name="export-worker")
        t.start()
        t.join()
    tr = chrome.read(path)
    procs = tr.process_names()
    dev_name = queue.device.name.strip()
    assert procs[tr.host_pid] == program_name() and " " in procs[tr.host_pid]  # "python3 <argv...>"
    (dev_pid,) = [p for p, n in procs.items() if p != tr.host_pid]
    assert procs[dev_pid] == f"OpenCL: {dev_name}"
    names = tr.track_names()
    placements = tr.placements()
    by_name = {pl["host"]["name"]: pl for pl in placements.values()}
    main_h, worker_h = by_name["in_main"]["host"], by_name["in_worker"]["host"]
    assert names[(tr.host_pid, main_h["tid"])] == threading.main_thread().name
    assert names[(tr.host_pid, worker_h["tid"])] == "export-worker"
    q_tracks = {(pl["device"]["pid"], pl["device"]["tid"]) for pl in by_name.values()}
    assert len(q_tracks) == 2
    for track in q_tracks:
        assert track[0] == dev_pid
        # " · export-worker": the queue's address was a freed queue's of an earlier test, used from another
        # thread, so this process has seen two threads on it (the registry outlives a trace)
        assert re.fullmatch(re.escape(dev_name) + r" · queue \d+( · export-worker)?", names[track]), names[track]
    assert len({names[t] for t in q_tracks}) == 2
    # Every track a slice sits on is named exactly once.
    thread_meta = [(e["pid"], e["tid"]) for e in tr.events if e.get("ph") == "M" and e["name"] == "thread_name"]
    assert sorted(thread_meta) == sorted(set(thread_meta))
    assert set(tr.tracks()) <= set(thread_meta)


def test_each_kernel_has_one_flow_pair_from_host_to_device(tmp_path, queue, kernels, chrome):
    path = tmp_path / "flow.json"
    with cltrace.trace(path):
        with cltrace.region("r", queue):
            for _ in range(4):
                kernels.launch_add(queue)
    tr = chrome.read(path)
    placements = tr.placements()
    kernels_ = {sid: pl for sid, pl in placements.items() if pl["host"]["cat"] == "kernel"}
    assert len(kernels_) == 4
    starts = {e["id"]: e for e in tr.events if e.get("ph") == "s"}
    finishes = {e["id"]: e for e in tr.events if e.get("ph") == "f"}
    assert set(starts) == set(finishes) == set(kernels_)
    for sid, pl in kernels_.items():
        s, f = starts[sid], finishes[sid]
        h, d = pl["host"], pl["device"]
        assert (s["pid"], s["tid"], s["ts"]) == (h["pid"], h["tid"], h["ts"])
        assert (f["pid"], f["tid"], f["ts"], f["bp"]) == (d["pid"], d["tid"], d["ts"], "e")
        assert s["cat"] == f["cat"] == h["cat"] == d["cat"]  # DevTools binds on the category too


def test_file_is_loadable_after_a_flush_before_close(tmp_path, queue, kernels):
    path = tmp_path / "live.json"
    copy = tmp_path / "copy.json"
    cltrace.start(path)
    with cltrace.region("first", queue):
        kernels.launch_add(queue)
    RECORDER.flush()
    assert not path.exists()  # written as live.json.partial until closed
    shutil.copy(f"{path}.partial", copy)
    with cltrace.region("second", queue):
        kernels.launch_add(queue)
    cltrace.stop()
    with pytest.raises(json.JSONDecodeError):
        json.loads(copy.read_text())  # no closing bracket: a run cut off here
    spans, meta = tracefile.load(copy)
    assert sorted(s.name for s in spans) == ["add", "first"]
    assert meta["dropped_spans"] == 0
    assert all(s.source == "device" for s in spans)
    full, full_meta = tracefile.load(path)
    assert sorted(s.name for s in full) == ["add", "add", "first", "second"]
    assert "clocks" in full_meta


def test_a_process_killed_after_a_flush_leaves_a_readable_trace(tmp_path):
    path = tmp_path / "crash.json"
    script = textwrap.dedent(f"""
        import os
        import cltrace
        import pyopencl as cl
        from cltrace.record.recorder import RECORDER

        RECORDER.configure(flush_interval_s=3600)
        q = cltrace.profiling_queue()
        k = cl.Program(q.context, "__kernel void z(__global int *a) {{ a[get_global_id(0)] = 0; }}").build().z
        buf = cl.Buffer(q.context, cl.mem_flags.READ_WRITE, 4 * 64)
        cltrace.start({str(path)!r})
        for i in range(50):
            with cltrace.region("step", q, {{"i": i}}):
                cltrace.launch(k, q, (64,), None, buf)
        RECORDER.flush()
        print(RECORDER.recorded, flush=True)
        with cltrace.region("lost", q):
            cltrace.launch(k, q, (64,), None, buf)
        os._exit(3)
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 3, proc.stderr
    flushed = int(proc.stdout.strip())
    assert flushed == 100
    assert not path.exists()  # never closed: the trace keeps the name that says so
    partial = tmp_path / "crash.json.partial"
    assert not partial.read_text().rstrip().endswith("]")
    spans, meta = tracefile.load(partial)
    assert len(spans) == flushed
    assert {s.name for s in spans} == {"step", "z"}
    assert all(s.source == "device" for s in spans)
    assert meta["dropped_spans"] == 0


def test_a_failing_sink_does_not_break_the_program_or_other_sinks(tmp_path, queue, kernels, caplog):
    class Broken:
        def start(self, recorder):
            pass

        def write(self, spans):
            raise RuntimeError("disk on fire")

        def flush(self, meta):
            raise RuntimeError("still on fire")

        def close(self, meta):
            pass

    path = tmp_path / "ok.json"
    with caplog.at_level("WARNING", logger="cltrace"):
        with cltrace.trace(Broken(), path):
            with cltrace.region("r", queue):
                kernels.launch_add(queue)
    assert "disk on fire" in caplog.text
    assert sorted(s.name for s in tracefile.load(path)[0]) == ["add", "r"]


def test_export_writes_the_spans_kept_in_memory(tmp_path, queue, kernels, chrome):
    cltrace.start()
    with cltrace.region("late", queue):
        kernels.launch_add(queue)
    cltrace.stop()
    path = tmp_path / "late.json"
    sink = ChromeTraceSink(path)
    RECORDER.export(sink)
    assert sink.events_written > 0 and sink.bytes_written == path.stat().st_size
    tr = chrome.read(path)
    assert sorted(e["name"] for e in tr.slices) == ["add", "add", "late", "late"]
    assert tr.meta["recorded_spans"] == 2


def _check_error(path, fragment: str) -> None:
    for fn in (tracefile.load, summarize):
        with pytest.raises(TraceFileError) as e:
            fn(path)
        msg = str(e.value)
        assert fragment in msg and "\n" not in msg and msg.strip() == msg


@pytest.mark.parametrize("content, fragment", [
    (b"", "empty"),
    (b"   \n\t", "not a trace file"),
    (b"\n\n  \n", ""),  # looks like a protobuf field-1 tag: the .pftrace reader must refuse it
    (bytes(range(1, 256)) * 4, "not a trace file"),
    (b"[\xff\xfe\x00garbage", "binary"),
    (b"hello, world", "not a trace file"),
    (b'"just a string"', "not a trace file"),
    (b'{"foo": 1}', "no traceEvents list"),
    (b'{"traceEvents": 5}', "no traceEvents list"),
    (b'{"traceEvents": [', "not valid JSON"),
    (b"[1, 2, 3]", "not an object"),
    (b'[{"ph": "X",', "no complete event"),
])
def test_bad_trace_files_raise_trace_file_error(tmp_path, content, fragment):
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    _check_error(path, fragment)


def test_missing_file_and_directory_raise_trace_file_error(tmp_path):
    _check_error(tmp_path / "nope.json", "no such file")
    _check_error(tmp_path, "is a directory")


def test_user_attributes_named_like_our_args_are_kept_renamed(tmp_path):
    """A region attribute called "span" or "parent" neither hides the span's own id nor is lost."""
    path = tmp_path / "attrs.json"
    with cltrace.trace(path):
        with cltrace.region("r", attrs={"span": "mine", "parent": 7, "k": 1}):
            pass
    (s,), _ = tracefile.load(path)
    assert s.id == RECORDER.spans()[0].id and s.parent == 0
    assert s.attrs == {"attr.span": "mine", "attr.parent": 7, "k": 1}
