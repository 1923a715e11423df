"""A batch of spans as packet rows: one row per packet, one int64 column per field (stored column by
column: ``rows[C]`` is a column, ``rows[:, i]`` a row).

Per span: a host BEGIN/END pair and, where it ran on a device, a device BEGIN/END pair; per transfer
that says its size, a sample of the cumulative bytes-transferred counter. A launch's host BEGIN
carries ``flow_ids`` = [span id] and its device BEGIN ``terminating_flow_ids`` = [span id]; other
BEGINs carry the span id as an annotation. Host BEGINs also carry parent and the (pooled) status,
error and attribute annotations; device BEGINs the raw device stamps: "device.start" where the raw
- mapped offset changed on the sequence (the encoder decides, in file order; C_RAW marks the rows
that may carry it), "device.end" only where it does not follow (raw END - START differs from the
slice's length). K1..K3 are the tie-breaking keys and G the parent the row waits for (see ``order``).
Work is done on the batch's columns and interned ids: Python touches only distinct values (tracks,
names, attribute runs) and transfers that report bytes.
"""
from __future__ import annotations

from operator import ne
from typing import TYPE_CHECKING, Any, Iterator

import numpy as np

from ...timeline.batch import SpanBatch
from ...timeline.spans import TRANSFER
from ...timeline.arrays import unique, values
from .wire import TE_COUNTER, uv

from .columns import C_G, C_K1, C_K2, C_K3, C_PRE, C_TRACK, C_TS, C_EXTRA, K2_COUNTER, NCOLS
from . import encoder
from .order import Arrivals, HoldBack, leaf_mask

if TYPE_CHECKING:
    from .tracks import Tracks


def batch_rows(batch: SpanBatch, tracks: Tracks, hold: HoldBack,
               head: list[bytes]) -> tuple[np.ndarray, list[bytes], Arrivals]:
    """The rows of a batch, the byte strings their C_EXTRA refers to, and (ids, groups) of the spans that
    may be parents, for ``HoldBack.hold_back``. Descriptors of new tracks go to ``head``."""
    n = batch.n
    tables = batch.tables
    ids, par = batch.id, batch.parent
    thr = batch.thread.astype(np.int64)
    dv = np.flatnonzero(batch.track)
    m = len(dv)
    dtr = batch.track[dv].astype(np.int64)
    tracks.open(values(thr).tolist() + values(dtr).tolist(), head)
    group, md, arrivals = hold.groups(leaf_mask(batch), ids, par)
    flows = (batch.track != 0) & ~batch.is_region()
    extras, xid = _extras(batch, thr, tracks)
    hpre = tracks.prefix_ids(tables, thr, batch.cat, batch.name, batch.site)
    dpre = tracks.prefix_ids(tables, dtr, batch.cat[dv], batch.name[dv])
    if isinstance(xid, int):
        xid = np.full(n, xid, np.int64)
    rows = hold.new_rows(2 * n + 2 * m)
    encoder.fill_rows(rows, thr, batch.host_begin, batch.host_end, ids, md, group, hpre, flows.view(np.uint8), par,
                      xid, dv, dtr, batch.dev_start, batch.dev_end, dpre, batch.raw_start, batch.raw_end)
    counters = _counter_rows(batch, group, md, tracks, head, extras)
    if counters is not None:
        mine = 2 * n + 2 * m
        rows = np.concatenate([rows[:, :mine], counters, rows[:, mine:]], axis=1)
    return rows, extras, arrivals


def _extras(batch: SpanBatch, thr: np.ndarray, tracks: Tracks) -> tuple[list[bytes], np.ndarray | int]:
    """Annotation bytes for status, error, attributes and a call site's callers, and each row's index
    into them (-1: none). (The call site itself is in the row's name template: see ``Tracks.prefix_ids``.)

    Launches repeat their attributes (one dict per launcher): runs of equal ones on a thread are found
    with numpy, and each distinct (thread, attributes object, status, error, site) among the runs is
    encoded once, in the order it first occurs.
    """
    n = batch.n
    attrs = batch.attrs
    bad = batch.status.astype(bool)
    ids = batch.attrs_ids()
    moved = ids[1:] != ids[:-1]  # another attrs object than the row before (runs: one per launcher)
    starts = np.flatnonzero(moved) + 1
    plain = not len(starts) and attrs[0] is None if n else True
    if plain:
        need = bad
    else:  # truth of each run's attrs, repeated over the run
        firsts = [0, *starts.tolist()]
        truth = np.fromiter(map(bool, map(attrs.__getitem__, firsts)), bool, len(firsts))
        need = np.repeat(truth, np.diff([*firsts, n])) | bad
    site = batch.site
    values = batch.tables.sites.values
    deep = None
    if values and any(v.callers for v in values):  # stack_depth > 1: the callers are an annotation
        has = np.fromiter((bool(v.callers) for v in values), bool, len(values))
        deep = np.where(site >= 0, has[site], False)
        need = need | deep
    if not need.any():
        return [], -1
    changed = np.ones(n, bool)
    if n > 1:
        changed[1:] = (thr[1:] != thr[:-1]) | (bad[1:] != bad[:-1])
        if not plain:
            changed[1:] |= _differs_at(attrs, starts - 1, n - 1)
        if batch.errors:
            changed[1:] |= _differs(batch.error_list())
        if deep is not None:
            changed[1:] |= site[1:] != site[:-1]
    new = need & changed
    heads = np.flatnonzero(new)
    errors = batch.errors
    inv, firsts = _distinct(heads, ids, thr, bad, errors, site if deep is not None else None, len(values))
    seqs = tracks.seqs
    extras = [seqs[t].extra(attrs[i], b, errors.get(i),
                            values[s].stacktrace() if deep is not None and deep[i] else None)
              for i, t, b, s in zip(firsts.tolist(), thr[firsts].tolist(), bad[firsts].tolist(),
                                    site[firsts].tolist())]
    return extras, np.where(need, inv[np.cumsum(new) - 1], -1)


def _distinct(heads: np.ndarray, ids: np.ndarray, thr: np.ndarray, bad: np.ndarray, errors: dict[int, str],
              site: np.ndarray | None, nsites: int) -> tuple[np.ndarray, np.ndarray]:
    """For rows ``heads``: the index of each one's distinct (thread, attributes object (``ids``: each
    row's), failed, error, site), numbered in the order they first occur, and the first row of each."""
    h = len(heads)
    _, _, key = unique(ids[heads])
    key = key.astype(np.int64)
    bound = h
    parts = [(bad[heads].astype(np.int64), 2), (thr[heads], int(thr[heads].max()) + 1)]
    if errors:
        with_error = np.isin(heads, np.fromiter(errors, np.int64, len(errors)))
        parts.append((np.where(with_error, np.cumsum(with_error), 0), h + 1))
    if site is not None:
        parts.append((site[heads] + 1, nsites + 1))
    for col, size in parts:
        bound *= size
        key = key * size + col
    if bound >= 1 << 62:  # too many combinations for one int64 key: one per run
        key = np.arange(h)
    _, first, inv = unique(key)
    rank = np.empty(len(first), np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(len(first))
    return rank[inv], heads[np.sort(first)]


def transfer_samples(batch: SpanBatch, tracks: Tracks, head: list[bytes],
                     extras: list[bytes]) -> Iterator[tuple[int, int, int, Any, int]]:
    """The cumulative bytes-transferred samples, at the end of each transfer that says its size: (span
    row, track, time, counter sequence, extras index), each sample's counter value appended to ``extras``."""
    tid = batch.tables.cats.ids.get(TRANSFER)
    if tid is None:
        return
    for i in np.flatnonzero(batch.cat == tid).tolist():
        a = batch.attrs[i]
        nbytes = a.get("bytes") if a else None
        if not isinstance(nbytes, int) or isinstance(nbytes, bool):
            continue
        dt = int(batch.track[i])
        track = dt if dt else int(batch.thread[i])
        seq = tracks.counter(track, head)
        seq.moved += nbytes
        yield i, track, int(batch.dev_end[i]) if dt else int(batch.host_end[i]), seq, len(extras)
        extras.append(TE_COUNTER + uv(seq.moved))


def _counter_rows(batch: SpanBatch, group: np.ndarray, md: np.ndarray, tracks: Tracks, head: list[bytes],
                  extras: list[bytes]) -> np.ndarray | None:
    """Cumulative bytes-transferred samples as packet rows."""
    out = []
    for i, track, ts, seq, extra in transfer_samples(batch, tracks, head, extras):
        row = np.zeros(NCOLS, np.int64)
        row[[C_TRACK, C_TS, C_K1, C_K2, C_K3, C_G]] = (track, ts, md[i], K2_COUNTER, -int(batch.id[i]), group[i])
        row[C_PRE] = seq.counter_prefix
        row[C_EXTRA] = extra
        out.append(row)
    return np.ascontiguousarray(np.array(out).T) if out else None


def _differs_at(values: list[Any], at: np.ndarray, n: int) -> np.ndarray:
    """``_differs(values)`` where only the pairs (at, at + 1) may differ (the others hold one object:
    equal, as an object equals itself in a dict's comparison)."""
    out = np.zeros(n, bool)
    if len(at):
        try:
            out[at] = list(map(ne, map(values.__getitem__, (at + 1).tolist()), map(values.__getitem__, at.tolist())))
        except (TypeError, ValueError):
            out[:] = True
    return out


def _differs(values: list[Any]) -> np.ndarray:
    """values[i + 1] != values[i], for each i (all True where values do not compare, e.g. arrays)."""
    try:
        return np.array(list(map(ne, values[1:], values[:-1])), bool)
    except (TypeError, ValueError):
        return np.ones(len(values) - 1, bool)
