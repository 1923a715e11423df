"""A batch's packets in one C pass (``cltrace._ext.writer``): the SpanBatch's columns to bytes, no packet rows in numpy.

``writer.Writer`` keeps what ``order.HoldBack`` and the sequences keep between writes (held rows, the
parents seen and still to come, each track's clock and device offset, the name templates in the pool), and
does groups, hold-back, order and encoding with the GIL released. Python does what touches Python objects,
for a batch's few new values only: the tracks to open, the annotation bytes of each distinct (thread,
attributes, failure, site, error), the name templates not in the pool yet, and the bytes-transferred
counters; then each written track's sequence header and newly interned names go before its packets.
The bytes are those of ``rows`` + ``order`` + ``packets`` (numpy), which run where the C extension is not built.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ...timeline.batch import SpanBatch, Tables
from .order import _LEAF_CATS
from .rows import transfer_samples
from .tracks import STANDARD_ANNS, Tracks
from .wire import P_INTERNED, P_SEQ, frame, uv

_NO_COUNTERS = np.zeros((0, 5), np.int64)


class FusedWriter:
    """Writes batches on ``tracks`` through a ``writer.Writer`` (``native``: ``cltrace._ext.writer``)."""

    def __init__(self, native: Any, tracks: Tracks) -> None:
        self._w = native.Writer()
        self._tracks = tracks
        self._cats: tuple[Any, int, np.ndarray, np.ndarray] = (None, -1, _NO_COUNTERS, _NO_COUNTERS)
        self._sites: tuple[int, bytes | None] = (0, None)

    def write(self, batch: SpanBatch, head: list[bytes]) -> tuple[list[bytes], int]:
        """The batch's packets (what may go out now), and how many; descriptors of new tracks go to ``head``."""
        tracks, tables = self._tracks, batch.tables
        leaf, region = self._luts(tables)
        deep = self._deep(tables)
        errors = batch.errors
        thread, track, cat = _c(batch.thread), _c(batch.track), _c(batch.cat, np.int16)
        firsts, new, hmiss, dmiss = self._w.prepare(batch.attrs, thread, _c(batch.status, np.int8),
                                                    _c(batch.site, np.int32), cat, _c(batch.name, np.int32), track,
                                                    deep, batch.error_list() if errors else None)
        if new:
            tracks.open(new, head)
            for t in new:
                seq = tracks.seqs[t]
                self._w.track(t, seq.tail, *(seq.anns[a] for a in STANDARD_ANNS))
        extras: list[bytes] = []
        if firsts:
            seqs, attrs, values = tracks.seqs, batch.attrs, tables.sites.values
            thr, bad, site = (c[firsts].tolist() for c in (batch.thread, batch.status, batch.site))
            for i, t, b, s in zip(firsts, thr, bad, site):
                stack = values[s].stacktrace() if deep is not None and s >= 0 and deep[s] else None
                extras.append(seqs[t].extra(attrs[i], bool(b), errors.get(i), stack))
        hp = np.array([tracks.prefix(tables, k, s) for k, s in hmiss], np.int64)
        dp = np.array([tracks.prefix(tables, k, s) for k, s in dmiss], np.int64)
        counters = _counters(batch, tracks, head, extras)
        pool, pool_off, pool_len = tracks.pool.arrays()
        out = self._w.write(id=_c(batch.id), parent=_c(batch.parent), cat=cat, thread=thread,
                            host_begin=_c(batch.host_begin), host_end=_c(batch.host_end), track=track,
                            dev_start=_c(batch.dev_start), dev_end=_c(batch.dev_end), raw_start=_c(batch.raw_start),
                            raw_end=_c(batch.raw_end), leaf=leaf, region=region, hpids=hp, dpids=dp, extras=extras,
                            counters=counters, pool=pool, pool_off=pool_off, pool_len=pool_len, consts=tracks.consts,
                            mono=tracks.mono)
        return self._framed(*out)

    def drain(self) -> tuple[list[bytes], int]:
        """Every held row's packet (at close)."""
        return self._framed(*self._w.drain(*self._tracks.pool.arrays(), self._tracks.consts, self._tracks.mono))

    def _framed(self, data: bytes, runs: list[int], opened: dict[int, int], rows: int) -> tuple[list[bytes], int]:
        """Each written track's sequence header (its first packet) and pending interned data, then the packets."""
        tracks = self._tracks
        out = []
        for t in runs:
            seq = tracks.seqs[t]
            first = opened.get(t)
            if first is not None:
                out.append(tracks.header(seq, first))
                seq.last = first
            if seq.pending:
                out.append(frame(P_SEQ + uv(seq.id) + P_INTERNED + uv(len(seq.pending)) + bytes(seq.pending)))
                seq.pending.clear()
        packets = rows + len(out)
        out.append(data)
        return out, packets

    def _luts(self, tables: Tables) -> tuple[np.ndarray, np.ndarray]:
        """By category id: leaves (never a parent, ``order.leaf_mask``) and regions (no flow)."""
        leaf_ids = [tables.cats.id(c) for c in _LEAF_CATS]
        known, n, leaf, region = self._cats
        if known is not tables or n != len(tables.cats.values):
            n = len(tables.cats.values)
            leaf = np.zeros(n + 1, np.uint8)
            leaf[leaf_ids] = 1
            region = np.zeros(n + 1, np.uint8)
            region[list(tables.region_cats)] = 1
            self._cats = (tables, n, leaf, region)
        return leaf, region

    def _deep(self, tables: Tables) -> bytes | None:
        """By site id: whether the site has callers (``stack_depth`` > 1), None where none has."""
        values = tables.sites.values
        n, lut = self._sites
        if n != len(values):
            lut = bytes(bool(v.callers) for v in values) if any(v.callers for v in values) else None
            self._sites = (len(values), lut)
        return lut


def _c(col: np.ndarray, dtype: Any = np.int64) -> np.ndarray:
    """A column as the C pass reads it: contiguous, of its batch dtype (the column itself where it is)."""
    return np.ascontiguousarray(col, dtype)


def _counters(batch: SpanBatch, tracks: Tracks, head: list[bytes], extras: list[bytes]) -> np.ndarray:
    """The cumulative bytes-transferred samples as (span row, track, time, template id, extras index)
    rows (``rows.transfer_samples``)."""
    out = [(i, track, ts, seq.counter_prefix, extra)
           for i, track, ts, seq, extra in transfer_samples(batch, tracks, head, extras)]
    return np.array(out, np.int64) if out else _NO_COUNTERS
