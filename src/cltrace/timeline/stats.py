"""Running aggregation of spans by their region path, for PerfCounter reports.

Count, total, min and max are exact. Percentiles come from a uniform
reservoir of ``RESERVOIR`` samples per path (exact until that many calls).
A batch is grouped by path once (a sort) and each group added with array operations.
"""
from __future__ import annotations

import threading
from typing import Any, Iterable

import numpy as np

from .batch import SpanBatch, Tables
from .spans import Span

RESERVOIR = 4096


class _Series:
    __slots__ = ("n", "total", "lo", "hi", "samples", "kept")

    def __init__(self) -> None:
        self.n = 0
        self.total = 0
        self.lo: int | None = None
        self.hi: int | None = None
        self.samples = np.zeros(0, np.int64)
        self.kept = 0

    def add_many(self, v: np.ndarray, rng: np.random.Generator) -> None:
        """Add a batch of values: exact count/total/min/max, reservoir sampling (algorithm R) for percentiles."""
        m = len(v)
        if not m:
            return
        lo, hi = int(v.min()), int(v.max())
        self.lo = lo if self.lo is None or lo < self.lo else self.lo
        self.hi = hi if self.hi is None or hi > self.hi else self.hi
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
            # The i-th later value replaces a random slot with probability RESERVOIR / (its position).
            pos = np.arange(seen + 1, seen + len(v) + 1)
            j = (rng.random(len(v)) * pos).astype(np.int64)
            hit = j < RESERVOIR
            self.samples[j[hit]] = v[hit]

    def summary(self) -> dict[str, float] | None:
        if not self.n:
            return None
        s = np.sort(self.samples[:self.kept])

        def pct(p: float) -> float:
            k = (len(s) - 1) * p
            f = int(k)
            c = min(f + 1, len(s) - 1)
            return float(s[f] + (s[c] - s[f]) * (k - f))

        return {
            "count": self.n,
            "total_ns": self.total,
            "mean_ns": self.total / self.n,
            "min_ns": self.lo,
            "max_ns": self.hi,
            "p50_ns": pct(0.5),
            "p99_ns": pct(0.99),
        }


class _Entry:
    __slots__ = ("cat", "host", "device", "errors", "first")

    def __init__(self, cat: str, first: int) -> None:
        self.cat = cat
        self.first = first
        self.host = _Series()
        self.device = _Series()
        self.errors = 0


class Stats:
    """Thread-safe aggregation keyed on (path tuple), fed whole batches."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: dict[tuple[str, ...], _Entry] = {}
        self._rng = np.random.default_rng(0)

    def add(self, spans: SpanBatch | Iterable[Span]) -> None:
        b = spans if isinstance(spans, SpanBatch) else SpanBatch.from_spans(Tables(), spans)
        if not b.n:
            return
        paths, cats = b.tables.paths.values, b.tables.cats.values
        order = np.argsort(b.path, kind="stable")
        pid = b.path[order]
        cuts = np.flatnonzero(np.r_[True, pid[1:] != pid[:-1], True])
        host = (b.host_end - b.host_begin)[order]
        on_dev = (b.track != 0)[order]
        dev = (b.dev_end - b.dev_start)[order]
        hb = b.host_begin[order]
        bad = b.status[order]
        cat = b.cat[order]
        with self._lock:
            entries = self._entries
            rng = self._rng
            for lo, hi in zip(cuts[:-1].tolist(), cuts[1:].tolist()):
                key = paths[int(pid[lo])]
                first = int(hb[lo:hi].min())
                e = entries.get(key)
                if e is None:
                    e = entries[key] = _Entry(cats[int(cat[lo])], first)
                elif first < e.first:
                    e.first = first
                e.host.add_many(host[lo:hi], rng)
                d = on_dev[lo:hi]
                e.device.add_many(dev[lo:hi][d] if not d.all() else dev[lo:hi], rng)
                e.errors += int(bad[lo:hi].sum())

    def as_dict(self) -> dict[str, Any]:
        """``{"a/b": {"cat", "depth", "host", "device", "errors"}}`` in tree order.

        Siblings are ordered by when they first ran, so a training step reads top-down.
        """
        with self._lock:
            entries = dict(self._entries)
        inf = float("inf")

        def order(path: tuple[str, ...]) -> tuple:
            return tuple(
                (entries[path[: i + 1]].first if path[: i + 1] in entries else inf, path[i])
                for i in range(len(path))
            )

        items = sorted(entries.items(), key=lambda kv: order(kv[0]))
        out: dict[str, Any] = {}
        for path, e in items:
            out["/".join(path)] = {
                "name": path[-1],
                "cat": e.cat,
                "depth": len(path) - 1,
                "host": e.host.summary(),
                "device": e.device.summary(),
                "errors": e.errors,
            }
        return out
