"""The sink contract (export/base.py): ``start(ctx: TraceContext)``, ``write(batch: SpanBatch)``.

The recorder and a trace of fixed parts (a merge's replay) both are a ``TraceContext``; every built-in sink runs on a context that
has the protocol's members and nothing else, and reads what the context says (no probing the recorder for
what it might have).
"""
from __future__ import annotations

import json
from typing import Any, Mapping

import pytest

import cltrace
from cltrace.export.base import FixedTrace, TraceContext
from cltrace.export.chrome import ChromeTraceSink
from cltrace.export.perfetto import PerfettoTraceSink
from cltrace.export.speedscope import SpeedscopeSink
from cltrace.merge.merge import MergedTracks
from cltrace.record.recorder import RECORDER
from cltrace.timeline.batch import SpanBatch


class OnlyTheContext:
    """A TraceContext with the protocol's members and no other (a sink reaching past it fails)."""

    __slots__ = ("tracks", "tables", "start_ns", "start_unix_ns", "memory", "steps", "process_names", "_meta",
                 "_now")

    def __init__(self, source: Any, process_names: Mapping[int, str]) -> None:
        self.tracks, self.tables, self.steps = source.tracks, source.tables, source.steps
        self.start_ns, self.start_unix_ns, self.memory = source.start_ns, source.start_unix_ns, source.memory
        self.process_names = process_names
        self._meta = source.metadata()
        self._now = source.now_ns()

    def metadata(self) -> dict[str, Any]:
        return dict(self._meta)

    def now_ns(self) -> int:
        return self._now


def recorded_batch(queue: Any, kernels: Any) -> SpanBatch:
    with cltrace.trace():
        with cltrace.region("outer", queue):
            for _ in range(3):
                kernels.launch_add(queue)
    return RECORDER.batch()


def test_the_recorder_and_a_merged_replay_are_trace_contexts() -> None:
    assert isinstance(RECORDER, TraceContext)
    replay = FixedTrace(MergedTracks(1), start_ns=5, end_ns=10, meta={"a": 1})
    assert isinstance(replay, TraceContext)
    assert replay.memory is None and replay.steps.n == 0 and replay.now_ns() == 10 and replay.process_names == {}
    assert replay.metadata() == {"a": 1} and replay.metadata() is not replay.meta
    assert not isinstance(object(), TraceContext)


def test_every_file_sink_runs_on_the_context_alone_and_names_the_process_from_it(tmp_path: Any, queue: Any,
                                                                                 kernels: Any) -> None:
    batch = recorded_batch(queue, kernels)
    assert batch.n >= 4
    ctx = OnlyTheContext(RECORDER, {RECORDER.tracks.pid: "named-by-ctx"})
    paths = {"json": str(tmp_path / "t.json"), "pftrace": str(tmp_path / "t.pftrace"),
             "speedscope": str(tmp_path / "t.speedscope.json")}
    sinks = [ChromeTraceSink(paths["json"]), PerfettoTraceSink(paths["pftrace"], compress=False),
             SpeedscopeSink(paths["speedscope"])]
    for sink in sinks:
        sink.start(ctx)
        sink.write(batch)
        sink.flush(ctx.metadata())
        sink.close(ctx.metadata())
    events = [json.loads(line.rstrip(",\n")) for line in open(paths["json"]) if line.startswith("{")]
    names = [e["args"]["name"] for e in events if e.get("name") == "process_name" and e["pid"] == ctx.tracks.pid]
    assert names == ["named-by-ctx"]
    assert b"named-by-ctx" in open(paths["pftrace"], "rb").read()
    doc = json.load(open(paths["speedscope"]))
    assert {f["name"] for f in doc["shared"]["frames"]} >= {"outer", "add"}


def test_otlp_sink_takes_a_batch_and_drops_what_does_not_fit(queue: Any, kernels: Any) -> None:
    pytest.importorskip("opentelemetry.sdk")
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from cltrace.export.otlp import OtlpSink

    batch = recorded_batch(queue, kernels)
    mem = InMemorySpanExporter()
    sink = OtlpSink(exporter=mem, max_queue_spans=2, close_timeout_s=5)
    ctx = OnlyTheContext(RECORDER, {})
    sink.start(ctx)
    sink.write(batch)  # more rows than the queue holds: the first two queued, the rest dropped and counted
    sink.close(ctx.metadata())
    st = sink.stats()
    # The run's root span (sent at close) counts as received and delivered too.
    assert (st["received"], st["dropped"], st["delivered"]) == (batch.n + 1, batch.n - 2, 3)
    sent = {s.context.span_id for s in mem.get_finished_spans()}
    assert {sink.span_id(int(i)) for i in batch.id[:2].tolist()} <= sent
