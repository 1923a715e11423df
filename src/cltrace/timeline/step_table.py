"""Where the traced steps of a scheduled session lie on the host timeline.

A span belongs to the step whose host interval holds its ``host_begin`` (for a launch, the
moment it was enqueued), whenever the worker resolves it. The table is appended to by the
thread that marks steps and read by the resolver's gate, the cycle collector and the OTLP
mapping, so steps are decided by the spans' own times, not by when they arrive. Only traced
steps (warm-up and active) are kept: a span that began outside them is "outside any step".
A step's own span is ``record/step_span.py``'s; the session that marks steps, ``capture/stepper.py``.
"""
from __future__ import annotations

import bisect
import threading

import numpy as np

OPEN = np.iinfo(np.int64).max  # the end of a step not closed yet


class StepTable:
    """Traced steps in host-time order: begin, end, number, span id, cycle, written (active)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.clear()

    def clear(self) -> None:
        with self._lock:
            self.n = 0
            self._begins: list[int] = []  # for scalar lookups (bisect on a list beats numpy for one value)
            self._cols = {k: np.zeros(16, np.int64) for k in ("begin", "end", "number", "span", "cycle", "written")}

    def open(self, number: int, span_id: int, begin_ns: int, cycle: int, written: bool) -> int:
        """Add a step that begins at ``begin_ns`` (after every step already in the table); its index."""
        with self._lock:
            i = self.n
            if i == len(self._cols["begin"]):
                self._cols = {k: np.concatenate([v, np.zeros(len(v), np.int64)]) for k, v in self._cols.items()}
            c = self._cols
            c["begin"][i], c["end"][i], c["number"][i] = begin_ns, OPEN, number
            c["span"][i], c["cycle"][i], c["written"][i] = span_id, cycle, int(written)
            self._begins.append(begin_ns)
            self.n = i + 1
            return i

    def close(self, index: int, end_ns: int) -> None:
        with self._lock:
            self._cols["end"][index] = end_ns

    def find(self, t_ns: int) -> int:
        """Index of the step whose interval holds ``t_ns``, or -1."""
        i = bisect.bisect_right(self._begins, t_ns) - 1
        if i < 0:
            return -1
        with self._lock:
            return i if t_ns < self._cols["end"][i] else -1

    def find_many(self, t_ns: np.ndarray) -> np.ndarray:
        """``find`` for an array of times, in one vectorised pass."""
        with self._lock:
            n = self.n
            begin, end = self._cols["begin"][:n].copy(), self._cols["end"][:n].copy()
        if not n:
            return np.full(len(t_ns), -1, np.int64)
        i = np.searchsorted(begin, t_ns, side="right") - 1
        inside = (i >= 0) & (t_ns < end[np.maximum(i, 0)])
        return np.where(inside, i, -1)

    def column(self, name: str) -> np.ndarray:
        """A copy of one column (``begin``, ``end``, ``number``, ``span``, ``cycle``, ``written``)."""
        with self._lock:
            return self._cols[name][:self.n].copy()

    def take(self, name: str, index: np.ndarray) -> np.ndarray:
        """One column's values at the given step indices."""
        with self._lock:
            return self._cols[name][index]

    def get(self, index: int) -> dict[str, int]:
        with self._lock:
            return {k: int(v[index]) for k, v in self._cols.items()}
