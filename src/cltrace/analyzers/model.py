"""The trace as columns: one numpy array per span field, shared by every analysis module.

Built once from a list of ``Span`` (read from a file or taken from the recorder) so that
each question (utilisation, kernels, launches, findings) is a few vectorised passes over
arrays instead of a Python loop over a million objects. Times stay integer nanoseconds on
the host ``perf_counter_ns`` timeline; ``NONE`` (-1) marks a missing device placement.
"""
from __future__ import annotations

from dataclasses import dataclass
from operator import attrgetter
from typing import Any, Sequence

import numpy as np

from ..timeline.arrays import sorted_distinct as distinct
from ..timeline.batch import SpanBatch
from ..timeline.spans import BUILD, COMPILE, FILL, KERNEL, REGION_CATS, SYNC, TRANSFER, Span

NONE = -1
WORK_CATS = frozenset({KERNEL, TRANSFER, FILL})  # device commands that occupy a queue


@dataclass
class Queue:
    """A device track: the queue's display name and the device it belongs to."""

    track: int
    name: str
    device: str


def _device_of(name: str, process: str) -> str:
    """A device's name from its track names ("OpenCL: <device>", "<device> · queue N")."""
    if process.startswith("OpenCL: "):
        return process[len("OpenCL: "):]
    if " · " in name:
        return name.split(" · ")[0]
    return process or name


class TraceData:
    """Columns of a trace and its track names; ``span(i)`` builds one ``Span`` for evidence.

    Built from a ``SpanBatch`` (what the readers and the recorder hold: no object per span) or
    from a sequence of ``Span`` (the library API). ``paths`` and ``attrs`` are per row: an index
    into ``path_values`` (region path tuples) and a dict or None (shared between rows alike).
    """

    def __init__(self, spans: Sequence[Span] | SpanBatch, meta: dict[str, Any] | None = None,
                 tracks: dict[int, Queue] | None = None) -> None:
        self.meta = meta or {}
        if isinstance(spans, SpanBatch):
            self._from_batch(spans)
        else:
            self._from_spans(list(spans))
        n = self.n = len(self.id)
        self.on_device = self.dev_start != NONE
        self.queues = tracks if tracks is not None else _queues_from_meta(self.meta, distinct(self.track[self.on_device]))
        if n:
            ends = np.maximum(self.host_end.max(), self.dev_end.max())
            starts = np.where(self.on_device, np.minimum(self.host_begin, self.dev_start), self.host_begin)
            self.t0, self.t1 = int(starts.min()), int(ends)
        else:
            self.t0 = self.t1 = 0
        self.origin = self.t0  # the trace's first span: where ``at`` counts from, windowed or not
        self.window: tuple[np.ndarray, np.ndarray] | None = None

    def set_window(self, starts: np.ndarray, ends: np.ndarray, origin: int) -> None:
        """Analyse only these disjoint sorted intervals (``analyzers.window``); ``origin``: the whole
        trace's first span."""
        self.window = (starts, ends)
        self.t0, self.t1 = int(starts[0]), int(ends[-1])
        self.origin = origin

    @property
    def intervals(self) -> tuple[np.ndarray, np.ndarray]:
        """The time analysed: the window's intervals, or first span to last."""
        if self.window is not None:
            return self.window
        return np.array([self.t0], np.int64), np.array([self.t1], np.int64)

    def _from_spans(self, sp: list[Span]) -> None:
        n = len(sp)
        names: dict[str, int] = {}
        cats: dict[str, int] = {}
        paths: dict[tuple[str, ...], int] = {}
        name_code, cat_code, path_code = names.setdefault, cats.setdefault, paths.setdefault

        def col(attr: str) -> np.ndarray:
            return np.fromiter(map(attrgetter(attr), sp), np.int64, n)

        def opt(attr: str) -> np.ndarray:  # None -> NONE
            return np.array([NONE if v is None else v for v in map(attrgetter(attr), sp)], np.int64).reshape(n)

        self.name = np.array([name_code(v, len(names)) for v in map(attrgetter("name"), sp)], np.int32).reshape(n)
        self.cat = np.array([cat_code(v, len(cats)) for v in map(attrgetter("cat"), sp)], np.int32).reshape(n)
        self.path = np.array([path_code(tuple(v), len(paths)) for v in map(attrgetter("path"), sp)],
                             np.int32).reshape(n)
        self.names, self.cats, self.path_values = list(names), list(cats), list(paths)
        self.id, self.parent, self.thread = col("id"), col("parent"), col("thread")
        self.host_begin, self.host_end = col("host_begin"), col("host_end")
        self.dev_start, self.dev_end, self.track = opt("dev_start"), opt("dev_end"), opt("device_track")
        self.error = np.array([v != "ok" for v in map(attrgetter("status"), sp)], bool).reshape(n)
        self.attrs: list[Any] = [s.attrs for s in sp]
        self._spans: list[Span] | None = sp
        self._batch: SpanBatch | None = None

    def _from_batch(self, b: SpanBatch) -> None:
        t = b.tables
        self.name, self.cat, self.path = b.name, b.cat.astype(np.int32), b.path
        self.names, self.cats, self.path_values = t.names.values, t.cats.values, t.paths.values
        self.id, self.parent, self.thread = b.id, b.parent, b.thread
        self.host_begin, self.host_end = b.host_begin, b.host_end
        dev = b.track != 0
        self.track = np.where(dev, b.track, NONE)
        self.dev_start, self.dev_end = np.where(dev, b.dev_start, NONE), np.where(dev, b.dev_end, NONE)
        self.error = b.status != 0
        self.attrs = b.attrs
        self._spans = None
        self._batch = b

    # ---- rows as objects (evidence only) ---------------------------------------------------
    def span(self, i: int) -> Span:
        """Row ``i`` as a ``Span``."""
        return self._spans[i] if self._spans is not None else self._batch[int(i)]  # type: ignore[index]

    @property
    def spans(self) -> list[Span]:
        """Every row as a ``Span`` (built on first use where the trace came as columns)."""
        if self._spans is None:
            self._spans = self._batch.spans()  # type: ignore[union-attr]
        return self._spans

    def take(self, rows: np.ndarray) -> "TraceData":
        """These rows only (their batch rows, or their ``Span`` objects), with the same metadata and queues."""
        if self._batch is not None:
            return TraceData(self._batch.take(rows), self.meta, tracks=self.queues)
        every = self.spans
        return TraceData([every[i] for i in rows.tolist()], self.meta, tracks=self.queues)

    def path_of(self, i: int) -> tuple[str, ...]:
        return self.path_values[self.path[i]]

    # ---- selections ---------------------------------------------------------------------
    def cat_mask(self, *cats: str) -> np.ndarray:
        codes = [self.cats.index(c) for c in cats if c in self.cats]
        return np.isin(self.cat, codes) if codes else np.zeros(len(self.cat), bool)

    @property
    def work(self) -> np.ndarray:
        """Device commands placed on a queue (kernels, transfers, fills)."""
        return self.cat_mask(*WORK_CATS) & self.on_device

    @property
    def regions(self) -> np.ndarray:
        return self.cat_mask(*REGION_CATS)

    @property
    def builds(self) -> np.ndarray:
        return self.cat_mask(COMPILE, BUILD)

    def blocking(self) -> np.ndarray:
        """Host calls that block until the device is done: sync spans and blocking transfers."""
        mask = self.cat_mask(SYNC)
        attrs = self.attrs
        for i in np.flatnonzero(self.cat_mask(TRANSFER)).tolist():
            a = attrs[i]
            if a and a.get("blocking"):
                mask[i] = True
        return mask

    def process_of_threads(self) -> dict[int, Any]:
        """Each thread track's process as the file names it: its pid, else its process's name. Empty
        where the trace does not say (spans from the recorder: one process)."""
        out = {}
        for t, info in (self.meta.get("tracks") or {}).items():
            if isinstance(info, dict) and str(t).lstrip("-").isdigit():
                key = info.get("pid") or info.get("process")
                if key:
                    out[int(t)] = key
        return out

    def attr(self, i: int, key: str, default: Any = None) -> Any:
        a = self.attrs[i]
        return a.get(key, default) if a else default

    @property
    def wall_ns(self) -> int:
        """The time analysed: first span to last, or the window's intervals."""
        if self.window is not None:
            return int((self.window[1] - self.window[0]).sum())
        return self.t1 - self.t0

    def at(self, t: int) -> float:
        """Seconds since the trace's first span: where to look in Perfetto's timeline."""
        return (t - self.origin) / 1e9


def dense(codes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(distinct codes, each element's position among them) for small non-negative codes."""
    if not len(codes):
        return codes, codes.astype(np.int64)
    present = np.flatnonzero(np.bincount(codes))
    where = np.zeros(int(codes.max()) + 1, np.int64)
    where[present] = np.arange(len(present))
    return present, where[codes]


def _queues_from_meta(meta: dict[str, Any], track_ids: np.ndarray) -> dict[int, Queue]:
    names = meta.get("tracks") or {}
    out = {}
    for t in track_ids.tolist():
        info = names.get(str(t)) or {}
        name = info.get("name") or f"queue track {t}"
        out[t] = Queue(t, name, _device_of(name, info.get("process") or ""))
    return out


def queues_from_registry(registry: Any, track_ids: Any) -> dict[int, Queue]:
    """Queue names of spans held in memory, from the recorder's TrackRegistry."""
    out = {}
    for t in track_ids:
        try:
            tr = registry.get(int(t))
        except KeyError:
            continue
        dev = registry.devices.get(tr.device)
        out[int(t)] = Queue(int(t), tr.name, dev.name if dev else _device_of(tr.name, tr.process))
    return out
