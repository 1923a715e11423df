"""Running aggregation of spans by their region path, for PerfCounter reports.

Count, total, min and max are exact. Percentiles come from a uniform
reservoir of ``RESERVOIR`` samples per path (exact until that many calls).
"""
from __future__ import annotations

import random
import threading
from typing import Any, Iterable

from .spans import Span

RESERVOIR = 4096


class _Series:
    __slots__ = ("n", "total", "lo", "hi", "samples")

    def __init__(self) -> None:
        self.n = 0
        self.total = 0
        self.lo = None
        self.hi = None
        self.samples: list[int] = []

    def add(self, v: int, rng: random.Random) -> None:
        self.n += 1
        self.total += v
        if self.lo is None or v < self.lo:
            self.lo = v
        if self.hi is None or v > self.hi:
            self.hi = v
        if len(self.samples) < RESERVOIR:
            self.samples.append(v)
        else:
            j = rng.randrange(self.n)
            if j < RESERVOIR:
                self.samples[j] = v

    def summary(self) -> dict[str, float] | None:
        if not self.n:
            return None
        s = sorted(self.samples)

        def pct(p: float) -> float:
            k = (len(s) - 1) * p
            f = int(k)
            c = min(f + 1, len(s) - 1)
            return s[f] + (s[c] - s[f]) * (k - f)

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
    """Thread-safe aggregation keyed on (path tuple)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: dict[tuple[str, ...], _Entry] = {}
        self._rng = random.Random(0)

    def add(self, spans: Iterable[Span]) -> None:
        with self._lock:
            entries = self._entries
            rng = self._rng
            for s in spans:
                key = s.path or (s.name,)
                e = entries.get(key)
                if e is None:
                    e = entries[key] = _Entry(s.cat, s.host_begin)
                if s.host_begin < e.first:
                    e.first = s.host_begin
                e.host.add(s.host_end - s.host_begin, rng)
                if s.dev_start is not None:
                    e.device.add(s.dev_end - s.dev_start, rng)
                if s.status != "ok":
                    e.errors += 1

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
