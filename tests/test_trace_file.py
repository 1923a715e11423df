"""Streamed trace files reach the OS and start for disk while they grow (export/base.py TraceFile),
so the fsync at close waits for the last part only; closed, they are complete and readable."""
from __future__ import annotations

import os

import pytest

import cltrace
from cltrace import read as tracefile
from cltrace.export import base
from cltrace.export.chrome import ChromeTraceSink
from cltrace.export.perfetto import PerfettoTraceSink
from cltrace.record.recorder import RECORDER

STEP = 1 << 16


def test_a_trace_file_is_handed_to_the_os_every_writeback_step(tmp_path, monkeypatch):
    monkeypatch.setattr(base, "WRITEBACK_BYTES", STEP)
    path = tmp_path / "t.bin"
    fh = base.open_trace_file(str(path))
    piece = b"x" * 10_000
    for i in range(1, 61):
        fh.write(piece)
        # Without write-back the 1 MB buffer would hold all of it: the OS would have seen nothing yet.
        assert fh.written == i * len(piece)
        assert fh.written - fh.unsynced_from < STEP
        assert os.stat(path).st_size >= fh.unsynced_from
    assert fh.unsynced_from >= 600_000 - STEP
    fh.close_durably()
    assert fh.closed and path.read_bytes() == piece * 60


@pytest.mark.parametrize("sink_type, suffix", [(ChromeTraceSink, "json"), (PerfettoTraceSink, "pftrace")])
def test_sinks_write_their_files_back_while_spans_stream_in(tmp_path, monkeypatch, queue, kernels, sink_type, suffix):
    with cltrace.trace():
        for _ in range(200):
            kernels.launch_add(queue)
    batch = RECORDER.batch()
    monkeypatch.setattr(base, "WRITEBACK_BYTES", STEP)
    path = tmp_path / f"t.{suffix}"
    sink = sink_type(path)
    sink.start(RECORDER)
    for _ in range(40):
        sink.write(batch)
    fh = sink._fh
    assert isinstance(fh, base.TraceFile)
    assert fh.unsynced_from > 0 and fh.written - fh.unsynced_from < STEP + fh.written // 40
    assert os.stat(path).st_size >= fh.unsynced_from
    sink.close(RECORDER.metadata())
    spans, meta = tracefile.load(path)
    assert len(spans) == batch.n and meta["clocks"]  # the same 200 spans 40 times: read back once each
