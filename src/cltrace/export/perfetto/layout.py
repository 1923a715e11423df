"""Column-by-column byte layout of protobuf rows, with numpy.

A batch's packets are rows (one per packet) of protobuf fields: constant bytes, varints, per-row
fixed bytes, and byte strings from a pool. Each field is one vectorized pass over the rows that
have it, so Python does no per-packet work here.
"""
from __future__ import annotations

from typing import Any

import numpy as np

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
        self._arrays: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None

    def add(self, b: bytes) -> int:
        self.items.append(b)
        self._arrays = None
        return len(self.items) - 1

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The pool as one buffer, with each item's offset and length."""
        if self._arrays is None:
            lens = np.fromiter(map(len, self.items), np.int64, len(self.items))
            buf = np.frombuffer(b"".join(self.items) or b"\x00", np.uint8)
            self._arrays = (buf, np.cumsum(lens) - lens, lens)
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

    def pooled(self, ids: np.ndarray, pool: Pool, rows: np.ndarray | None = None) -> np.ndarray:
        buf, off, lens = pool.arrays()
        return self._add("p", rows, ids, (buf, off), lens[ids])

    def annotation(self, headers: np.ndarray, values: np.ndarray, pool: Pool, rows: np.ndarray) -> None:
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
    width = int(ln.max())
    if width == 1:
        out[pos] = u.astype(np.uint8)
        return
    k = np.arange(width)
    groups = ((u[:, None] >> (k * 7).astype(_U64)) & _U64(0x7F)).astype(np.uint8)
    groups |= (k < (ln - 1)[:, None]).view(np.uint8) << 7  # continuation bit on all but the last byte
    used = k < ln[:, None]
    out[(pos[:, None] + k)[used]] = groups[used]


def _put_ragged(out: np.ndarray, dst: np.ndarray, buf: np.ndarray, src: np.ndarray, ln: np.ndarray) -> None:
    """Copies buf[src[i]:src[i]+ln[i]] to out[dst[i]:], one pass per distinct length (there are few)."""
    if not len(ln):
        return
    lo, hi = int(ln.min()), int(ln.max())
    for width in range(lo, hi + 1) if hi - lo < 16 else np.unique(ln).tolist():
        if lo == hi:
            d, s_ = dst, src
        else:
            m = ln == width
            if not m.any():
                continue
            d, s_ = dst[m], src[m]
        step = np.arange(width)
        out[d[:, None] + step] = buf[s_[:, None] + step]
