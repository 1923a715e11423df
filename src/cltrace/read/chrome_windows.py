"""A cltrace Chrome JSON trace of any size read a window of lines at a time (``windows.py`` for ``.pftrace``).

The native scanner keeps its names, categories and attribute texts from one window to the next
(``_scan.chrome_open``/``chrome_feed``); each window is the file's next ``window_bytes`` cut after its last
whole line. A span is the first X event of its id, its device placement the event after it (cltrace's
writer puts a command's two events on adjacent lines), so a window's events are grouped by id together
with the events the window before left waiting: a span goes out once its first event is a window behind
the newest lines and, where the file has a second event of its id, that one has come. The first pass
reads the other lines (metadata, track names, counters: ``chrome_columns._others``), counts the spans,
notes the ids with a second event, and makes the paths of the spans that are parents, as for a
``.pftrace``. What the batches hold is what ``load_chrome_columns`` gives, batch by batch
(``tests/test_windows.py``).
"""
from __future__ import annotations

import json
import os
from typing import Any, Iterator

import numpy as np

from ..errors import TraceFileError
from ..timeline.batch import SpanBatch, Tables
from . import checks
from .chrome import Others
from .chrome_columns import _others, extra_of
from .scan import X_COLS
from .window_base import LEAF_CATS, SidSet, WindowedTrace, _Foreign, give_back

WINDOW_BYTES = 16 << 20  # of the file a window: ~25-60k events, ~5 MB of the scanner's columns


class _Texts:
    """Names, categories and attribute texts seen so far, each parsed once (the scanner's tables grow)."""

    def __init__(self, tables: Tables) -> None:
        self.tables = tables
        self.names: list[int] = []
        self.cats: list[int] = []
        self.attrs: list[Any] = []
        self.failed: list[bool] = []
        self.errors: list[str | None] = []
        self.sites: list[int] = []

    def update(self, got: dict[str, Any]) -> None:
        t = self.tables
        try:
            for o, n, text in _new(got["names"], len(self.names)):
                self.names.append(t.names.id(checks.text(json.loads(text[o:o + n]), "'name'")))
            for o, n, text in _new(got["cats"], len(self.cats)):
                self.cats.append(t.cats.id(checks.text(text[o:o + n].decode("utf-8"), "'cat'")))
            for o, n, text in _new(got["extras"], len(self.attrs)):
                extra = extra_of(text[o:o + n])
                if extra is None:
                    raise _Foreign
                attrs, site, failed, error = extra
                self.attrs.append(attrs)
                self.sites.append(-1 if site is None else t.sites.id(site))
                self.failed.append(failed)
                self.errors.append(error)
        except (ValueError, UnicodeDecodeError, RecursionError, TraceFileError):
            raise _Foreign from None


def _new(table: tuple[bytes, ...], start: int) -> Iterator[tuple[int, int, bytes]]:
    *cols, text = table
    off, ln, _ = (np.frombuffer(b, np.int64)[start:].tolist() for b in cols)
    for o, n in zip(off, ln):
        yield o, n, text


class ChromeWindows(WindowedTrace):
    """A Chrome JSON trace in windows (the module docstring)."""

    def __init__(self, path: str, scanner: Any, window_bytes: int, tables: Tables) -> None:
        super().__init__(path, scanner, window_bytes, tables)
        self._texts = _Texts(tables)

    def _windows(self) -> Iterator[tuple[dict[str, Any], bytes, int, bool]]:
        """(scanner's result, the window's bytes, where they start in the file, whether it is the last)."""
        state = self.scanner.chrome_open()
        with open(self.path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            carry, at, want = b"", 0, self.window_bytes
            while True:
                chunk = fh.read(want)
                last = fh.tell() >= size or not chunk
                buf = carry + chunk if carry else chunk
                got = self.scanner.chrome_feed(state, buf, last)
                if got is None:
                    raise _Foreign
                yield got, buf, at, last
                if last:
                    return
                used = int(got["consumed"])
                carry = buf[used:]
                at += used
                want = self.window_bytes if used else 2 * want  # a line longer than the window: a longer one

    # -- pass 1 -------------------------------------------------------------------------------------------
    def _first_pass(self) -> bool:
        others = Others()
        seen = SidSet()
        leaf = [self.tables.cats.id(c) for c in LEAF_CATS]
        ids, parents, names, cats = [], [], [], []
        readable = others_n = spans = events = 0
        last_good, bad_before = 0, False
        try:
            for got, data, at, last in self._windows():
                self._texts.update(got)
                seen_here = _others(data, got, others)
                if seen_here is None:
                    raise _Foreign
                n_read, end = seen_here
                if bad_before and (n_read or int(got["events"]) > events):
                    raise _Foreign  # an unreadable line before readable ones: the general reader counts it
                events = int(got["events"])
                others_n += len(got["others_off"]) // 8
                bad_before = bad_before or n_read < len(got["others_off"]) // 8
                readable += n_read
                last_good = max(last_good, at + end)
                x = {c: np.frombuffer(b, np.int64) for c, b in zip(X_COLS, got["x"])}
                sid = x["sid"]
                u, first = np.unique(sid, return_index=True)
                again = seen.contains(u)
                self._has_device.add(u[again])  # a second event of an id seen before
                counts = np.bincount(np.searchsorted(u, sid), minlength=len(u))
                self._has_device.add(u[counts > 1])
                host = np.sort(first[~again])
                seen.add(sid[host])
                spans += len(host)
                self._is_parent.add(x["parent"][host][x["parent"][host] != 0])
                cat = np.array(self._texts.cats, np.int64)[x["cat"][host]] if len(host) else np.zeros(0, np.int64)
                branch = ~np.isin(cat, leaf)
                h = host[branch]
                ids.append(x["sid"][h])
                parents.append(x["parent"][h])
                names.append(np.array(self._texts.names, np.int64)[x["name"][h]] if len(h) else np.zeros(0, np.int64))
                cats.append(cat[branch])
                if last:
                    self._last = (got, readable, others_n, last_good)
        except _Foreign:
            return False
        got, readable, others_n, last_good = self._last
        self._complete = bool(got["closed"] and got["commas_ok"] and readable == others_n)
        if not self._complete and not int(got["events"]) + readable:
            return False
        self._events = int(got["events"]) + readable
        self._last_good = last_good
        self._others, self._spans = others, spans
        cand = [np.concatenate(p) for p in (ids, parents, names, cats)]
        del ids, parents, names, cats
        ok = self._set_parents(*cand)
        del cand
        give_back()
        return ok

    def metadata(self) -> dict[str, Any]:
        """The file's metadata, as the whole-file reader gives it."""
        o = self._others
        kept = o.meta
        o.meta = dict(kept)  # finish fills in the metadata it is given: a copy each time
        try:
            meta = o.finish(self._spans)
        finally:
            o.meta = kept
        if not self._complete:
            checks.cut_off(meta, int(self._last_good), os.path.getsize(self.path), self._events, 0, "events")
        return meta

    # -- pass 2 -------------------------------------------------------------------------------------------
    ORDER = "line"

    def _rows_by_window(self) -> Iterator[tuple[dict[str, np.ndarray], bool, tuple[Any, ...]]]:
        for got, _data, _at, last in self._windows():
            self._texts.update(got)
            yield {c: np.frombuffer(b, np.int64) for c, b in zip(X_COLS, got["x"])}, last, ()

    def _round(self, x: dict[str, np.ndarray], before: int | None) -> tuple[SpanBatch | None, dict[str, np.ndarray]]:
        sid = x["sid"]
        order = np.argsort(sid, kind="stable")  # rows come in line order: the first of an id is its host event
        s = sid[order]
        starts = np.r_[True, s[1:] != s[:-1]] if len(s) else np.zeros(0, bool)
        first = order[starts]
        count = np.diff(np.r_[np.flatnonzero(starts), len(s)])
        second = np.minimum(np.flatnonzero(starts) + 1, max(len(s) - 1, 0))
        dev_of = np.where(count > 1, order[second], -1) if len(s) else first
        go = np.ones(len(first), bool)
        if before is not None:
            go = (x["line"][first] < before) & ((count > 1) | ~self._has_device.contains(s[starts]))
        host, dev = first[go], dev_of[go]
        used = np.zeros(len(sid), bool)
        used[host] = True
        used[dev[dev >= 0]] = True
        pending = {c: v[~used] for c, v in x.items()} if before is not None else {}
        if not len(host):
            return None, pending
        o = np.argsort(x["line"][host], kind="stable")  # spans in the order their first event comes
        host, dev = host[o], dev[o]
        on = dev >= 0
        if (on & (x["device"][host] == 0)).any() or (x["tid"][dev[on]] == 0).any():
            raise _Foreign  # device slices of a span whose args lack the device stamps, or on track 0
        t = self._texts
        name_lut = np.array(t.names or [0], np.int32)
        cat_lut = np.array(t.cats or [0], np.int16)
        n = len(host)
        extra = x["extra"][host]
        has = extra >= 0
        failed = np.zeros(n, bool)
        errors: dict[int, str] = {}
        if t.attrs:
            failed[has] = np.array(t.failed, bool)[extra[has]]
            with_error = [(int(i), t.errors[int(extra[i])]) for i in np.flatnonzero(has).tolist()
                          if t.errors[int(extra[i])] is not None]
            if any(not failed[i] for i, _ in with_error):
                raise _Foreign  # an error text on a span that did not fail
            errors = dict(with_error)
            table = np.empty(len(t.attrs) + 1, object)
            table[:-1] = t.attrs
            table[-1] = None
            attrs = table[extra].tolist()
            site = np.array(t.sites + [-1], np.int32)[extra]
        else:
            attrs = [None] * n
            site = np.full(n, -1, np.int32)
        d = np.where(on, dev, 0)
        dts = np.where(on, x["ts"][d], 0)
        names, cats = name_lut[x["name"][host]], cat_lut[x["cat"][host]]
        cols = {
            "id": x["sid"][host], "parent": x["parent"][host], "name": names, "cat": cats,
            "thread": x["tid"][host], "host_begin": x["ts"][host], "host_end": x["ts"][host] + x["dur"][host],
            "track": np.where(on, x["tid"][d], 0), "dev_queued": np.where(on, x["queued"][host], 0),
            "dev_submit": np.where(on, x["submit"][host], 0), "dev_start": dts,
            "dev_end": np.where(on, dts + x["dur"][d], 0), "raw_start": np.where(on, x["raw_start"][host], 0),
            "raw_end": np.where(on, x["raw_end"][host], 0), "status": failed.astype(np.int8), "site": site,
        }
        cols["path"] = self._paths(cols["id"], cols["parent"], names, cats)
        return SpanBatch(self.tables, cols, attrs, errors), pending
