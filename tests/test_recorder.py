"""The recorder: memory caps, drop counts in every output, back-pressure, sinks, threads."""
from __future__ import annotations

import threading

import pytest

import cltrace
from cltrace import read as tracefile
from cltrace.export.chrome import ChromeTraceSink
from cltrace.record.recorder import RECORDER


class CollectingSink:
    """A real SpanSink that keeps what it is given, to check the protocol."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.spans: list = []
        self.metas: list[dict] = []
        self.recorder = None

    def start(self, recorder) -> None:
        self.calls.append("start")
        self.recorder = recorder

    def write(self, spans) -> None:
        self.calls.append("write")
        self.spans.extend(spans)

    def flush(self, meta) -> None:
        self.calls.append("flush")
        self.metas.append(meta)

    def close(self, meta) -> None:
        self.calls.append("close")
        self.metas.append(meta)


def _regions(n: int, name: str = "r") -> list[int]:
    """Record ``n`` host-only regions; their span ids (recorded or not)."""
    ids = []
    for i in range(n):
        with cltrace.region(name, None, {"i": i}) as r:
            pass
        ids.append(getattr(r, "_id", None))
    return ids


def test_discard_keeps_the_first_spans_and_every_output_counts_the_drops(tmp_path):
    stream = tmp_path / "stream.json"
    cltrace.start(stream, capacity=10, overflow="discard")
    ids = _regions(25)
    cltrace.stop()
    kept = RECORDER.spans()
    assert [s.id for s in kept] == ids[:10]
    assert RECORDER.dropped == 15 and RECORDER.recorded == 25
    assert RECORDER.metadata()["memory_dropped_spans"] == 15

    # The streaming file got every span: nothing is missing from it; memory's drops are told apart.
    spans, meta = tracefile.load(stream)
    assert len(spans) == 25 and meta["dropped_spans"] == 0 and meta["capacity"] == 10
    assert meta["memory_dropped_spans"] == 15
    # A late export writes what memory kept, with the same count.
    late = tmp_path / "late.json"
    RECORDER.export(ChromeTraceSink(late))
    spans, meta = tracefile.load(late)
    assert sorted(s.id for s in spans) == ids[:10] and meta["dropped_spans"] == 15
    assert "25 recorded, 0 dropped, 15 not kept in memory" in cltrace.PerfCounter().report()
    assert cltrace.PerfCounter().as_dict()["r"]["host"]["count"] == 25


@pytest.mark.parametrize("name", ["late.json", "late.pftrace"])
def test_export_takes_a_path_as_start_does(tmp_path, name):
    """``RECORDER.export("x.json")``: the format from the suffix, written whole (no ``.partial`` left), the
    same spans as a sink given by hand; a path that cannot be written is one ``OutputError`` line."""
    cltrace.start()
    ids = _regions(4)
    cltrace.stop()
    out = tmp_path / "sub" / name
    assert RECORDER.export(str(out)) == str(out)
    assert RECORDER.export(out) == str(out)  # a PathLike too, replacing the earlier file
    spans, meta = tracefile.load(out)
    assert sorted(s.id for s in spans) == ids and meta["dropped_spans"] == 0
    assert sorted(p.name for p in out.parent.iterdir()) == [name]
    (tmp_path / "afile").write_text("")
    with pytest.raises(cltrace.OutputError, match="afile") as e:
        RECORDER.export(tmp_path / "afile" / name)
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="trace format"):
        RECORDER.export(tmp_path / "x.txt")


def test_ring_keeps_the_latest_spans():
    cltrace.start(capacity=10, overflow="ring")
    ids = _regions(25)
    cltrace.stop()
    assert [s.id for s in RECORDER.spans()] == ids[-10:]
    assert RECORDER.dropped == 15 and RECORDER.metadata()["overflow"] == "ring"
    assert _regions(3) == [None] * 3  # tracing off: nothing more recorded
    assert RECORDER.recorded == 25


def test_configure_rejects_bad_values():
    with pytest.raises(ValueError, match="capacity"):
        RECORDER.configure(capacity=0)
    with pytest.raises(ValueError, match="overflow"):
        RECORDER.configure(overflow="drop-oldest")
    assert RECORDER.capacity == 1_000_000 and RECORDER.overflow == "discard"


def test_launches_never_wait_on_the_hot_path(queue, kernels):
    cltrace.start()
    # Holding the recorder's lock keeps the worker from taking a step (it would wake within
    # resolve_interval_s on a slow machine): launches must go on while the resolver is blocked.
    with RECORDER._lock:
        for _ in range(50):
            kernels.launch_add(queue)
        assert len(RECORDER.pending) == 50  # recorded, not resolved
    cltrace.stop()
    assert len(RECORDER.pending) == 0 and len(RECORDER.spans()) == 50


def test_back_pressure_resolves_in_batches_without_losing_spans(tmp_path, queue, kernels, chrome):
    path = tmp_path / "bp.json"
    RECORDER.configure(max_pending=16)
    outstanding = 0
    with cltrace.trace(path):
        for _ in range(60):
            with cltrace.region("step", queue):
                kernels.launch_add(queue)
                kernels.launch_spin(queue, 30)
                kernels.launch_add(queue)
            outstanding = max(outstanding, len(RECORDER.pending) + len(RECORDER.resolver.waiting))
    assert outstanding <= RECORDER.hard_cap and RECORDER.lost == 0
    spans = RECORDER.spans()
    assert len(spans) == 240 and len({s.id for s in spans}) == 240
    assert all(s.source == "device" for s in spans)
    tr = chrome.read(path)
    assert len(tr.placements()) == 240
    assert tr.misnested() == [] and tr.children_outside_parents() == []


def test_sink_protocol_each_span_delivered_once(queue, kernels):
    sink = CollectingSink()
    with cltrace.trace(sink):
        with cltrace.region("a", queue):
            kernels.launch_add(queue)
        RECORDER.flush()
        with cltrace.region("b"):
            kernels.launch_add(queue)
    assert sink.recorder is RECORDER
    assert sink.calls[0] == "start" and sink.calls[-1] == "close" and sink.calls.count("close") == 1
    assert "write" in sink.calls and "flush" in sink.calls
    assert sorted(s.name for s in sink.spans) == ["a", "add", "add", "b"]
    assert len({s.id for s in sink.spans}) == 4
    assert sink.metas[-1]["recorded_spans"] == 4 and "clocks" in sink.metas[-1]
    assert sink not in RECORDER.sinks


def test_removed_sink_gets_nothing_more():
    sink = CollectingSink()
    RECORDER.add_sink(sink)
    cltrace.start()
    _regions(3)
    RECORDER.remove_sink(sink)
    _regions(2)
    cltrace.stop()
    assert len(sink.spans) == 3 and sink.calls[-1] == "close"
    assert len(RECORDER.spans()) == 5


def test_records_from_many_threads_are_all_resolved_once():
    sink = CollectingSink()
    n_threads, per_thread = 6, 400
    stop = threading.Event()
    barrier = threading.Barrier(n_threads)

    def flusher() -> None:
        while not stop.is_set():
            RECORDER.flush(block=False)

    def worker(i: int) -> None:
        barrier.wait()
        for j in range(per_thread):
            with cltrace.region(f"t{i}"):
                cltrace.record_launch("host_op", None, None, j, j + 1)

    with cltrace.trace(sink):
        f = threading.Thread(target=flusher)
        f.start()
        threads = [threading.Thread(target=worker, args=(i,)) for i in range(n_threads)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        stop.set()
        f.join()
    total = n_threads * per_thread * 2
    assert len(sink.spans) == total and len({s.id for s in sink.spans}) == total
    by_id = {s.id: s for s in sink.spans}
    for s in sink.spans:
        if s.name == "host_op":
            parent = by_id[s.parent]
            assert parent.thread == s.thread and s.path == (parent.name, "host_op")
    assert len({s.thread for s in sink.spans}) == n_threads


def test_clear_forgets_spans_and_counts():
    cltrace.start(capacity=2)
    _regions(5)
    cltrace.stop()
    assert RECORDER.dropped == 3
    RECORDER.clear()
    assert RECORDER.spans() == [] and RECORDER.dropped == 0 and RECORDER.recorded == 0
    assert cltrace.PerfCounter().as_dict() == {}
