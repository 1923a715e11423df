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


def _in_time_order(b: SpanBatch) -> SpanBatch:
    """The rows by host begin, their paths numbered in the order the rows first meet them (as
    ``SpanBatch.from_spans`` numbers them): ``Stats`` then samples exactly as for the ``Span`` list."""
    b = b.take(np.argsort(b.host_begin, kind="stable"))
    present, inv = np.unique(b.path, return_inverse=True)
    inv = inv.ravel()
    first = np.full(len(present), b.n)
    np.minimum.at(first, inv, np.arange(b.n))
    met = np.argsort(first, kind="stable")
    t = Tables()
    t.names, t.cats, t.region_cats = b.tables.names, b.tables.cats, b.tables.region_cats
    for k in met.tolist():
        t.paths.id(b.tables.paths.values[int(present[k])])
    rank = np.empty(len(present), np.int32)
    rank[met] = np.arange(len(present), dtype=np.int32)
    b.path = rank[inv]
    b.tables = t
    return b


def summarize(path: str | os.PathLike[str], window: Any = None) -> tuple[Stats, dict[str, Any]]:
    """The region tree of a trace file, of the whole run or of a ``window`` (``analyze.window``: a
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
        stats.add(_in_time_order(spans))
    else:
        stats.add(sorted(spans, key=lambda s: s.host_begin))
    return stats, meta
