"""The one small interface every exporter implements.

Like OpenTelemetry's SpanExporter, a sink only receives finished spans in
batches; the recorder (the "span processor") decides when. Sinks never see
raw events, never wait on the device, and must not raise into the program.
"""
from __future__ import annotations

import io
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


# Bytes handed to a trace file between two requests that the OS start writing them to disk.
WRITEBACK_BYTES = 4 << 20
_advise = getattr(os, "posix_fadvise", None)
_DONTNEED = getattr(os, "POSIX_FADV_DONTNEED", 0)


class TraceFile(io.BufferedWriter):
    """A streamed trace file: buffered, and on its way to disk while it grows.

    The OS keeps written pages in memory until a deadline (Linux: 30 s), so the ``fsync`` at
    close used to write the whole file, inside ``stop()``: 15-20 ms for a 30 MB trace here
    (``benchmarks/e2e_breakdown.py``). Every ``WRITEBACK_BYTES`` this asks the OS to start writing
    the new part (``posix_fadvise(DONTNEED)``: starts writeback, waits for nothing), so that I/O
    runs alongside the encoding and ``close_durably`` waits for the last part only. Durability is
    unchanged: the file is fsynced at close, as before; it only gets to disk sooner.
    """

    def __init__(self, path: str) -> None:
        super().__init__(io.FileIO(path, "wb"), buffer_size=1 << 20)
        self.written = 0  # bytes handed to this file (its size once flushed)
        self.unsynced_from = 0  # where the part the OS was not yet asked to write back starts

    def write(self, data: Any) -> int:
        n = super().write(data)
        self.written += n
        if self.written - self.unsynced_from >= WRITEBACK_BYTES:
            self.write_back()
        return n

    def write_back(self) -> None:
        """Hand what is buffered to the OS and have it start writing the new part to disk."""
        self.flush()
        if _advise is not None:
            try:
                _advise(self.fileno(), self.unsynced_from, 0, _DONTNEED)
            except OSError:  # a file system without it: the fsync at close does it all
                pass
        self.unsynced_from = self.written

    def close_durably(self) -> None:
        """Flush, fsync (the file survives a crash of the machine, not only of the process), close."""
        self.flush()
        try:
            os.fsync(self.fileno())
        except OSError:
            pass
        self.close()


def open_trace_file(path: str) -> TraceFile:
    """Create the trace file (and its folder) for a streaming writer, with a large buffer."""
    d = os.path.dirname(path)
    if d:
        os.makedirs(d, exist_ok=True)
    return TraceFile(path)
