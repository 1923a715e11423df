"""Packet rows to bytes with numpy: the last step of the .pftrace writer's Python reference.

A batch's packets are rows (one per packet) of protobuf fields: varints and byte strings from a
pool (row constants, sequence fields, name and category iids, annotation headers) or from the
batch's extras. Each field is one vectorized pass over the rows that have it, so Python does no
per-packet work here. With ``rows``, ``order`` and ``packets`` it writes the bytes the C pass
(``cltrace._ext.writer``) writes, byte for byte; ``encoder`` picks one of the two.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ...timeline.arrays import sorted_distinct as distinct
from .columns import (C_EXTRA, C_FLOW, C_G, C_K1, C_K2, C_K3, C_PARENT, C_PRE, C_RAW, C_RAWE, C_RAWEND, C_RAWS,
                      C_SID, C_SPANANN, C_TRACK, C_TS, FLOW_IN, FLOW_OUT, K2_END)

# Columns of a run (one track's rows in a write).
R_LO, R_HI, R_TAIL, R_HDR, R_LAST, R_OFFSET, R_HAS_OFFSET = 0, 1, 2, 3, 7, 8, 9
RUN_COLS = 10
K_PACKET, K_TS, K_ABS, K_TYPE, K_FLOW = 0, 1, 2, 3, 6  # row constants (wire.ROW_CONSTANTS) by position
NCONSTS = 8
Strings = tuple[np.ndarray, np.ndarray, np.ndarray]  # one uint8 buffer, int64 offsets, int64 lengths

_U64 = np.uint64
_VLEN_EDGES = np.array([1 << (7 * k) for k in range(1, 10)], dtype=_U64)


def vlen(u: np.ndarray) -> np.ndarray:
    """Varint byte counts of uint64 values."""
    if len(u) < 1024:
        return np.searchsorted(_VLEN_EDGES, u, side="right") + 1
    n = np.ones(len(u), np.int64)
    for edge in _VLEN_EDGES:
        more = u >= edge
        if not more.any():
            break
        n += more
    return n


class Pool:
    """Byte strings that packet rows refer to by index."""

    def __init__(self, items: list[bytes] | None = None) -> None:
        self.items: list[bytes] = [] if items is None else items
        self._arrays: Strings | None = None

    def add(self, b: bytes) -> int:
        self.items.append(b)
        self._arrays = None
        return len(self.items) - 1

    def arrays(self) -> Strings:
        """The pool as one buffer, with each item's offset and length (rebuilt only after an ``add``)."""
        if self._arrays is None:
            self._arrays = strings(self.items)
        return self._arrays


class Layout:
    """Rows of protobuf fields, laid out column by column (``rows``: an index array of the rows that
    have the field, or None for all rows)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.fields: list[list[Any]] = []

    def _add(self, kind: str, rows: np.ndarray | None, data: Any, extra: Any, ln: np.ndarray) -> np.ndarray:
        self.fields.append([kind, rows, data, extra, ln])
        return ln

    def const(self, data: bytes, rows: np.ndarray | None = None) -> np.ndarray:
        ln = np.full(self.n if rows is None else len(rows), len(data), np.int64)
        return self._add("c", rows, np.frombuffer(data, np.uint8), None, ln)

    def fixed(self, rec: np.ndarray, rows: np.ndarray | None = None) -> np.ndarray:
        """Per-row bytes of one width: ``rec`` has shape (rows, width)."""
        return self._add("f", rows, rec, None, np.full(len(rec), rec.shape[1], np.int64))

    def varint(self, values: np.ndarray, rows: np.ndarray | None = None) -> np.ndarray:
        u = values.view(_U64)
        return self._add("v", rows, u, None, vlen(u))

    def length(self) -> int:
        """A varint over all rows whose values are given later with ``set_length``."""
        self._add("v", None, None, None, np.zeros(self.n, np.int64))
        return len(self.fields) - 1

    def set_length(self, at: int, values: np.ndarray) -> np.ndarray:
        u = values.view(_U64)
        self.fields[at][2] = u
        self.fields[at][4] = ln = vlen(u)
        return ln

    def pooled(self, ids: np.ndarray, pool: Strings, rows: np.ndarray | None = None) -> np.ndarray:
        buf, off, lens = pool
        return self._add("p", rows, ids, (buf, off), lens[ids])

    def annotation(self, headers: np.ndarray, values: np.ndarray, pool: Strings, rows: np.ndarray) -> None:
        """An int debug annotation: the pooled header for the value's varint length, then the varint.

        ``headers`` are pool ids of each row's header for a one-byte value; the next nine ids hold the
        headers for longer values.
        """
        u = values.view(_U64)
        ln = vlen(u)
        self.pooled(headers + ln - 1, pool, rows)
        self._add("v", rows, u, None, ln)

    def total(self, first: int = 0) -> np.ndarray:
        """Bytes per row of the fields from index ``first`` on."""
        total = np.zeros(self.n, np.int64)
        for _, rows, _, _, ln in self.fields[first:]:
            if rows is None:
                total += ln
            else:
                total[rows] += ln
        return total

    def bytes(self) -> bytes:
        total = self.total()
        end = np.cumsum(total)
        out = np.empty(int(end[-1]) if self.n else 0, np.uint8)
        pos = end - total
        for kind, rows, data, extra, ln in self.fields:
            if rows is None:
                p = pos
            elif len(rows):
                p = pos[rows]
            else:
                continue
            if kind == "v":
                _put_varints(out, p, data, ln)
            elif kind == "p":
                buf, off = extra
                _put_ragged(out, p, buf, off[data], ln)
            else:
                w = data.shape[-1]
                if w == 1:
                    out[p] = data[..., 0] if data.ndim == 2 else data[0]
                else:
                    out[p[:, None] + np.arange(w)] = data
            if rows is None:
                pos += ln
            else:
                pos[rows] += ln
        return out.tobytes()


def _put_varints(out: np.ndarray, pos: np.ndarray, u: np.ndarray, ln: np.ndarray) -> None:
    """Writes each value's varint at its position: per distinct length (a column has few), one pass
    per byte, so a column of short deltas with one long absolute timestamp costs its bytes, not
    rows x the longest."""
    lo, hi = int(ln.min()), int(ln.max())
    for width in range(lo, hi + 1):
        if lo == hi:
            p, v = pos, u
        else:
            m = ln == width
            if not m.any():
                continue
            p, v = pos[m], u[m]
        for k in range(width - 1):
            out[p + k] = (v & _U64(0x7F)).astype(np.uint8) | np.uint8(0x80)
            v = v >> _U64(7)
        out[p + width - 1] = v.astype(np.uint8)


def _put_ragged(out: np.ndarray, dst: np.ndarray, buf: np.ndarray, src: np.ndarray, ln: np.ndarray) -> None:
    """Copies buf[src[i]:src[i]+ln[i]] to out[dst[i]:], one pass per distinct length (there are few);
    a string every row shares is broadcast, not gathered."""
    if not len(ln):
        return
    lo, hi = int(ln.min()), int(ln.max())
    for width in range(lo, hi + 1) if hi - lo < 16 else distinct(ln).tolist():
        if lo == hi:
            d, s_ = dst, src
        else:
            m = ln == width
            if not m.any():
                continue
            d, s_ = dst[m], src[m]
        if not width:
            continue
        first = int(s_[0])
        step = np.arange(width)
        if (s_ == first).all():
            out[d[:, None] + step] = buf[first:first + width]
        else:
            out[d[:, None] + step] = buf[s_[:, None] + step]


def strings(items: list[bytes]) -> Strings:
    """Byte strings as one buffer with each one's offset and length (the C writer takes this form too)."""
    lens = np.fromiter(map(len, items), np.int64, len(items))
    return np.frombuffer(b"".join(items) or b"\x00", np.uint8), np.cumsum(lens) - lens, lens


def encode_rows(rows: np.ndarray, perm: np.ndarray, runs: np.ndarray, mono: int, consts: np.ndarray, pool: Strings,
                extras: Strings) -> bytes:
    """Packets of ``rows[:, perm]``, one Trace.packet a row.

    ``rows``: int64[NCOLS, M], packet rows column by column (``columns``); ``perm``: int64[N], the rows to
    write in file order (sorted by track and time); ``runs``: int64[R, RUN_COLS], one per track's run of
    rows: lo, hi, pool ids of the sequence's fields and of its four annotation headers (span, parent,
    device.start, device.end; each for a 1-byte value, the next nine for longer ones), then the sequence's
    state, read and written back in place: last timestamp, last device offset, whether it has one;
    ``mono``: MONOTONIC - host clock, added to the timestamps written as absolute; ``consts``: int64[8],
    pool ids of the row constants (``wire.ROW_CONSTANTS``); ``pool``/``extras``: byte strings by id.

    Per row: the timestamp is a delta on the sequence's incremental clock, or absolute MONOTONIC where
    time goes back (the clock keeps its value); "device.start" is written where the raw - mapped offset
    differs from the last one written on the sequence.
    """
    n = len(perm)
    if not n:
        return b""
    rows = np.take(rows, perm, axis=1)
    ts = rows[C_TS]
    prev = np.empty(n, np.int64)
    tails = np.empty(n, np.int64)
    hdrs = np.empty((4, n), np.int64)
    dev_start = np.zeros(n, bool)
    for r, (lo, hi, tail, h0, h1, h2, h3, last, offset, has) in enumerate(runs.tolist()):
        prev[lo] = last
        prev[lo + 1:hi] = np.maximum(ts[lo:hi - 1], last)  # rows are sorted by time per track
        runs[r, R_LAST] = max(last, int(ts[hi - 1]))
        tails[lo:hi] = tail
        hdrs[:, lo:hi] = np.array([h0, h1, h2, h3])[:, None]
        raw = lo + np.flatnonzero(rows[C_RAW, lo:hi])
        if len(raw):
            offs = rows[C_RAWS, raw] - ts[raw]
            changed = np.empty(len(raw), bool)
            changed[0] = not has or offs[0] != offset
            changed[1:] = offs[1:] != offs[:-1]
            dev_start[raw[changed]] = True
            runs[r, R_OFFSET] = offs[-1]
            runs[r, R_HAS_OFFSET] = 1
    absolute = np.flatnonzero(ts < prev)
    tsv = ts - prev
    tsv[absolute] = ts[absolute] + mono
    c = consts.tolist()

    lay = Layout(n)
    lay.pooled(np.full(n, c[K_PACKET]), pool)
    body_at = lay.length()
    lay.pooled(np.full(n, c[K_TS]), pool)
    lay.varint(tsv)
    lay.pooled(np.full(len(absolute), c[K_ABS]), pool, absolute)
    lay.pooled(tails, pool)
    te_at = lay.length()
    lay.pooled(consts[K_TYPE + rows[C_K2]], pool)
    named = np.flatnonzero(rows[C_PRE] >= 0)
    lay.pooled(rows[C_PRE, named], pool, named)
    flowing = np.flatnonzero(rows[C_FLOW])
    if len(flowing):
        lay.pooled(consts[K_FLOW - 1 + rows[C_FLOW, flowing]], pool, flowing)
        lay.varint(rows[C_SID, flowing], flowing)
    for k, (col, has_col) in enumerate(((C_SID, rows[C_SPANANN] != 0), (C_PARENT, rows[C_PARENT] != 0),
                                        (C_RAWS, dev_start), (C_RAWE, rows[C_RAWEND] != 0))):
        sel = np.flatnonzero(has_col)
        if len(sel):
            lay.annotation(hdrs[k, sel], rows[col, sel], pool, sel)
    extra = np.flatnonzero(rows[C_EXTRA] >= 0)
    if len(extra):
        lay.pooled(rows[C_EXTRA, extra], extras, extra)
    lay.set_length(te_at, lay.total(te_at + 1))
    lay.set_length(body_at, lay.total(body_at + 1))
    return lay.bytes()


def fill_rows(rows: np.ndarray, thr: np.ndarray, hb: np.ndarray, he: np.ndarray, ids: np.ndarray, md: np.ndarray,
              group: np.ndarray, hpre: np.ndarray, flows: np.ndarray, par: np.ndarray, xid: np.ndarray, dv: np.ndarray,
              dtr: np.ndarray, ds: np.ndarray, de: np.ndarray, dpre: np.ndarray, raws: np.ndarray,
              rawe: np.ndarray) -> None:
    """A batch's packet rows into ``rows`` (int64[NCOLS, >= 2n + 2m]), every column written: per span its host
    thread track, begin, end, id, md, group, host prefix id, whether it has a flow, parent and extra id;
    per device span (``dv``: their rows among the spans) its track, start, end, prefix id and raw stamps.

    Per span a host BEGIN/END pair; per device span (``dv``) a device pair after them. BEGIN(Y) sorts as
    (ts, Y), END(X) as (ts, md(X), 1, -X) (see ``order``)."""
    n, m = len(thr), len(dv)
    flows = flows.view(bool)
    h0, h1 = rows[:, :n], rows[:, n:2 * n]
    _pair(h0, h1, thr, hb, he, ids, md, group)
    h0[C_PRE] = hpre
    h0[C_FLOW] = flows * FLOW_OUT
    h0[C_SPANANN] = ~flows
    h0[C_PARENT] = par
    h0[C_EXTRA] = xid
    h0[[C_K2, C_K3, C_RAW, C_RAWS, C_RAWE, C_RAWEND]] = 0
    if m:
        d0, d1 = rows[:, 2 * n:2 * n + m], rows[:, 2 * n + m:2 * n + 2 * m]
        _pair(d0, d1, dtr, ds[dv], de[dv], ids[dv], md[dv], group[dv])
        d0[C_PRE] = dpre
        f = flows[dv]
        d0[C_FLOW] = f * FLOW_IN
        d0[C_SPANANN] = ~f
        d0[C_EXTRA] = -1
        d0[C_RAW] = 1
        d0[C_RAWS] = raws[dv]
        d0[C_RAWE] = rawe[dv]
        d0[C_RAWEND] = d0[C_RAWE] - d0[C_RAWS] != d1[C_TS] - d0[C_TS]
        d0[[C_K2, C_K3, C_PARENT]] = 0


def _pair(b: np.ndarray, e: np.ndarray, track: np.ndarray, begin: np.ndarray, end: np.ndarray, ids: np.ndarray,
          md: np.ndarray, group: np.ndarray) -> None:
    """The columns a BEGIN/END pair shares."""
    b[C_TRACK] = e[C_TRACK] = track
    b[C_TS] = begin
    e[C_TS] = end
    b[C_K1] = b[C_SID] = ids
    e[C_K1] = md
    e[C_K2] = K2_END
    e[C_K3] = -ids
    b[C_G] = e[C_G] = group
    e[C_PRE] = e[C_EXTRA] = -1
    e[[C_FLOW, C_SID, C_SPANANN, C_PARENT, C_RAW, C_RAWS, C_RAWE, C_RAWEND]] = 0
