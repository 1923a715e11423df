"""A trace file's spans as ``SpanBatch`` columns on the host clock: whole, or a window at a time where it is large.

What the store's loader and the merge read a file through. A file of ``WINDOWED_FROM`` bytes or more (by
format) is read by ``windows.open_windows``, in memory bounded by the window whatever its size; a smaller
one, or one the windowed readers leave (outside cltrace's layout, no C scanner), whole (``load_columns``)
as one batch. Chrome JSON keeps host times as offsets from ``start_ns``: the batches have them back on the
host clock, as a ``.pftrace`` and the recorder have them.
"""
from __future__ import annotations

import os
from typing import Any, Iterator

from ..errors import TraceFileError
from ..timeline.batch import SpanBatch, Tables, as_batch
from .load import detect, load_columns
from .window_base import WindowedTrace

# Files this large are read in windows: whole, a span costs ~1 KB of memory at the reader's peak; a .pftrace holds
# one in 10-20 B, a .json in 250-750 B. At or under cli/large.DEFAULT_MB, so a file sent through the store is not
# read whole (a 45 MB .pftrace of 5M spans: 3.4 GB whole, 0.85 GB in windows, loaded and analysed).
WINDOWED_FROM = {"pftrace": 32 << 20, "json": 256 << 20}


def absolute(batch: SpanBatch, base: int) -> None:
    """Chrome JSON keeps host and device-placement times as offsets from the recorder's ``start_ns``
    (``export/chrome``: ``ts`` in µs since it) and ``queued_host_ns``/``submit_host_ns`` as they are:
    put the former back on the host clock, as ``.pftrace`` and the recorder have them."""
    if not base:
        return
    dev = batch.track != 0
    for col in (batch.host_begin, batch.host_end):
        col += base
    for col in (batch.dev_start, batch.dev_end):
        col[dev] += base


class FileBatches:
    """One file, open: ``meta`` (its metadata, read before its spans), then ``batches()`` once, then
    ``final_meta()`` (``recorded_spans`` counted where the file does not record it). ``whole`` is the file's one
    batch where it was read whole, until ``batches()`` hands it out; ``windowed`` says it is read in windows."""

    def __init__(self, path: str, kind: str, meta: dict[str, Any], whole: SpanBatch | None,
                 windows: WindowedTrace | None) -> None:
        self.path, self.kind, self.meta = path, kind, meta
        self.whole = whole
        self.windowed = windows is not None
        self._windows = windows

    def batches(self) -> Iterator[SpanBatch]:
        """The spans, a batch at a time (a file read whole: its one batch, let go of here). Raises TraceFileError
        naming the file where the second pass fails (a file that changed since the first)."""
        if self._windows is None:
            batch, self.whole = self.whole, None
            if batch is not None:
                yield batch
            return
        base = int(self.meta.get("start_ns") or 0) if self.kind == "json" else 0
        try:
            for batch in self._windows.batches():
                absolute(batch, base)
                yield batch
        except TraceFileError as exc:
            raise TraceFileError(str(exc) if str(exc).startswith(f"{self.path}: ") else f"{self.path}: {exc}") from None
        except OSError as exc:
            raise TraceFileError(f"{self.path}: cannot read it: {exc.strerror or exc}") from None

    def final_meta(self) -> dict[str, Any]:
        return self._windows.metadata() if self._windows is not None else self.meta


def open_batches(path: str | os.PathLike[str], windowed_from: int | None = None,
                 window_bytes: int | None = None) -> FileBatches:
    """Open ``path`` (see the module docstring): read in windows from ``windowed_from`` bytes (None:
    ``WINDOWED_FROM`` of its format), its first pass done; else read whole. ``window_bytes``: None for the
    reader's own. The batches share interning tables of the file's own. Raises TraceFileError naming the file."""
    p = os.fspath(path)
    try:
        kind = detect(p)
        size = os.path.getsize(p)
    except OSError as exc:
        raise TraceFileError(f"{p}: cannot read it: {exc.strerror or exc}") from None
    except TraceFileError as exc:
        raise TraceFileError(f"{p}: {exc}") from None
    if size >= (WINDOWED_FROM[kind] if windowed_from is None else windowed_from):
        from .windows import open_windows

        wt = open_windows(p, window_bytes=window_bytes)
        if wt is not None:
            return FileBatches(p, kind, wt.metadata(), None, wt)
    spans, meta = load_columns(p)  # its errors name the file
    batch = as_batch(spans, Tables())
    if kind == "json":
        absolute(batch, int(meta.get("start_ns") or 0))
    return FileBatches(p, kind, meta, batch, None)
