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

    # Optional: ``abandon()``, called in a forked child on the parent's sinks: drop everything
    # without writing or closing anything the parent owns (``abandon_file`` for a file).


def abandon_file(fh: IO[bytes] | None) -> None:
    """In a forked child: make the parent's open trace file unreachable without writing to it.

    Its buffered bytes are the parent's; flushed from the child (at exit, by the garbage
    collector) they would land in the parent's file a second time. The descriptor is pointed at
    /dev/null instead, so whatever is flushed later goes nowhere."""
    if fh is None:
        return
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(null, fh.fileno())
        finally:
            os.close(null)
    except (OSError, ValueError):
        pass


def open_trace_file(path: str) -> IO[bytes]:
    """Create the trace file (and its folder) for a streaming writer, with a large buffer."""
    d = os.path.dirname(path)
    if d:
        os.makedirs(d, exist_ok=True)
    return open(path, "wb", buffering=1 << 20)
