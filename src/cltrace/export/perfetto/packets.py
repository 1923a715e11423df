"""Packet rows to bytes, in the order trace processor needs.

Rows are sorted by track and time (ties in nesting order, see ``order``); each track's run is
encoded on its sequence: a sequence's header and any newly interned names go first, then the rows,
by the row encoder ``encoder`` picks (C or numpy, the same bytes). Each row becomes one
``Trace.packet``: timestamp (a delta on its sequence's incremental clock, or absolute on MONOTONIC
where time goes backwards on the sequence), the sequence id, then the TrackEvent: type, pooled
name and category iids, flow id, int annotations behind pooled headers, pooled extra bytes.
"""
from __future__ import annotations

import numpy as np

from . import encoder
from .columns import C_TRACK, C_TS
from .layout import R_HAS_OFFSET, R_LAST, R_OFFSET, RUN_COLS, strings
from .order import order
from .tracks import STANDARD_ANNS, Tracks
from .wire import P_INTERNED, P_SEQ, frame, uv


def encode(tracks: Tracks, rows: np.ndarray, extras: list[bytes],
           select: np.ndarray | None = None) -> tuple[bytes, int]:
    """Packets for ``rows`` (or the rows at ``select``), and how many there are."""
    if select is None:
        select = np.arange(rows.shape[1])
    if not len(select):
        return b"", 0
    perm = select[order(rows, select)]  # the encoder reads rows through it: no gathered copy
    n = len(perm)
    track = rows[C_TRACK, perm]
    cut = np.flatnonzero(track[1:] != track[:-1]) + 1
    los = [0, *cut.tolist()]
    his = [*cut.tolist(), n]
    head: list[bytes] = []
    runs = np.empty((len(los), RUN_COLS), np.int64)
    seqs = []
    for r, (lo, hi, t) in enumerate(zip(los, his, track[los].tolist())):
        seq = tracks.seqs[t]
        seqs.append(seq)
        if seq.last is None:
            first = int(rows[C_TS, perm[lo]])
            head.append(tracks.header(seq, first))
            seq.last = first
        if seq.pending:
            head.append(frame(P_SEQ + uv(seq.id) + P_INTERNED + uv(len(seq.pending)) + bytes(seq.pending)))
            seq.pending.clear()
        runs[r] = (lo, hi, seq.tail, *(seq.anns[a] for a in STANDARD_ANNS), seq.last,
                   seq.offset or 0, seq.offset is not None)
    data = encoder.encode_rows(rows, perm, runs, tracks.mono, tracks.consts, tracks.pool.arrays(), strings(extras))
    for seq, (last, offset, has) in zip(seqs, runs[:, [R_LAST, R_OFFSET, R_HAS_OFFSET]].tolist()):
        seq.last = last
        seq.offset = offset if has else None
    return b"".join(head) + data, n + len(head)
