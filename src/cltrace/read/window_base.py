"""What the windowed readers share (``windows.py`` for .pftrace, ``chrome_windows.py`` for .json): the reader's
frame (the first pass's parents and their paths, the spans with a device slice), region paths of a
window's spans, and sets of span ids."""
from __future__ import annotations

import ctypes
import ctypes.util
from abc import ABC, abstractmethod
from typing import Any, Iterator

import numpy as np

from ..errors import TraceFileError
from ..timeline.batch import SpanBatch, Tables
from ..timeline.spans import FILL, KERNEL, MARKER, TRANSFER
from .tree import child_paths, path_ids, path_names

LEAF_CATS = (KERNEL, TRANSFER, MARKER, FILL)  # never a parent (export/perfetto/order.py relies on it too)
LIMIT = 1 << 62  # ids past this are errors the whole-file readers name


def give_back() -> None:
    """Return the C allocator's free memory to the system (glibc's ``malloc_trim``; elsewhere nothing).
    The first pass's arrays are freed into the allocator, where an embedded ClickHouse loading the
    spans next (its own allocator) could not reuse them: the process would hold both."""
    global _TRIM
    if _TRIM is None:
        try:
            _TRIM = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
        except (OSError, AttributeError):
            _TRIM = False
    if _TRIM:
        _TRIM(0)


_TRIM: Any = None


class WindowedTrace(ABC):
    """A trace file read in windows: ``metadata()`` (as the whole-file reader gives it) once open, then
    ``batches()`` the spans, a ``SpanBatch`` at a time, sharing ``tables``. ``windows.open_windows`` opens
    one with the reader of the file's format (``windows.PftraceWindows``, ``chrome_windows.ChromeWindows``)."""

    def __init__(self, path: str, scanner: Any, window_bytes: int, tables: Tables) -> None:
        self.path = path
        self.scanner = scanner
        self.window_bytes = window_bytes
        self.tables = tables
        self.meta: dict[str, Any] = {}
        self.spans = 0
        self._parent_ids = np.zeros(0, np.int64)  # spans that are parents, sorted by id
        self._parent_paths = np.zeros(0, np.int32)
        self._has_device = SidSet()  # spans with a device slice somewhere in the file
        self._is_parent = SidSet()  # spans some span names as its parent

    @abstractmethod
    def _first_pass(self) -> bool:
        """Read the file once: metadata, the spans with a device slice, the parents and their paths. False
        where the file leaves cltrace's layout."""

    def batches(self) -> Iterator[SpanBatch]:
        """The file's spans, a batch per window: each window's rows with those the rounds before left
        waiting, settled by the format's ``_round`` against the first row of the window before the newest
        (what began before it goes out; everything at the last window). Raises TraceFileError where the
        second pass finds what the first did not."""
        pending: dict[str, np.ndarray] | None = None
        older = 0
        try:
            for new, last, ctx in self._rows_by_window():
                rows = new if pending is None else {c: np.concatenate((pending[c], v)) for c, v in new.items()}
                batch, pending = self._round(rows, None if last else older, *ctx)
                first = new[self.ORDER]
                older = int(first[0]) if len(first) else older
                if batch is not None and batch.n:
                    self.spans += batch.n
                    yield batch
        except _Foreign:
            raise TraceFileError("the file changed while it was read (its second pass left cltrace's layout)") from None
        except (ValueError, IndexError) as exc:
            raise TraceFileError(f"cannot read it a window at a time: {exc}") from None

    ORDER = "index"  # the rows' column that numbers them in file order

    @abstractmethod
    def _rows_by_window(self) -> Iterator[tuple[dict[str, np.ndarray], bool, tuple[Any, ...]]]:
        """Per window: its rows (columns), whether it is the last, and what ``_round`` needs of it."""

    @abstractmethod
    def _round(self, rows: dict[str, np.ndarray], before: int | None, *ctx: Any
               ) -> tuple[SpanBatch | None, dict[str, np.ndarray]]:
        """The spans complete among ``rows`` that began before row ``before`` (all: None), and the rows left."""

    @abstractmethod
    def metadata(self) -> dict[str, Any]:
        """The file's metadata, as the whole-file reader gives it."""

    def _set_parents(self, sid: np.ndarray, parent: np.ndarray, name: np.ndarray, cat: np.ndarray) -> bool:
        """Paths of the spans that some span names as its parent, from the candidates of the first pass (which
        ones are parents is known only at its end: a parent may be written before its children). False where
        the whole-file reader would not read the file (an id twice, parent links that loop)."""
        keep = self._is_parent.contains(sid)
        sid = sid[keep]
        if len(np.unique(sid)) != len(sid) or ((sid >= LIMIT) | (sid <= -LIMIT)).any():
            return False
        paths = path_ids(sid, parent[keep], name[keep].astype(np.int64), self.tables, cat[keep])
        if paths is None:
            return False
        order = np.argsort(sid)
        self._parent_ids, self._parent_paths = sid[order], paths[order].astype(np.int32)
        return True

    def _paths(self, sid: np.ndarray, parent: np.ndarray, names: np.ndarray, cats: np.ndarray) -> np.ndarray:
        """Region paths: a parent's from the first pass; any other span's, its parent's path and its own name."""
        tables, pid, ppath = self.tables, self._parent_ids, self._parent_paths
        out = np.full(len(sid), -1, np.int64)
        if len(pid):
            at = np.minimum(np.searchsorted(pid, sid), len(pid) - 1)
            mine = pid[at] == sid
            out[mine] = ppath[at[mine]]
            at = np.minimum(np.searchsorted(pid, parent), len(pid) - 1)
            up = np.where(pid[at] == parent, ppath[at], -1)
        else:
            mine = np.zeros(len(sid), bool)
            up = np.full(len(sid), -1, np.int64)
        rows = np.flatnonzero(~mine)
        if len(rows):
            out[rows] = child_paths(up[rows], path_names(names[rows].astype(np.int64), cats[rows], tables), tables)
        return out.astype(np.int32)


class SidSet:
    """Span ids, as a bitmap where they are dense (cltrace numbers spans from 1: an eighth of a byte a span),
    else as sorted arrays."""

    _SPARSE = 1 << 36  # ids past this go in arrays: a bitmap that far is 8 GiB

    def __init__(self) -> None:
        self._bits = np.zeros(0, np.uint8)
        self._sorted = np.zeros(0, np.int64)
        self._parts: list[np.ndarray] = []

    def add(self, ids: np.ndarray) -> None:
        if not len(ids):
            return
        dense = (ids >= 0) & (ids < self._SPARSE)
        if not dense.all():
            self._parts.append(np.unique(ids[~dense]))
            ids = ids[dense]
            if not len(ids):
                return
        need = int(ids.max()) // 8 + 1
        if need > len(self._bits):
            grown = np.zeros(max(need, 2 * len(self._bits)), np.uint8)
            grown[:len(self._bits)] = self._bits
            self._bits = grown
        np.bitwise_or.at(self._bits, ids >> 3, (1 << (ids & 7)).astype(np.uint8))

    def contains(self, ids: np.ndarray) -> np.ndarray:
        if self._parts:
            self._sorted = np.unique(np.concatenate([self._sorted, *self._parts]))
            self._parts = []
        dense = (ids >= 0) & (ids < 8 * len(self._bits))
        out = np.zeros(len(ids), bool)
        i = ids[dense]
        out[dense] = (self._bits[i >> 3] >> (i & 7)) & 1 != 0
        if len(self._sorted):
            at = np.minimum(np.searchsorted(self._sorted, ids), len(self._sorted) - 1)
            out |= self._sorted[at] == ids
        return out


class _Foreign(Exception):
    """The file leaves cltrace's layout."""
