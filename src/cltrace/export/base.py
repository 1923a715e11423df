"""The one small interface every exporter implements.

Like OpenTelemetry's SpanExporter, a sink only receives finished spans in
batches; the recorder (the "span processor") decides when. Sinks never see
raw events, never wait on the device, and must not raise into the program.
"""
from __future__ import annotations

import os
from typing import IO, Any, Protocol, Sequence

from ..timeline.spans import Span


class SpanSink(Protocol):
    def start(self, recorder: Any) -> None:
        """Called once before the first batch; ``recorder.tracks`` names the tracks."""

    def write(self, spans: Sequence[Span]) -> None:
        """A batch of resolved spans, in no guaranteed order."""

    def flush(self, meta: dict[str, Any]) -> None:
        """Make everything written so far durable (file: readable if the process dies now)."""

    def close(self, meta: dict[str, Any]) -> None:
        """Write final metadata (drop counts, clock bounds) and release resources."""


def open_trace_file(path: str) -> IO[bytes]:
    """Create the trace file (and its folder) for a streaming writer, with a large buffer."""
    d = os.path.dirname(path)
    if d:
        os.makedirs(d, exist_ok=True)
    return open(path, "wb", buffering=1 << 20)
