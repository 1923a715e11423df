"""Packet rows to bytes, in the order trace processor needs.

Each row becomes one ``Trace.packet``: timestamp (a delta on its sequence's incremental clock, or
absolute on MONOTONIC where time goes backwards on the sequence, which leaves the incremental clock
as it was), the sequence's pooled fields, then the TrackEvent: type, pooled name and category iids,
flow id, int annotations behind pooled headers, and pooled extra bytes. A sequence's header and any
newly interned names are written before its first row that needs them.
"""
from __future__ import annotations

import numpy as np

from .layout import Layout, Pool
from .order import order, runs
from .columns import (C_EXTRA, C_FLOW, C_K2, C_PARENT, C_PRE, C_RAW, C_RAWE, C_RAWEND, C_RAWS, C_SID, C_SPANANN, C_TRACK,
                      C_TS)
from .tracks import STANDARD_ANNS, Tracks
from .wire import (BEGIN, COUNTER, END, MONOTONIC, P_CLOCK, P_INTERNED, P_SEQ, P_TS, PACKET, TE_FLOW, TE_TFLOW,
                   TE_TYPE, frame, uv)

_FLOW_TAGS = np.frombuffer(b"\0\0" + TE_FLOW + TE_TFLOW, np.uint8).reshape(3, 2)  # by C_FLOW
_TYPES = np.array([BEGIN, END, COUNTER], np.uint8)  # by C_K2
_ABS_CLOCK = P_CLOCK + uv(MONOTONIC)
_ANN_COLUMNS = ((C_SID, C_SPANANN), (C_PARENT, C_PARENT), (C_RAWS, C_RAW), (C_RAWE, C_RAWEND))  # by STANDARD_ANNS


def encode(tracks: Tracks, rows: np.ndarray, extras: list[bytes],
           select: np.ndarray | None = None) -> tuple[bytes, int]:
    """Packets for ``rows`` (or the rows at ``select``), and how many there are."""
    if select is None:
        select = np.arange(len(rows))
    if not len(select):
        return b"", 0
    rows = rows[select[order(rows, select)]]
    n = len(rows)
    ts = rows[:, C_TS]
    prev = np.empty(n, np.int64)
    head: list[bytes] = []
    tails = np.empty(n, np.int64)
    hdrs = np.empty((len(STANDARD_ANNS), n), np.int64)
    for track, lo, hi in runs(rows[:, [C_TRACK]]):
        seq = tracks.seqs[track[0]]
        if seq.last is None:
            head.append(tracks.header(seq, int(ts[lo])))
            seq.last = int(ts[lo])
        if seq.pending:
            head.append(frame(P_SEQ + uv(seq.id) + P_INTERNED + uv(len(seq.pending)) + bytes(seq.pending)))
            seq.pending.clear()
        prev[lo] = seq.last
        prev[lo + 1:hi] = np.maximum(ts[lo:hi - 1], seq.last)  # rows are sorted by time per track
        seq.last = max(seq.last, int(ts[hi - 1]))
        tails[lo:hi] = seq.tail
        hdrs[:, lo:hi] = np.array([seq.anns[a] for a in STANDARD_ANNS])[:, None]
    absolute = np.flatnonzero(ts < prev)
    tsv = ts - prev
    tsv[absolute] = ts[absolute] + tracks.mono
    typed = np.empty((n, 2), np.uint8)
    typed[:, 0] = TE_TYPE[0]
    typed[:, 1] = _TYPES[rows[:, C_K2]]

    lay = Layout(n)
    lay.const(bytes((PACKET,)))
    body_at = lay.length()
    lay.const(bytes((P_TS,)))
    lay.varint(tsv)
    lay.const(_ABS_CLOCK, absolute)
    lay.pooled(tails, tracks.pool)
    te_at = lay.length()
    lay.fixed(typed)
    named = np.flatnonzero(rows[:, C_PRE] >= 0)
    lay.pooled(rows[named, C_PRE], tracks.pool, named)
    flowing = np.flatnonzero(rows[:, C_FLOW])
    if len(flowing):
        rec = np.empty((len(flowing), 10), np.uint8)  # tag, then the span id as fixed64
        rec[:, :2] = _FLOW_TAGS[rows[flowing, C_FLOW]]
        rec[:, 2:] = rows[flowing, C_SID].astype("<u8").reshape(-1, 1).view(np.uint8)
        lay.fixed(rec, flowing)
    for k, (col, has) in enumerate(_ANN_COLUMNS):
        sel = np.flatnonzero(rows[:, has])
        if len(sel):
            lay.annotation(hdrs[k, sel], rows[sel, col], tracks.pool, sel)
    extra = np.flatnonzero(rows[:, C_EXTRA] >= 0)
    if len(extra):
        lay.pooled(rows[extra, C_EXTRA], Pool(extras), extra)
    lay.set_length(te_at, lay.total(te_at + 1))
    lay.set_length(body_at, lay.total(body_at + 1))
    return b"".join(head) + lay.bytes(), n + len(head)
