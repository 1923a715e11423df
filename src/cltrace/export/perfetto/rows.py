"""A batch of spans as packet rows: one row per packet, one int64 column per field.

Per span: a host BEGIN/END pair and, where it ran on a device, a device BEGIN/END pair; per transfer
that says its size, a sample of the cumulative bytes-transferred counter. A launch's host BEGIN
carries ``flow_ids`` = [span id] and its device BEGIN ``terminating_flow_ids`` = [span id]; other
BEGINs carry the span id as an annotation. Host BEGINs also carry parent and the (pooled) status,
error and attribute annotations; device BEGINs the raw device stamps: "device.start" always,
"device.end" only where it does not follow from it (raw END - START differs from the slice's
length). K1..K3 are the tie-breaking keys and G the parent the row waits for (see ``order``).
"""
from __future__ import annotations

from operator import ne
from typing import TYPE_CHECKING, Any

import numpy as np

from ...timeline.batch import SpanBatch
from ...timeline.spans import TRANSFER
from .wire import TE_COUNTER, uv

from .columns import (C_EXTRA, C_FLOW, C_G, C_K1, C_K2, C_K3, C_PARENT, C_PRE, C_RAW, C_RAWE, C_RAWEND, C_RAWS,
                      C_SID, C_SPANANN, C_TRACK, C_TS, FLOW_IN, FLOW_OUT, K2_COUNTER, K2_END, NCOLS)
from .order import HoldBack

if TYPE_CHECKING:
    from .tracks import Tracks


def batch_rows(batch: SpanBatch, tracks: Tracks, hold: HoldBack,
               head: list[bytes]) -> tuple[np.ndarray, list[bytes], list[tuple[int, int]]]:
    """The rows of a batch, the byte strings their C_EXTRA refers to, and (id, group) of the spans that
    may be parents, for ``HoldBack.hold_back``. Descriptors of new tracks go to ``head``."""
    n = batch.n
    ids, par = batch.id, batch.parent
    cats, names = batch.cat_list(), batch.name_list()
    attrs = batch.attrs
    bad = batch.status.astype(bool)
    threads = batch.thread.tolist()
    placed = batch.track != 0
    dv = np.flatnonzero(placed)
    m = len(dv)
    dts = batch.track[dv].tolist()
    tracks.open(set(threads).union(dts), head)
    group, md, arrivals = hold.groups(cats, ids, par)
    flows = placed & ~batch.is_region()
    thr = batch.thread.astype(np.int64)
    need = np.fromiter(map(bool, attrs), bool, n) | bad
    changed = np.ones(n, bool)  # launches repeat their attributes: encode each run of equal ones once
    if n > 1:
        changed[1:] = _differs(attrs) | (thr[1:] != thr[:-1]) | (bad[1:] != bad[:-1])
        if batch.errors:
            errs = batch.error_list()
            changed[1:] |= _differs(errs)
    new = need & changed
    extras = [tracks.seqs[threads[i]].extra(attrs[i], bool(bad[i]), batch.errors.get(i))
              for i in np.flatnonzero(new).tolist()]
    xid = np.where(need, np.cumsum(new) - 1, -1)
    rows = np.zeros((2 * n + 2 * m, NCOLS), np.int64)
    h0, h1 = rows[:n], rows[n:2 * n]
    _pair(h0, h1, thr, batch.host_begin, batch.host_end, ids, md, group)
    h0[:, C_PRE] = tracks.prefix_ids(threads, cats, names)
    h0[:, C_FLOW] = flows * FLOW_OUT
    h0[:, C_SPANANN] = ~flows
    h0[:, C_PARENT] = par
    h0[:, C_EXTRA] = xid
    if m:
        d0, d1 = rows[2 * n:2 * n + m], rows[2 * n + m:]
        _pair(d0, d1, batch.track[dv].astype(np.int64), batch.dev_start[dv], batch.dev_end[dv],
              ids[dv], md[dv], group[dv])
        pick = dv.tolist()
        d0[:, C_PRE] = tracks.prefix_ids(dts, [cats[i] for i in pick], [names[i] for i in pick])
        f = flows[dv]
        d0[:, C_FLOW] = f * FLOW_IN
        d0[:, C_SPANANN] = ~f
        d0[:, C_EXTRA] = -1
        d0[:, C_RAW] = 1
        d0[:, C_RAWS] = batch.raw_start[dv]
        d0[:, C_RAWE] = batch.raw_end[dv]
        d0[:, C_RAWEND] = d0[:, C_RAWE] - d0[:, C_RAWS] != d1[:, C_TS] - d0[:, C_TS]
    counters = _counter_rows(batch, cats, attrs, group, md, tracks, head, extras)
    if counters is not None:
        rows = np.concatenate([rows, counters])
    return rows, extras, arrivals


def _pair(b: np.ndarray, e: np.ndarray, track: np.ndarray, begin: np.ndarray, end: np.ndarray, ids: np.ndarray,
          md: np.ndarray, group: np.ndarray) -> None:
    """The columns a BEGIN/END pair shares: BEGIN(Y) sorts as (ts, Y), END(X) as (ts, md(X), 1, -X)."""
    b[:, C_TRACK] = e[:, C_TRACK] = track
    b[:, C_TS] = begin
    e[:, C_TS] = end
    b[:, C_K1] = b[:, C_SID] = ids
    e[:, C_K1] = md
    e[:, C_K2] = K2_END
    e[:, C_K3] = -ids
    b[:, C_G] = e[:, C_G] = group
    e[:, C_PRE] = e[:, C_EXTRA] = -1


def _counter_rows(batch: SpanBatch, cats: list[str], attrs: list[Any], group: np.ndarray, md: np.ndarray,
                  tracks: Tracks, head: list[bytes], extras: list[bytes]) -> np.ndarray | None:
    """Cumulative bytes-transferred samples, at the end of each transfer that says its size."""
    if TRANSFER not in cats:
        return None
    out = []
    for i, (c, a) in enumerate(zip(cats, attrs)):
        if c != TRANSFER or not a:
            continue
        nbytes = a.get("bytes")
        if not isinstance(nbytes, int) or isinstance(nbytes, bool):
            continue
        dt = int(batch.track[i])
        track = dt if dt else int(batch.thread[i])
        seq = tracks.counter(track, head)
        seq.moved += nbytes
        row = np.zeros(NCOLS, np.int64)
        row[[C_TRACK, C_TS, C_K1, C_K2, C_K3, C_G]] = (
            track, int(batch.dev_end[i]) if dt else int(batch.host_end[i]), md[i], K2_COUNTER, -int(batch.id[i]),
            group[i])
        row[C_PRE] = seq.counter_prefix
        row[C_EXTRA] = len(extras)
        extras.append(TE_COUNTER + uv(seq.moved))
        out.append(row)
    return np.array(out) if out else None


def _differs(values: list[Any]) -> np.ndarray:
    """values[i + 1] != values[i], for each i (all True where values do not compare, e.g. arrays)."""
    try:
        return np.array(list(map(ne, values[1:], values[:-1])), bool)
    except (TypeError, ValueError):
        return np.ones(len(values) - 1, bool)
