"""Writing events in an order that keeps slices nested, across batches.

Trace processor sorts packets by timestamp and breaks ties by file position, so events at equal
timestamps must be written in nesting order. cltrace assigns span ids in pre-order on each thread,
so within a write BEGIN(Y) sorts as (ts, id(Y)) and END(X) as (ts, last descendant id of X, 1,
-id(X)). Across writes two things are held back so that late events can still go first: (1) a
parent arrives after its children, so for each parent still to come the events at the earliest
timestamp of its known subtree (which its BEGIN may tie with) wait for it; (2) a span on a device
queue may arrive one write after the next command (it was still running when that one's status
was read), so each track's events at its latest timestamp wait for the next write. Host times are
distinct clock reads, so they do not tie across writes. Held events reach the file with the write
that releases them, or at close.
"""
from __future__ import annotations

import collections

import numpy as np

from ...timeline.batch import SpanBatch
from ...timeline.spans import FILL, KERNEL, MARKER, TRANSFER
from ...timeline.arrays import member, unique, values
from .columns import C_EXTRA, C_G, C_K1, C_K2, C_K3, C_TRACK, C_TS, NCOLS

# Spans that never have children, so never a parent that events wait for.
_LEAF_CATS = (KERNEL, TRANSFER, MARKER, FILL)
Arrivals = tuple[np.ndarray, np.ndarray]  # ids of the spans that may be parents, and the group each waits for
_ARRIVED_WINDOW = 1 << 16
_MAX_HELD_GROUPS = 4096

Stashed = tuple[np.ndarray, list["bytes | None"]]  # rows kept for a later write, with their extras


def leaf_mask(batch: SpanBatch) -> np.ndarray:
    """Rows whose category never has children."""
    cats = batch.tables.cats
    return batch.cat_mask([cats.id(c) for c in _LEAF_CATS])


class Scratch:
    """A reused buffer for one write's rows. A fresh array of a batch's rows (~2 MB for 4096 spans)
    costs a page fault per 4 kB on first touch, as the allocator hands such blocks back to the OS:
    measured ~0.7 ms a write, a third of the .pftrace writer's time. The rows live until the write's
    packets are encoded; whatever is kept longer is copied (``_stash``)."""

    __slots__ = ("_buf",)

    def __init__(self) -> None:
        self._buf = np.empty(0, np.int64)

    def rows(self, m: int, zero: bool = True) -> np.ndarray:
        """int64[NCOLS, m], C-contiguous, zeroed unless ``zero`` is False."""
        need = NCOLS * m
        if len(self._buf) < need:
            self._buf = np.empty(need + need // 4, np.int64)
        out = self._buf[:need].reshape(NCOLS, m)
        if zero:
            out.fill(0)
        return out


class HoldBack:
    """The rows waiting for a parent or for the next write, and what is known of parents to come."""

    def __init__(self) -> None:
        self._scratch = Scratch()  # the batch's rows (``rows.batch_rows``), and room for the tail
        self._joined = Scratch()  # the rows with those brought back
        self._room = 0  # columns at the end of the last ``new_rows`` kept for the tail
        self._pend_md: dict[int, int] = {}  # parent still to come -> last descendant id seen
        self._held: dict[int, dict[int, Stashed]] = {}  # parent -> track -> rows
        self._tail: Stashed | None = None  # each track's latest-timestamp rows
        self._arrived: set[int] = set()
        self._arrived_order: collections.deque[int] = collections.deque()

    def new_rows(self, m: int) -> np.ndarray:
        """Rows for a write's m packets (not zeroed: ``encoder.fill_rows`` writes every column), and at the end room for the rows held from the last
        write (``hold_back`` puts them there: no copy of the whole batch to append them)."""
        self._room = 0 if self._tail is None else self._tail[0].shape[1]
        return self._scratch.rows(m + self._room, zero=False)

    def groups(self, leaf: np.ndarray, ids: np.ndarray, par: np.ndarray) -> tuple[np.ndarray, np.ndarray, Arrivals]:
        """Per span: the parent still to come that its events wait for (0: none) and its last descendant id.

        Also the ids and groups of the spans that may be parents (not ``leaf``).
        """
        n = len(ids)
        order = np.argsort(ids, kind="stable")
        sorted_ids = ids[order]
        at = np.minimum(np.searchsorted(sorted_ids, par), n - 1)
        inside = (sorted_ids[at] == par) & (par != 0)
        up = np.where(inside, order[at], np.arange(n))  # in-batch parent, or self
        arrived = self._arrived
        outside, _, inverse = unique(np.where(inside, 0, par))
        waits = np.array([p if p and p not in arrived else 0 for p in outside.tolist()], np.int64)
        top = up
        for _ in range(64):  # topmost in-batch ancestor, by pointer doubling
            nxt = top[top]
            if np.array_equal(nxt, top):
                break
            top = nxt
        else:
            raise ValueError("spans whose parents form a cycle")
        group = waits[inverse][top]
        md = ids.copy()
        pend = self._pend_md
        parents = np.flatnonzero(~leaf)
        arrivals = (ids[parents], group[parents])
        if pend:  # parents seen before as still to come (few): their descendants' last ids
            known = np.flatnonzero(member(arrivals[0], np.fromiter(pend, np.int64, len(pend))))
            for i, sid in zip(parents[known].tolist(), arrivals[0][known].tolist()):
                m = pend.pop(sid, 0)
                if m > md[i]:
                    md[i] = m
        if inside.any():
            child, parent = np.nonzero(inside)[0], up[inside]
            while True:  # each pass carries last-descendant ids one level up (ids only grow: it ends)
                before = md[parent].copy()
                np.maximum.at(md, parent, md[child])
                if np.array_equal(before, md[parent]):
                    break
        waiting = ~inside & (waits[inverse] != 0)
        if waiting.any():
            ps, _, pinv = unique(par[waiting])
            best = np.zeros(len(ps), np.int64)
            np.maximum.at(best, pinv, md[waiting])
            for p, v in zip(ps.tolist(), best.tolist()):
                if pend.get(p, 0) < v:
                    pend[p] = v
        return group, md, arrivals

    def hold_back(self, rows: np.ndarray, extras: list[bytes], arrivals: Arrivals) -> tuple[np.ndarray, np.ndarray]:
        """Rows, with the indices of those to write now; stashes the rest and brings back earlier
        stashed rows. ``extras`` may grow."""
        held = self._held
        parts = [rows]
        if self._tail is not None:
            k = self._tail[0].shape[1]
            if k and self._room == k and rows.shape[1] >= k:  # the room new_rows left for it
                _readd(*self._tail, extras, out=rows[:, rows.shape[1] - k:])
            else:
                parts.append(_readd(*self._tail, extras))
            self._tail = None
        self._room = 0
        sids = arrivals[0].tolist()
        if held:  # the arriving parents that rows wait for (few of the arrivals)
            back = np.flatnonzero(member(arrivals[0], np.fromiter(held, np.int64, len(held))))
            for sid, g in zip(arrivals[0][back].tolist(), arrivals[1][back].tolist()):
                mine = held.pop(sid, None)
                if mine:
                    for r, x in mine.values():
                        r = _readd(r, x, extras)
                        r[C_G] = g
                        parts.append(r)
        self._arrived.update(sids)
        self._arrived_order.extend(sids)
        while len(self._arrived_order) > _ARRIVED_WINDOW:
            self._arrived.discard(self._arrived_order.popleft())
        if held:
            for g in values(rows[C_G]).tolist():
                mine = held.pop(g, None) if g else None
                if mine:
                    parts.extend(_readd(r, x, extras) for r, x in mine.values())
        if len(parts) > 1:
            rows = np.concatenate(parts, axis=1, out=self._joined.rows(sum(p.shape[1] for p in parts), zero=False))
        now = np.ones(rows.shape[1], bool)
        waiting = np.flatnonzero(rows[C_G])
        if len(waiting):
            w = np.take(rows[[C_TRACK, C_G, C_TS]], waiting, axis=1).T
            o = np.lexsort((w[:, 2], w[:, 1], w[:, 0]))
            w, waiting = w[o], waiting[o]
            start = np.ones(len(w), bool)
            start[1:] = (w[1:, 0] != w[:-1, 0]) | (w[1:, 1] != w[:-1, 1])
            first = w[np.maximum.accumulate(np.where(start, np.arange(len(w)), 0)), 2]
            keep = waiting[w[:, 2] == first]
            now[keep] = False
            kept = np.take(rows, keep, axis=1)
            for (track, g), lo, hi in runs(kept[[C_TRACK, C_G]].T):
                held.setdefault(g, {})[track] = _stash(kept[:, lo:hi], extras)
            if len(held) > _MAX_HELD_GROUPS:  # parents that never come: write their oldest rows
                late = []
                while len(held) > _MAX_HELD_GROUPS:
                    g = next(iter(held))
                    self._pend_md.pop(g, None)
                    late.extend(_readd(r, x, extras) for r, x in held.pop(g).values())
                rows = np.concatenate([rows, *late], axis=1)
                now = np.concatenate([now, np.ones(rows.shape[1] - len(now), bool)])
        sel = np.flatnonzero(now)
        if len(sel):
            everything = len(sel) == len(now)
            track = rows[C_TRACK] if everything else rows[C_TRACK, sel]
            ts = rows[C_TS] if everything else rows[C_TS, sel]
            latest = np.full(int(track.max()) + 1, np.iinfo(np.int64).min)
            np.maximum.at(latest, track, ts)
            edge = ts == latest[track]
            tail = np.take(rows, sel[edge], axis=1)
            tail[C_G] = 0
            self._tail = _stash(tail, extras)
            sel = sel[~edge]
        return rows, sel

    def drain(self) -> tuple[np.ndarray, list[bytes]] | None:
        """Every held row (at close), with its extras; None when nothing is held."""
        parts = [(r, x) for per_track in self._held.values() for r, x in per_track.values()]
        if self._tail is not None:
            parts.append(self._tail)
            self._tail = None
        self._held.clear()
        self._pend_md.clear()
        if not parts:
            return None
        extras: list[bytes] = []
        return np.concatenate([_readd(r, x, extras) for r, x in parts], axis=1), extras


def _stash(r: np.ndarray, extras: list[bytes]) -> Stashed:
    """Rows kept for a later write, with their extras (the batch's extras list goes away)."""
    return r, [extras[i] if i >= 0 else None for i in r[C_EXTRA].tolist()]


def _readd(r: np.ndarray, x: list[bytes | None], extras: list[bytes], out: np.ndarray | None = None) -> np.ndarray:
    """Stashed rows back into a batch whose extras list is ``extras`` (copied, or into ``out``)."""
    if out is None:
        r = r.copy()
    else:
        out[...] = r
        r = out
    for j, b in enumerate(x):
        if b is not None:
            r[C_EXTRA, j] = len(extras)
            extras.append(b)
    return r


def order(rows: np.ndarray, select: np.ndarray) -> np.ndarray:
    """Order of the rows at ``select`` for writing: by track and time, rows tied on both by the nesting
    keys. Only the key columns are gathered."""
    ts = rows[C_TS, select]
    rank = rows[C_TRACK, select]  # track ids: small and non-negative
    rel = ts - ts.min()
    if int(rel.max()) < (1 << 40) and int(rank.max()) < (1 << 22):
        key = (rank << 40) | rel
        o = np.argsort(key, kind="stable")
        key = key[o]
        tied = key[1:] == key[:-1]
    else:  # a held row from long ago: sort on two keys
        o = np.lexsort((ts, rank))
        tied = (ts[o][1:] == ts[o][:-1]) & (rank[o][1:] == rank[o][:-1])
    if tied.any():
        in_tie = np.zeros(len(o), bool)
        in_tie[1:] |= tied
        in_tie[:-1] |= tied
        pos = np.flatnonzero(in_tie)
        run = np.cumsum(np.concatenate(([True], ~tied)))[pos]
        r = select[o[pos]]
        o[pos] = o[pos][np.lexsort((rows[C_K3, r], rows[C_K2, r], rows[C_K1, r], run))]
    return o


def runs(keys: np.ndarray) -> list[tuple[tuple[int, ...], int, int]]:
    """(key, lo, hi) of each run of equal rows in a sorted 2-D key array."""
    n = len(keys)
    if not n:
        return []
    cut = np.nonzero((keys[1:] != keys[:-1]).any(axis=1))[0] + 1
    bounds = [0, *cut.tolist(), n]
    return [(tuple(keys[lo].tolist()), lo, hi) for lo, hi in zip(bounds[:-1], bounds[1:])]
