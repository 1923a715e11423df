"""The region/kernel statistics of a trace file (``cltrace summary``)."""
from __future__ import annotations

import os
from typing import Any

import numpy as np

from ..read import load_columns
from ..timeline.batch import SpanBatch, Tables
from ..timeline.stats import Stats
from .model import TraceData
from .window import as_window, select


# What ``Stats.add`` reads of a batch, and how many rows it is given at a time.
_STATS_COLS = ("cat", "host_begin", "host_end", "dev_start", "dev_end", "track", "status")
CHUNK = 1 << 20


def add_in_time_order(stats: Stats, b: SpanBatch, chunk: int = CHUNK) -> None:
    """Add the rows to ``stats`` by host begin, their paths numbered in the order the rows first meet them
    (as ``SpanBatch.from_spans`` numbers them): ``Stats`` then samples exactly as for the ``Span`` list.
    Fed ``chunk`` rows at a time (the running aggregation gives what one whole batch gives), so beyond the
    columns read it holds the order and ``chunk`` rows of the columns ``Stats`` reads, never a copy of all."""
    if not b.n:
        return
    order = np.argsort(b.host_begin, kind="stable")
    present, inv = np.unique(b.path[order], return_inverse=True)
    inv = inv.ravel().astype(np.int32)
    first = np.full(len(present), b.n)
    np.minimum.at(first, inv, np.arange(b.n))
    met = np.argsort(first, kind="stable")
    del first
    t = Tables()
    t.names, t.cats, t.region_cats = b.tables.names, b.tables.cats, b.tables.region_cats
    for k in met.tolist():
        t.paths.id(b.tables.paths.values[int(present[k])])
    rank = np.empty(len(present), np.int32)
    rank[met] = np.arange(len(present), dtype=np.int32)
    for lo in range(0, b.n, chunk):
        rows = order[lo:lo + chunk]
        cols = {c: getattr(b, c)[rows] for c in _STATS_COLS}
        cols["id"] = rows
        cols["path"] = rank[inv[lo:lo + chunk]]
        stats.add(SpanBatch(t, cols))


def summarize(path: str | os.PathLike[str], window: Any = None) -> tuple[Stats, dict[str, Any]]:
    """The region tree of a trace file, of the whole run or of a ``window`` (``analyzers.window``: a
    Window, ``"steady"``, ``"2:12"``); a window other than the whole run is the metadata's ``window``."""
    spans, meta = load_columns(path)
    w = as_window(window)
    if not w.whole:
        sel = select(TraceData(spans, meta), w)
        if sel.rows is not None:
            spans = spans.take(sel.rows) if isinstance(spans, SpanBatch) else [spans[i] for i in sel.rows.tolist()]
        meta = {**meta, "window": sel.as_dict()}
    stats = Stats()
    if isinstance(spans, SpanBatch):
        add_in_time_order(stats, spans)
    else:
        stats.add(sorted(spans, key=lambda s: s.host_begin))
    return stats, meta
