"""Running aggregation of spans by their region path, for PerfCounter reports.

Count, total, min and max are exact. Percentiles come from a uniform reservoir of ``RESERVOIR``
samples per path and series (exact until that many calls). A whole batch is one pass: in the C
extension ``_stats`` without the GIL where built, else in the numpy table below, which gives the same
numbers (the reservoir's draws are a pure function of the series and the value's position).
"""
from __future__ import annotations

import threading
from typing import Any, Iterable

import numpy as np

from .._native import choose, extension
from .batch import SpanBatch, Tables
from .spans import Span

RESERVOIR = 4096
_GOLDEN = 0x9E3779B97F4A7C15
_KEY_MUL = 0xD1B54A32D192ED03
_MASK = (1 << 64) - 1


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser on uint64 (wrapping, as in C)."""
    x = x ^ (x >> np.uint64(30))
    x *= np.uint64(0xBF58476D1CE4E5B9)
    x ^= x >> np.uint64(27)
    x *= np.uint64(0x94D049BB133111EB)
    x ^= x >> np.uint64(31)
    return x


def _key(slot: int, device: bool) -> int:
    return ((2 * slot + int(device)) * _KEY_MUL) & _MASK


class _Series:
    __slots__ = ("n", "total", "lo", "hi", "samples", "kept")

    def __init__(self) -> None:
        self.n = self.total = self.lo = self.hi = self.kept = 0
        self.samples = np.zeros(0, np.int64)

    def add_many(self, v: np.ndarray, key: int) -> None:
        """Exact count/total/min/max; algorithm R for the reservoir (the draws of ``_stats.c``)."""
        m = len(v)
        if not m:
            return
        lo, hi = int(v.min()), int(v.max())
        self.lo, self.hi = (lo, hi) if not self.n else (min(lo, self.lo), max(hi, self.hi))
        self.total += int(v.sum())
        seen = self.n
        self.n += m
        room = RESERVOIR - self.kept
        if room > 0:
            take = v[:room]
            if len(self.samples) < RESERVOIR:
                self.samples = np.resize(self.samples, RESERVOIR)
            self.samples[self.kept:self.kept + len(take)] = take
            self.kept += len(take)
            seen += len(take)
            v = v[room:]
        if len(v):
            pos = np.arange(seen + 1, seen + len(v) + 1, dtype=np.uint64)
            z = _mix(np.uint64(key) + pos * np.uint64(_GOLDEN))
            j = ((z >> np.uint64(11)).astype(np.float64) * 2.0 ** -53 * pos.astype(np.float64)).astype(np.int64)
            hit = j < RESERVOIR
            self.samples[j[hit]] = v[hit]  # a later value at the same slot wins, as in order


class PythonTable:
    """The numpy twin of ``_stats.Table``: the same interface and the same numbers."""

    def __init__(self) -> None:
        self._host: list[_Series] = []
        self._dev: list[_Series] = []
        self._errors: list[int] = []
        self._first: list[int] = []

    def grow(self, slots: int) -> None:
        for _ in range(len(self._host), slots):
            self._host.append(_Series())
            self._dev.append(_Series())
            self._errors.append(0)
            self._first.append(0)

    def add(self, lut: np.ndarray, path: np.ndarray, cat: np.ndarray, hb: np.ndarray, he: np.ndarray,
            ds: np.ndarray, de: np.ndarray, track: np.ndarray, status: np.ndarray) -> list[tuple[int, int]]:
        if len(path) and (path.min() < 0 or path.max() >= len(lut)):
            raise ValueError("add: a row's path has no slot (grow the table first)")
        slot = lut[path]
        if len(slot) and (slot.min() < 0 or slot.max() >= len(self._host)):
            raise ValueError("add: a row's path has no slot (grow the table first)")
        order = np.argsort(slot, kind="stable")
        sl = slot[order]
        cuts = np.flatnonzero(np.r_[True, sl[1:] != sl[:-1], True])
        host = (he - hb)[order]
        on_dev = (track != 0)[order]
        dev = (de - ds)[order]
        hbo, bad, cats = hb[order], status[order], cat[order]
        fresh = []
        for lo, hi in zip(cuts[:-1].tolist(), cuts[1:].tolist()):
            s = int(sl[lo])
            first = int(hbo[lo:hi].min())
            h = self._host[s]
            if not h.n:
                fresh.append((s, int(cats[lo])))
                self._first[s] = first
            elif first < self._first[s]:
                self._first[s] = first
            h.add_many(host[lo:hi], _key(s, False))
            d = on_dev[lo:hi]
            self._dev[s].add_many(dev[lo:hi][d] if not d.all() else dev[lo:hi], _key(s, True))
            self._errors[s] += int(bad[lo:hi].sum())
        return fresh

    def series(self, slot: int, device: bool) -> tuple[int, int, int, int, bytes]:
        s = (self._dev if device else self._host)[slot]
        return s.n, s.total, s.lo, s.hi, s.samples[:s.kept].tobytes()

    def entry(self, slot: int) -> tuple[int, int]:
        return self._errors[slot], self._first[slot]


def _load_native() -> Any:
    mod = extension("stats")
    if mod.RESERVOIR != RESERVOIR:
        raise ImportError(f"the stats stage built with RESERVOIR {mod.RESERVOIR}, not {RESERVOIR}")
    return mod.Table


_CHOICE = choose("the statistics", _load_native)
NATIVE: Any = _CHOICE.native
PATH: str = _CHOICE.path
DETAIL: str = _CHOICE.detail


def _summary(n: int, total: int, lo: int, hi: int, samples: bytes) -> dict[str, float] | None:
    if not n:
        return None
    s = np.sort(np.frombuffer(samples, np.int64))

    def pct(p: float) -> float:
        k = (len(s) - 1) * p
        f = int(k)
        c = min(f + 1, len(s) - 1)
        return float(s[f] + (s[c] - s[f]) * (k - f))

    return {
        "count": n,
        "total_ns": total,
        "mean_ns": total / n,
        "min_ns": lo,
        "max_ns": hi,
        "p50_ns": pct(0.5),
        "p99_ns": pct(0.99),
    }


class Stats:
    """Thread-safe aggregation keyed on the path tuple, fed whole batches.

    ``python=True`` runs the numpy table even where the C extension is built (tests compare the two).
    """

    def __init__(self, python: bool = False) -> None:
        self._lock = threading.Lock()
        self._table: Any = PythonTable() if python or NATIVE is None else NATIVE()
        self._paths: list[tuple[str, ...]] = []  # slot -> path
        self._slots: dict[tuple[str, ...], int] = {}
        self._cats: list[str] = []  # slot -> the category of its first span
        self._lut_of: Tables | None = None  # the tables ``_lut`` maps ids of
        self._lut = np.zeros(0, np.int64)  # path id -> slot

    def _lut_for(self, tables: Tables) -> np.ndarray:
        if tables is not self._lut_of:
            self._lut_of, self._lut = tables, np.zeros(0, np.int64)
        values = tables.paths.values
        have, want = len(self._lut), len(values)
        if want > have:
            slots = self._slots
            new = []
            for path in values[have:want]:
                s = slots.get(path)
                if s is None:
                    s = slots[path] = len(self._paths)
                    self._paths.append(path)
                    self._cats.append("")
                new.append(s)
            self._lut = np.concatenate([self._lut, np.array(new, np.int64)])
            self._table.grow(len(self._paths))
        return self._lut

    def add(self, spans: SpanBatch | Iterable[Span]) -> None:
        b = spans if isinstance(spans, SpanBatch) else SpanBatch.from_spans(Tables(), spans)
        if not b.n:
            return
        c = np.ascontiguousarray
        with self._lock:
            lut = self._lut_for(b.tables)
            fresh = self._table.add(lut, c(b.path, np.int32), c(b.cat, np.int16), c(b.host_begin, np.int64),
                                    c(b.host_end, np.int64), c(b.dev_start, np.int64), c(b.dev_end, np.int64),
                                    c(b.track, np.int64), c(b.status, np.int8))
            cats = b.tables.cats.values
            for s, cat in fresh:
                self._cats[s] = cats[cat]

    def as_dict(self) -> dict[str, Any]:
        """``{"a/b": {"cat", "depth", "host", "device", "errors"}}`` in tree order.

        Siblings are ordered by when they first ran, so a training step reads top-down.
        """
        entries: dict[tuple[str, ...], tuple[Any, ...]] = {}
        with self._lock:
            t = self._table
            for s, path in enumerate(self._paths):
                host = t.series(s, False)
                if host[0]:
                    errors, first = t.entry(s)
                    entries[path] = (first, self._cats[s], host, t.series(s, True), errors)
        inf = float("inf")

        def order(path: tuple[str, ...]) -> tuple:
            return tuple(
                (entries[path[: i + 1]][0] if path[: i + 1] in entries else inf, path[i])
                for i in range(len(path))
            )

        out: dict[str, Any] = {}
        for path in sorted(entries, key=order):
            _, cat, host, dev, errors = entries[path]
            out["/".join(path)] = {
                "name": path[-1],
                "cat": cat,
                "depth": len(path) - 1,
                "host": _summary(*host),
                "device": _summary(*dev),
                "errors": errors,
            }
        return out
