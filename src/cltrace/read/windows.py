"""A cltrace ``.pftrace`` of any size read a window at a time, in memory bounded by the window.

The whole-file reader (``perfetto_columns``) holds the file, its expanded packets and every row at once:
about 700 B a span at its peak. Here the file is read a window at a time (cut after its last whole packet;
compressed packets expanded within the window, each under ``inflate``'s budget; about ``window_bytes``
expanded, the next window's share of the file judged from the last one's, never less than one packed
chunk of the sink) and fed to the native scanner, whose sequence state (clocks, defaults, interned names)
carries from one window to the next (``_scan.pftrace_open``/``pftrace_feed``). Two passes:

1. the metadata, track descriptors and counters (the packets left to Python); which spans have a device
   slice, and which some span names as its parent; and the region paths of those parents, built as the
   whole-file reader builds them (``tree.path_ids``) once the whole file has been seen (a parent is
   written after its children);
2. the spans, window by window: each window's rows are paired (BEGIN with END per track, host with device
   slice by span id) together with the rows left open before. A pair goes out once its BEGIN is a window
   behind the newest rows (a write of the sink cut by a window's end is then whole, and events the sink
   held back for a parent have come with it), and a span once its device slice, where the file has one,
   has come too. What stays open between windows is the last window's rows and the few the sink held back.

What the batches hold is what ``load_pftrace_columns`` gives (``tests/test_windows.py`` holds them equal),
batch by batch: each sorted by (host begin, id), not the whole file. Where the file leaves cltrace's
layout (``pftrace_feed`` says None), or its parent links loop, ``open_windows`` gives None and the
whole-file readers take the file. ``open_windows`` opens either format (``chrome_windows`` for .json).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

from ..errors import TraceFileError
from ..export.perfetto.wire import BEGIN
from ..timeline.batch import SpanBatch, Tables
from . import checks
from .inflate import expand
from .perfetto import tracks_meta
from .perfetto_columns import (_LIMIT, _Rest, _counters, _extras_of_run, _names, _pairs, _repeats, _rows_of,
                               _site_locations, with_callers)
from .scan import C_COLS, P_COLS
from .window_base import LEAF_CATS, WindowedTrace, _Foreign, give_back

WINDOW_BYTES = 4 << 20  # a window's packets, expanded: ~0.2M packets, ~25 MB of the scanner's rows (6x: 16 int64 a packet)
_ROW_COLS = tuple(c for c in P_COLS if c not in ("seq", "gen"))
# the rows kept between windows, narrowed: flags and table indexes fit int8 and int32 (77 B a row, not 128)
_NARROW = {"type": np.int8, "sid_kind": np.int8, "has_parent": np.int8, "dev": np.int8, "has_raw_end": np.int8,
           "name": np.int32, "cat": np.int32, "extra": np.int32, "site": np.int32}


def _rows(got: dict[str, Any]) -> dict[str, np.ndarray]:
    """The window's slice rows, taken out of ``got``, narrowed."""
    out = {}
    for c, b in zip(P_COLS, got.pop("rows")):
        if c in _ROW_COLS:
            v = np.frombuffer(b, np.int64)
            out[c] = v.astype(_NARROW[c]) if c in _NARROW else v
    return out


@dataclass
class _Window:
    got: dict[str, Any]
    data: bytes  # the window's packets, expanded: the Python packets' offsets index it
    last: bool


def open_windows(path: str | os.PathLike[str], scanner: Any = "default", window_bytes: int | None = None,
                 tables: Tables | None = None) -> WindowedTrace | None:
    """A trace file of either format to read in windows, its first pass done (metadata, parents' paths);
    None where it is not in cltrace's layout (the whole-file readers then read it and say what is wrong).
    ``window_bytes``: None for the format's own (``WINDOW_BYTES`` here, ``chrome_windows.WINDOW_BYTES``)."""
    if scanner == "default":
        from .scan import NATIVE as scanner
    if scanner is None:
        return None
    from .load import detect

    try:
        kind = detect(os.fspath(path))
    except (OSError, TraceFileError):
        return None
    if kind == "json":
        from .chrome_windows import WINDOW_BYTES as size, ChromeWindows as reader
    else:
        reader, size = PftraceWindows, WINDOW_BYTES
    t = reader(os.fspath(path), scanner, window_bytes or size, tables or Tables())
    return t if t._first_pass() else None


class PftraceWindows(WindowedTrace):
    """A ``.pftrace`` in windows (the module docstring)."""

    def __init__(self, path: str, scanner: Any, window_bytes: int, tables: Tables) -> None:
        super().__init__(path, scanner, window_bytes, tables)
        self._runs = _Runs()

    # -- reading the file a window at a time -----------------------------------------------------------
    def _windows(self) -> Iterator[_Window]:
        state = self.scanner.pftrace_open()
        with open(self.path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            carry, at, want, first = b"", 0, self.window_bytes // 8, True
            skipped: dict[str, Any] | None = None
            while True:
                chunk = fh.read(want)
                last = fh.tell() >= size or not chunk
                buf = carry + chunk if carry else chunk
                exp = expand(buf)
                if exp.skipped and skipped is None:
                    skipped = dict(exp.skipped, first_at=exp.skipped["first_at"] + at)
                got = self.scanner.pftrace_feed(state, exp.data)
                if got is None:
                    raise _Foreign
                if first and (not got["packets"] or not got["first_snapshot"]):
                    raise _Foreign
                first = False
                used = exp.file_offset(int(got["end"]))
                got["file_end"] = at + used
                got["skipped"] = skipped
                yield _Window(got, exp.data, last)
                if last:
                    return
                carry = buf[used:]
                at += used
                if not used:  # a packet longer than the window: a longer one
                    want *= 2
                else:  # the next window expands to about window_bytes, as this one's packets did
                    want = max(self.window_bytes // 64, min(self.window_bytes, int(self.window_bytes * used / max(len(exp.data), 1))))

    # -- pass 1 -------------------------------------------------------------------------------------------
    def _first_pass(self) -> bool:
        rest = _Rest()
        counters: list[list[np.ndarray]] = [[] for _ in C_COLS]
        ids, parents, names, cats = [], [], [], []
        tables = self.tables
        leaf = [tables.cats.id(c) for c in LEAF_CATS]
        pending: dict[str, np.ndarray] | None = None
        older = 0
        try:
            for w in self._windows():
                got = w.got
                for o, n, index in zip(*(np.frombuffer(b, np.int64).tolist() for b in got["python"])):
                    rest.packet(pb.TracePacket.FromString(w.data[o:o + n]), index)
                for k, b in enumerate(got["counters"]):
                    counters[k].append(np.frombuffer(b, np.int64))
                name_ids, cat_ids, _, _ = _names(got, tables)
                new = _rows(got)
                begins = (new["type"] == BEGIN) & (new["sid_kind"] != 0)
                self._has_device.add(new["sid"][begins & (new["dev"] != 0)])
                self._is_parent.add(new["parent"][begins & (new["has_parent"] != 0)])
                r = new if pending is None else {c: np.concatenate((pending[c], new[c])) for c in _ROW_COLS}
                all_b, all_e, old = _settle(r, None if w.last else older)
                b = all_b[old]
                may = b[(r["sid_kind"][b] != 0) & (r["dev"][b] == 0)]  # spans' host slices, paired
                cat = cat_ids[r["cat"][may]]
                branch = ~np.isin(cat, leaf)
                may, cat = may[branch], cat[branch]
                ids.append(r["sid"][may])
                parents.append(np.where(r["has_parent"][may] != 0, r["parent"][may], 0))
                names.append(name_ids[r["name"][may]])
                cats.append(cat)
                used = np.zeros(len(r["index"]), bool)
                used[b] = used[all_e[old]] = True
                pending = {c: v[~used] for c, v in r.items()}
                older = int(new["index"][0]) if len(new["index"]) else older
                if w.last:
                    self._end = got
        except _Foreign:
            return False
        except (TraceFileError, ValueError):
            return False
        cand = [np.concatenate(part) for part in (ids, parents, names, cats)]
        del ids, parents, names, cats
        if not self._set_parents(*cand):
            return False
        del cand
        give_back()
        self._rest = rest
        self._counters = {"counters": tuple(np.concatenate(c).tobytes() for c in counters)}
        return True

    def _finish_meta(self) -> None:
        rest, got = self._rest, self._end
        meta = dict(rest.meta)
        dropped, memory = _counters(self._counters, rest)
        meta["dropped_spans"] = max(dropped, meta.get("dropped_spans", 0))
        if memory:
            meta["memory_samples"] = memory
        meta.setdefault("recorded_spans", self.spans)
        meta.setdefault("tracks", tracks_meta(rest.track_names, rest.pids))
        size = os.path.getsize(self.path)
        if got["file_end"] < size or not rest.closed:
            checks.cut_off(meta, int(got["file_end"]), size, int(got["packets"]), 0, "packets")
        if got.get("skipped"):
            meta["inflate_skipped"] = got["skipped"]
        self.meta = meta

    def metadata(self) -> dict[str, Any]:
        """The file's metadata, as the whole-file reader gives it (``recorded_spans`` counted once
        ``batches()`` has run, where the file does not record it)."""
        self._finish_meta()
        return self.meta

    # -- pass 2 -------------------------------------------------------------------------------------------
    def _rows_by_window(self) -> Iterator[tuple[dict[str, np.ndarray], bool, tuple[Any, ...]]]:
        for w in self._windows():
            name_ids, cat_ids, dnames, strings = _names(w.got, self.tables)
            self._runs.update(w.got, dnames, strings)
            yield _rows(w.got), w.last, (w.got, name_ids, cat_ids)

    def _round(self, r: dict[str, np.ndarray], before: int | None, got: dict[str, Any], name_ids: np.ndarray,
               cat_ids: np.ndarray) -> tuple[SpanBatch | None, dict[str, np.ndarray]]:
        """The spans complete among the rows ``r`` (paired; joined to their device slice where the file has
        one) whose host BEGIN is before packet ``before`` (all: None), and the rows left for the next round.
        A span waits a window more than its rows need: a write of the sink cut by a window's end is whole
        before its spans go out, and events the sink held back for a parent arrive with it."""
        n_rows = len(r["index"])
        all_b, all_e, old = _settle(r, before)
        span = r["sid_kind"][all_b] != 0
        used = np.zeros(n_rows, bool)
        used[all_b[old & ~span]] = used[all_e[old & ~span]] = True  # slices that are not spans: read, not kept
        sb, se, sold = all_b[span], all_e[span], old[span]
        is_dev = r["dev"][sb] != 0
        hb_rows, he_rows = sb[~is_dev & sold], se[~is_dev & sold]
        db_rows, de_rows = sb[is_dev], se[is_dev]
        hsid, dsid = r["sid"][hb_rows], r["sid"][db_rows]
        for col in (hsid, dsid, r["parent"][hb_rows], r["raw_start"][db_rows], r["raw_end"][db_rows]):
            if ((col >= _LIMIT) | (col <= -_LIMIT)).any():
                raise _Foreign
        if _repeats(hsid) or _repeats(dsid) or (r["uuid"][hb_rows] < 0).any() or (r["uuid"][db_rows] <= 0).any():
            raise _Foreign
        dorder = np.argsort(dsid)
        ds_sorted = dsid[dorder]
        at = np.minimum(np.searchsorted(ds_sorted, hsid), max(len(dsid) - 1, 0))
        on = (ds_sorted[at] == hsid) if len(dsid) else np.zeros(len(hsid), bool)
        if before is not None:  # a span whose device slice is still to come waits for it
            ready = on | ~self._has_device.contains(hsid)
            hb_rows, he_rows, hsid, on, at = hb_rows[ready], he_rows[ready], hsid[ready], on[ready], at[ready]
        if len(dsid):
            d, dend = db_rows[dorder[at]], de_rows[dorder[at]]
        else:
            d = dend = np.zeros(len(hsid), np.int64)
        used[hb_rows] = used[he_rows] = True
        used[d[on]] = used[dend[on]] = True
        pending = {c: v[~used] for c, v in r.items()} if before is not None else {}
        if not len(hb_rows):
            return None, pending

        hb, he = r["ts"][hb_rows], r["ts"][he_rows]
        ds, de = np.where(on, r["ts"][d], 0), np.where(on, r["ts"][dend], 0)
        raws = np.where(on, r["raw_start"][d], 0)
        rawe = np.where(on, np.where(r["has_raw_end"][d] != 0, r["raw_end"][d], raws + (de - ds)), 0)
        final = np.lexsort((hsid, hb))
        hb_rows, hsid, hb, he, on, ds, de, raws, rawe, d = (a[final] for a in
                                                           (hb_rows, hsid, hb, he, on, ds, de, raws, rawe, d))
        names = name_ids[r["name"][hb_rows]]
        cats = cat_ids[r["cat"][hb_rows]]
        parent = np.where(r["has_parent"][hb_rows] != 0, r["parent"][hb_rows], 0)
        extra = r["extra"][hb_rows]
        failed, errors, attrs, stacks = self._runs.rows(extra)
        cols = {
            "id": hsid, "parent": parent, "name": names, "cat": cats, "thread": r["uuid"][hb_rows],
            "host_begin": hb, "host_end": he, "track": np.where(on, r["uuid"][d], 0), "dev_queued": ds,
            "dev_submit": ds, "dev_start": ds, "dev_end": de, "raw_start": raws, "raw_end": rawe,
            "status": failed.astype(np.int8),
            "site": self._sites(got, r["site"][hb_rows], extra, stacks),
            "path": self._paths(hsid, parent, names, cats),
        }
        return SpanBatch(self.tables, cols, attrs, errors), pending

    def _sites(self, got: dict[str, Any], site: np.ndarray, extra: np.ndarray, stacks: list[Any]) -> np.ndarray:
        out = np.full(len(site), -1, np.int32)
        has = np.flatnonzero(site >= 0)
        if not len(has):
            return out
        locs = self._runs.locations(got)
        m = len(stacks) + 1
        pairs, inverse = np.unique(site[has] * m + extra[has] + 1, return_inverse=True)
        ids = [self.tables.sites.id(with_callers(locs[loc], stacks[run - 1] if run else None))
               for loc, run in zip((pairs // m).tolist(), (pairs % m).tolist())]
        out[has] = np.array(ids, np.int32)[inverse]
        return out


def _settle(r: dict[str, np.ndarray], before: int | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The slices among rows ``r``: (BEGIN row, END row) of each, and which of them may go out now (their
    BEGIN before packet ``before``; all where None). Pairs are read a window after their rows arrive: a
    write of the sink cut by a window's end is then whole, and events the sink held back for a parent have
    come with it, so the pairs are those the whole file gives."""
    all_b, all_e = _pairs(r["uuid"], r["ts"], r["index"], r["type"] == BEGIN)
    old = r["index"][all_b] < before if before is not None else np.ones(len(all_b), bool)
    return all_b, all_e, old


class _Runs:
    """The distinct runs of other annotations (and source locations) seen so far, each parsed once."""

    def __init__(self) -> None:
        self.attrs: list[Any] = []
        self.failed: list[bool] = []
        self.errors: list[str | None] = []
        self.stacks: list[Any] = []
        self._locs: list[Any] = []

    def update(self, got: dict[str, Any], dnames: Any, strings: Any) -> None:
        *cols, text = got["extras"]
        off, ln, key = (np.frombuffer(b, np.int64).tolist() for b in cols)
        for o, n, k in zip(off[len(self.attrs):], ln[len(self.attrs):], key[len(self.attrs):]):
            run = _extras_of_run(text[o:o + n], dnames.get((k >> 20, k & 0xFFFFF), {}),
                                 strings.get((k >> 20, k & 0xFFFFF), {}))
            if run is None:
                raise _Foreign
            a, f, e, s = run
            self.attrs.append(a)
            self.failed.append(f)
            self.errors.append(e)
            self.stacks.append(s)

    def locations(self, got: dict[str, Any]) -> list[Any]:
        self._locs += _site_locations(got["sites"], len(self._locs))
        return self._locs

    def rows(self, extra: np.ndarray) -> tuple[np.ndarray, dict[int, str], list[Any], list[Any]]:
        n = len(extra)
        failed = np.zeros(n, bool)
        errors: dict[int, str] = {}
        if not self.attrs:
            return failed, errors, [None] * n, self.stacks
        has = extra >= 0
        failed[has] = np.array(self.failed, bool)[extra[has]]
        with_error = [k for k, e in enumerate(self.errors) if e is not None]
        errors = {i: self.errors[k] for i, k in zip(*(a.tolist() for a in _rows_of(extra, with_error)))}
        table = np.empty(len(self.attrs) + 1, object)
        table[:-1] = self.attrs
        table[-1] = None
        return failed, errors, table[extra].tolist(), self.stacks
