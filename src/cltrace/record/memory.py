"""Device memory: a per-context ledger of live allocation bytes, its counter samples and peak.

Why a side channel and not the span pipeline: an allocation or a release is a level change, not
a piece of work with a duration. As records it would become zero-length spans that every report,
table and exporter would have to filter out again, and it would need no device stamps or clock
mapping anyway (host time is its truth). So allocations and releases go to this ledger, which the
recorder owns (``RECORDER.memory``), and sinks read its samples when they flush, as they already
write the dropped-spans counter: Chrome ``"ph":"C"`` events, Perfetto counter tracks.

Cost: ``alloc``/``free`` append one tuple to a deque (no lock: a release may run inside the
garbage collector, on any thread); the ledger is brought up to date (``drain``) when a sink
flushes, when metadata is asked for, or every ``DRAIN_EVERY`` events. Launches and regions never
touch it. Memory: samples kept since the last ``clear()`` are capped at ``max_samples`` (24 B
each, new ones past the cap dropped and counted); live, peak and the allocations alive stay exact.
"""
from __future__ import annotations

import collections
import contextlib
import itertools
from array import array
import threading
import time
from dataclasses import dataclass
from typing import Any, Iterator

from .callsite import describe

COUNTER_PREFIX = "device memory · "  # counter track name: prefix + context label
COUNTER_ARG = "live_bytes"  # the Chrome counter event's series
DRAIN_EVERY = 4096
ALIVE_SITES = 50  # allocation sites listed in the metadata (most bytes first)

perf_ns = time.perf_counter_ns


def counter_name(label: str) -> str:
    """The counter track name of a context (what readers look for)."""
    return COUNTER_PREFIX + label


@dataclass
class ContextMemory:
    """One context's figures. ``label`` names it in the trace ("context 1")."""

    label: str
    devices: list[str]
    live: int = 0
    peak: int = 0
    peak_ns: int = 0
    allocations: int = 0
    releases: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {"label": self.label, "devices": self.devices, "live_bytes": self.live, "peak_bytes": self.peak,
                "peak_ns": self.peak_ns, "allocations": self.allocations, "releases": self.releases}


class Ledger:
    """Live bytes per context, from allocation and release events (see the module docstring)."""

    def __init__(self, max_samples: int = 1 << 20) -> None:
        self.max_samples = max_samples
        self._events: collections.deque = collections.deque()
        self._serials = itertools.count(1)
        self._lock = threading.RLock()
        self._opened: Any = None  # (position, level, first samples) of the last open()
        self._labels: dict[int, tuple[int, str, list[str]]] = {}  # context handle -> (key, label, devices)
        self.contexts: dict[int, ContextMemory] = {}  # context key -> figures
        self.live: dict[int, tuple[int, int, str, Any, int]] = {}  # serial -> (context key, bytes, kind, site, t)
        self._t, self._k, self._v = array("q"), array("q"), array("q")  # samples: host ns, context, live bytes
        self.samples_dropped = 0
        self.generation = 0  # bumped by clear(): sinks' positions in the samples start over
        self._replay = False

    # ---- recording (any thread, any time) ----------------------------------------
    def context_key(self, context: Any) -> int:
        """A small stable number for a pyopencl context, named once on first sight."""
        handle = context.int_ptr
        known = self._labels.get(handle)
        if known is None:
            try:
                devices = [d.name.strip() for d in context.devices]
            except Exception:
                devices = []
            with self._lock:
                known = self._labels.get(handle)
                if known is None:
                    key = len(self._labels) + 1
                    known = self._labels[handle] = (key, f"context {key}", devices)
        return known[0]

    def alloc(self, context: Any, nbytes: int, kind: str, site: Any) -> int:
        """Record an allocation of ``nbytes`` in ``context``; returns its serial for ``free``."""
        serial = next(self._serials)
        self._events.append((perf_ns(), serial, self.context_key(context), int(nbytes), kind, site))
        if len(self._events) >= DRAIN_EVERY:
            self.drain()
        return serial

    def free(self, serial: int) -> None:
        """Record the release of an allocation (once; a second release of a serial is ignored)."""
        self._events.append((perf_ns(), serial))

    # ---- bringing the figures up to date -------------------------------------------
    def drain(self) -> None:
        """Apply the events recorded so far, in order: live and peak per context, samples."""
        with self._lock:
            events = self._events
            live = self.live
            contexts = self.contexts
            ts, ks, vs = self._t, self._k, self._v
            room = self.max_samples - len(ts)
            popleft = events.popleft
            while events:
                try:
                    ev = popleft()
                except IndexError:
                    break
                if len(ev) == 2:
                    t, serial = ev
                    entry = live.pop(serial, None)
                    if entry is None:
                        continue
                    key = entry[0]
                    c = contexts[key]
                    c.live -= entry[1]
                    c.releases += 1
                else:
                    t, serial, key, nbytes, kind, site = ev
                    live[serial] = (key, nbytes, kind, site, t)
                    c = contexts.get(key)
                    if c is None:
                        c = contexts[key] = self._new_context(key)
                    c.live += nbytes
                    c.allocations += 1
                    if c.live > c.peak:
                        c.peak, c.peak_ns = c.live, t
                if room > 0:
                    room -= 1
                    ts.append(t)
                    ks.append(key)
                    vs.append(c.live)
                else:
                    self.samples_dropped += 1

    def _new_context(self, key: int) -> ContextMemory:
        for k, label, devices in self._labels.values():
            if k == key:
                return ContextMemory(label, devices)
        return ContextMemory(f"context {key}", [])

    def open(self) -> tuple[tuple[int, int], list[tuple[int, int, int]]]:
        """Where a sink attached now starts: its position, and each context's live bytes now as its
        first samples (the level it starts from). Under ``replay()``: every sample kept."""
        self.drain()
        with self._lock:
            if self._replay:
                return (self.generation, 0), []
            position = (self.generation, len(self._t))
            level = [(k, c.live) for k, c in self.contexts.items() if c.live]
            last = self._opened
            if last is not None and last[0] == position and last[1] == level:
                return position, list(last[2])  # sinks of one start begin from one sample
            now = perf_ns()
            first = [(now, k, live) for k, live in level]
            self._opened = (position, level, first)
            return position, first

    @contextlib.contextmanager
    def replay(self) -> Iterator[None]:
        """Sinks opened meanwhile get every sample kept (a late export of what memory holds)."""
        self._replay = True
        try:
            yield
        finally:
            self._replay = False

    def since(self, position: tuple[int, int]) -> tuple[list[tuple[int, int, int]], tuple[int, int]]:
        """Samples after ``position`` (a previous call's, or ``(-1, 0)``), and the new position."""
        self.drain()
        with self._lock:
            gen, at = position
            if gen != self.generation:
                at = 0
            return list(zip(self._t[at:], self._k[at:], self._v[at:])), (self.generation, len(self._t))

    def samples_by_label(self) -> dict[str, list[tuple[int, int]]]:
        """Samples kept, per context label: (host ns, live bytes), as a trace file gives them back."""
        self.drain()
        with self._lock:
            out: dict[str, list[tuple[int, int]]] = {}
            for t, key, live in zip(self._t, self._k, self._v):
                out.setdefault(self.label(key), []).append((t, live))
            return out

    def label(self, key: int) -> str:
        c = self.contexts.get(key)
        return c.label if c is not None else f"context {key}"

    def clear(self) -> None:
        """Forget samples and counts (what is still allocated stays live; peaks restart from it)."""
        self.drain()
        with self._lock:
            self._t, self._k, self._v = array("q"), array("q"), array("q")
            self.samples_dropped = 0
            self.generation += 1
            now = perf_ns()
            for c in self.contexts.values():
                c.peak, c.peak_ns, c.allocations, c.releases = c.live, now, 0, 0

    def metadata(self) -> dict[str, Any] | None:
        """Per context figures and the allocation sites of what is alive now (None: nothing seen)."""
        self.drain()
        with self._lock:
            seen = {k: c for k, c in self.contexts.items() if c.allocations or c.releases or c.live}
            if not seen:
                return None
            groups: dict[tuple[int, str, Any], list[int]] = {}
            for key, nbytes, kind, site, _ in self.live.values():
                g = groups.setdefault((key, kind, describe(site)), [0, 0])
                g[0] += 1
                g[1] += nbytes
            alive = [{"context": self.label(key), "kind": kind, "site": None if site is None else str(site),
                      "file": None if site is None else site.file, "line": None if site is None else site.line,
                      "function": None if site is None else site.function, "count": n, "bytes": b}
                     for (key, kind, site), (n, b) in groups.items()]
            alive.sort(key=lambda a: (-a["bytes"], a["site"] or ""))
            return {"contexts": {str(k): c.as_dict() for k, c in seen.items()},
                    "alive": alive[:ALIVE_SITES], "alive_sites": len(alive),
                    "samples_dropped": self.samples_dropped}
