"""SpanBatch: resolved spans as columns, the unit every stage after resolution consumes.

One numpy array per field and interned integer ids for names, categories and region paths:
no Python object per span. Statistics, the in-memory store and the file writers read the
columns; a ``Span`` object is built only when someone asks for one (iteration, indexing,
``RECORDER.spans()``), so a batch still reads as a ``Sequence[Span]`` for any sink.
"""
from __future__ import annotations

import threading
import weakref
from typing import Any, Iterable, Iterator, Sequence

import numpy as np

from .spans import REGION_CATS, STATUS_ERROR, STATUS_OK, Span

I64 = np.int64
# Integer columns: (name, dtype). "track" is the device track id, 0 for host-only spans; the
# device columns of such rows are 0. "status" is 0 for ok, 1 for error. "site" is the call site's
# id in ``Tables.sites`` (-1: none).
COLUMNS: tuple[tuple[str, Any], ...] = (
    ("id", I64), ("parent", I64), ("name", np.int32), ("cat", np.int16), ("thread", I64),
    ("host_begin", I64), ("host_end", I64), ("track", I64),
    ("dev_queued", I64), ("dev_submit", I64), ("dev_start", I64), ("dev_end", I64),
    ("raw_start", I64), ("raw_end", I64), ("status", np.int8), ("path", np.int32),
    ("site", np.int32),
)
NAMES = tuple(c for c, _ in COLUMNS)
_last_ids: tuple[Any, np.ndarray] | None = None  # (weak reference to a batch, its attrs ids)
_FILL = {"site": -1}  # a column's value where a batch is built without it (else 0)


class Interner:
    """Values (names, categories, path tuples) <-> dense integer ids. Append-only, thread-safe."""

    __slots__ = ("ids", "values", "_lock")

    def __init__(self) -> None:
        self.ids: dict[Any, int] = {}
        self.values: list[Any] = []
        self._lock = threading.Lock()

    def id(self, value: Any) -> int:
        i = self.ids.get(value)
        if i is None:
            with self._lock:
                i = self.ids.get(value)
                if i is None:
                    i = self.ids[value] = len(self.values)
                    self.values.append(value)
        return i

    def many(self, values: Sequence[Any]) -> np.ndarray:
        """Ids of a column of values, interning the new ones."""
        ids = self.ids
        for v in set(values).difference(ids):
            self.id(v)
        return np.fromiter(map(ids.__getitem__, values), np.int32, len(values))


class Tables:
    """The interning tables a recorder's batches share."""

    __slots__ = ("names", "cats", "paths", "sites", "region_cats")

    def __init__(self) -> None:
        self.names = Interner()
        self.cats = Interner()
        self.paths = Interner()
        self.sites = Interner()  # CallSite values
        self.region_cats: set[int] = {self.cats.id(c) for c in sorted(REGION_CATS)}


class SpanBatch:
    """Resolved spans, column by column. Reads as a sequence of ``Span`` (built on demand)."""

    __slots__ = NAMES + ("tables", "attrs", "errors", "n", "__weakref__")

    def __init__(self, tables: Tables, columns: dict[str, np.ndarray], attrs: list[Any] | None = None,
                 errors: dict[int, str] | None = None) -> None:
        self.tables = tables
        n = len(columns["id"])
        self.n = n
        for name, dtype in COLUMNS:
            col = columns.get(name)
            setattr(self, name, np.full(n, _FILL.get(name, 0), dtype) if col is None else np.asarray(col, dtype))
        self.attrs = attrs if attrs is not None else [None] * n  # dict or None per row
        self.errors = errors or {}  # row -> error message, for rows with status 1

    # -- as a sequence of Span ------------------------------------------------------
    def __len__(self) -> int:
        return self.n

    def __bool__(self) -> bool:
        return self.n > 0

    def __iter__(self) -> Iterator[Span]:
        return iter(self.spans())

    def __getitem__(self, i: int) -> Span:
        if isinstance(i, slice):
            raise TypeError("use SpanBatch.take() for a part of a batch")
        return self._span(i)

    def _span(self, i: int) -> Span:
        t = self.tables
        dt = int(self.track[i])
        path = t.paths.values[int(self.path[i])]
        s = Span(int(self.id[i]), int(self.parent[i]), t.names.values[int(self.name[i])],
                 t.cats.values[int(self.cat[i])], int(self.thread[i]), int(self.host_begin[i]),
                 int(self.host_end[i]), attrs=self.attrs[i],
                 status=STATUS_ERROR if self.status[i] else STATUS_OK, error=self.errors.get(i), path=path)
        si = int(self.site[i])
        if si >= 0:
            s.site = t.sites.values[si]
        if dt:
            s.device_track = dt
            s.dev_queued, s.dev_submit = int(self.dev_queued[i]), int(self.dev_submit[i])
            s.dev_start, s.dev_end = int(self.dev_start[i]), int(self.dev_end[i])
            s.raw_start, s.raw_end = int(self.raw_start[i]), int(self.raw_end[i])
        return s

    def spans(self) -> list[Span]:
        """Every row as a ``Span`` object."""
        t = self.tables
        names, cats, paths, sites = t.names.values, t.cats.values, t.paths.values, t.sites.values
        errors = self.errors
        out = []
        app = out.append
        cols = [getattr(self, c).tolist() for c in NAMES]
        for i, (sid, par, nm, cat, th, hb, he, dt, dq, dsu, dst, den, rs, re_, st, pa, si) in enumerate(zip(*cols)):
            s = Span(sid, par, names[nm], cats[cat], th, hb, he, attrs=self.attrs[i],
                     status=STATUS_ERROR if st else STATUS_OK, error=errors.get(i) if st else None, path=paths[pa])
            if si >= 0:
                s.site = sites[si]
            if dt:
                s.device_track = dt
                s.dev_queued = dq
                s.dev_submit = dsu
                s.dev_start = dst
                s.dev_end = den
                s.raw_start = rs
                s.raw_end = re_
            app(s)
        return out

    # -- column views -------------------------------------------------------------------
    def site_list(self) -> list[Any]:
        """Each row's ``CallSite`` (None where none was recorded)."""
        values = self.tables.sites.values
        return [values[i] if i >= 0 else None for i in self.site.tolist()]

    def name_list(self) -> list[str]:
        return list(map(self.tables.names.values.__getitem__, self.name.tolist()))

    def cat_list(self) -> list[str]:
        return list(map(self.tables.cats.values.__getitem__, self.cat.tolist()))

    def status_list(self) -> list[str]:
        return [STATUS_ERROR if s else STATUS_OK for s in self.status.tolist()]

    def error_list(self) -> list[str | None]:
        if not self.errors:
            return [None] * self.n
        get = self.errors.get
        return [get(i) for i in range(self.n)]

    def is_region(self) -> np.ndarray:
        return self.cat_mask(self.tables.region_cats)

    def cat_mask(self, cat_ids: Iterable[int]) -> np.ndarray:
        """Rows whose category id is one of ``cat_ids`` (a lookup table over the interned ids)."""
        lut = np.zeros(len(self.tables.cats.values) + 1, bool)
        lut[list(cat_ids)] = True
        return lut[self.cat]

    def attrs_ids(self) -> np.ndarray:
        """``id()`` of each row's attrs object (int64; launches share one dict per launcher). The sinks
        group rows by it, each on the same batch in turn: the last batch's ids are kept for the next
        one to ask (not on the batch: a retained batch would carry 8 B a span more). The batch holds
        the objects, so the ids stay theirs while it lives."""
        global _last_ids
        last = _last_ids
        if last is not None and last[0]() is self:
            return last[1]
        ids = np.fromiter(map(id, self.attrs), np.int64, self.n)
        _last_ids = (weakref.ref(self), ids)
        return ids

    def nbytes(self) -> int:
        """Memory held by the columns and the attrs list (not the shared attrs dicts)."""
        return sum(getattr(self, c).nbytes for c in NAMES) + 8 * len(self.attrs) + 56

    # -- building ----------------------------------------------------------------------
    def take(self, index: np.ndarray | slice) -> "SpanBatch":
        """The rows selected by a slice, boolean mask or index array, as a new batch."""
        rows = np.arange(self.n)[index]
        cols = {c: getattr(self, c)[rows] for c in NAMES}
        attrs = [self.attrs[i] for i in rows.tolist()]
        errors = {}
        if self.errors:
            where = {old: new for new, old in enumerate(rows.tolist())}
            errors = {where[i]: e for i, e in self.errors.items() if i in where}
        return SpanBatch(self.tables, cols, attrs, errors)

    def in_tables(self, tables: Tables) -> "SpanBatch":
        """These rows with their name, category, path and site ids those of ``tables``, which interns the values
        it lacks in the order the rows first name them (as ``from_spans`` of the rows' spans would): batches read
        apart, then written by one sink, which reads them all with its context's tables."""
        if tables is self.tables:
            return self
        mine = self.tables
        cols = {c: getattr(self, c) for c in NAMES}
        for col, have, want in (("name", mine.names, tables.names), ("cat", mine.cats, tables.cats),
                                ("path", mine.paths, tables.paths), ("site", mine.sites, tables.sites)):
            uniq, first, inv = np.unique(cols[col], return_index=True, return_inverse=True)
            ids = np.full(len(uniq), -1, I64)  # site -1 (none) stays -1
            values = have.values
            for j in np.argsort(first, kind="stable").tolist():
                if uniq[j] >= 0:
                    ids[j] = want.id(values[uniq[j]])
            cols[col] = ids[inv]
        return SpanBatch(tables, cols, self.attrs, self.errors)

    @classmethod
    def concat(cls, tables: Tables, batches: Sequence["SpanBatch"]) -> "SpanBatch":
        batches = [b for b in batches if b.n]
        if not batches:
            return cls.empty(tables)
        if len(batches) == 1:
            return batches[0]
        cols = {c: np.concatenate([getattr(b, c) for b in batches]) for c in NAMES}
        attrs: list[Any] = []
        errors: dict[int, str] = {}
        for b in batches:
            base = len(attrs)
            attrs.extend(b.attrs)
            errors.update({base + i: e for i, e in b.errors.items()})
        return cls(tables, cols, attrs, errors)

    @classmethod
    def empty(cls, tables: Tables) -> "SpanBatch":
        return cls(tables, {"id": np.zeros(0, I64)})

    @classmethod
    def from_spans(cls, tables: Tables, spans: Iterable[Span]) -> "SpanBatch":
        """Columns of existing ``Span`` objects (tests, readers, sinks fed by hand)."""
        spans = list(spans)
        names, cats, paths, sites = tables.names, tables.cats, tables.paths, tables.sites
        cols: dict[str, list[int]] = {c: [] for c in NAMES}
        errors = {}
        for i, s in enumerate(spans):
            dev = s.dev_start is not None and s.device_track is not None
            row = (s.id, s.parent, names.id(s.name), cats.id(s.cat), s.thread, s.host_begin, s.host_end,
                   s.device_track if dev else 0,
                   s.dev_queued if dev and s.dev_queued is not None else (s.dev_start if dev else 0),
                   s.dev_submit if dev and s.dev_submit is not None else (s.dev_start if dev else 0),
                   s.dev_start if dev else 0, s.dev_end if dev else 0,
                   s.raw_start if dev and s.raw_start is not None else (s.dev_start if dev else 0),
                   s.raw_end if dev and s.raw_end is not None else (s.dev_end if dev else 0),
                   0 if s.status == STATUS_OK else 1, paths.id(tuple(s.path) or (s.name,)),
                   -1 if s.site is None else sites.id(s.site))
            for c, v in zip(NAMES, row):
                cols[c].append(v)
            if s.status != STATUS_OK and s.error is not None:
                errors[i] = s.error
        return cls(tables, {c: np.array(v, dtype) for (c, dtype), v in zip(COLUMNS, cols.values())},
                   [s.attrs for s in spans], errors)


def as_batch(spans: Any, tables: Tables) -> SpanBatch:
    """A SpanBatch as is; any other sequence of ``Span`` converted."""
    return spans if isinstance(spans, SpanBatch) else SpanBatch.from_spans(tables, spans)
