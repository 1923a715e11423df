"""Chrome JSON written by cltrace, read into a ``SpanBatch`` without a Python object per event.

The scanner (``scan.NATIVE.chrome``) reads the X event lines of cltrace's own layout (one event per
line, fields in the writer's order) into columns; Python parses only what is per distinct value (names,
categories, the attribute texts after the fixed args) and the few other lines (track names, metadata,
dropped-span counters). The result is what ``chrome.load_chrome`` gives for the same file, as columns:
a span per first X event of an id, its device placement from the last one after it; a file cut off
(no closing ``]``, a torn last line) is noted the same way. Anything else (a foreign layout, a corrupt
line in the middle, out-of-range values) returns None, and the general reader takes the file.
"""
from __future__ import annotations

import json
import os
from typing import Any

import numpy as np

from ..errors import TraceFileError
from ..timeline import sites
from ..timeline.batch import SpanBatch, Tables
from . import checks
from .chrome import _RESERVED, Others
from .scan import X_COLS
from .tree import path_ids

_TEXT_ARGS = frozenset({"status", "error"})


def _table(raw: tuple[bytes, bytes, bytes]) -> tuple[list[int], list[int]]:
    off, ln, _ = (np.frombuffer(b, np.int64) for b in raw)
    return off.tolist(), ln.tolist()


def _cols(raw: tuple[bytes, ...], names: tuple[str, ...]) -> dict[str, np.ndarray]:
    return {n: np.frombuffer(b, np.int64) for n, b in zip(names, raw)}


def _others(data: bytes, got: dict[str, Any], others: Others) -> tuple[int, int] | None:
    """Read the lines the scanner left: (readable events, end of the last readable one), or None where
    the general reader must decide (an unreadable line before a readable one, a span slice)."""
    offs = np.frombuffer(got["others_off"], np.int64).tolist()
    lens = np.frombuffer(got["others_len"], np.int64).tolist()
    ends = np.frombuffer(got["others_end"], np.int64).tolist()
    lines = np.frombuffer(got["others_line"], np.int64).tolist()
    readable = 0
    last = got["read_end"]
    first_bad = None
    for off, n, end, line in zip(offs, lens, ends, lines):
        try:
            text = data[off:off + n].decode("utf-8")
        except UnicodeDecodeError:
            return None
        s = text.strip()
        if s != text:
            return None  # whitespace JSON does not take: let the general reader judge the line
        try:
            ev = json.loads(s)
        except (ValueError, RecursionError):
            if first_bad is None:
                first_bad = off
            continue
        if not isinstance(ev, dict):
            return None
        readable += 1
        last = max(last, end)
        ph = ev.get("ph")
        if ph == "X":
            args = ev.get("args")
            if args is None or (isinstance(args, dict) and args.get("span") is None):
                continue
            return None  # a span slice in another layout
        others.event(ev, ph, f"event {line}")
    if first_bad is not None and first_bad < last:
        return None  # skipped lines: the general reader counts them
    return readable, last


def extra_of(raw: bytes) -> tuple[Any, Any, bool, str | None] | None:
    """One distinct text after the fixed args (``,"key":value...``): attributes (None: none), call site,
    failed, error text; None where the general reader must judge it."""
    try:
        d = json.loads(b"{" + raw[1:] + b"}")
    except (ValueError, RecursionError):
        return None
    if not isinstance(d, dict) or any(k in _RESERVED and k not in _TEXT_ARGS for k in d):
        return None
    status, error = d.get("status"), d.get("error")
    if not checks.plain(d):
        return None  # the general reader, which knows each span's category, says whether it matters
    return (checks.attrs({k: v for k, v in d.items() if k not in _RESERVED and k not in sites.KEYS}, "'args'") or None,
            sites.from_attrs(d), status == "error", None if error is None else checks.text(error, "'args.error'"))


def _extras(data: bytes, raw: tuple[bytes, bytes, bytes]) -> tuple[list[Any], list[bool], list[str | None],
                                                                  list[Any]] | None:
    """Per distinct text after the fixed args: attributes (None: none), failed, error text, call site."""
    attrs: list[Any] = []
    found: list[Any] = []
    failed: list[bool] = []
    errors: list[str | None] = []
    for off, n in zip(*_table(raw)):
        got = extra_of(data[off:off + n])
        if got is None:
            return None
        attrs.append(got[0])
        found.append(got[1])
        failed.append(got[2])
        errors.append(got[3])
    return attrs, failed, errors, found


def load_chrome_columns(path: str, scanner: Any) -> tuple[SpanBatch, dict[str, Any]] | None:
    """The spans and metadata of a cltrace Chrome JSON file, as ``chrome.load_chrome`` reads them, or None
    where the file is not in cltrace's layout."""
    with open(path, "rb") as fh:
        data = fh.read()
    got = scanner.chrome(data)
    if got is None:
        return None
    try:
        texts = _texts(data, got)
        del data  # the file's bytes go before the columns are built: never both in memory
        return None if texts is None else _build(path, got, texts)
    except TraceFileError:
        return None  # the general reader names the field and the event


class _Texts:
    """What the columns need of the file's bytes: the other lines read, the distinct attribute texts,
    names and categories."""

    def __init__(self, others: Others, readable: int, last: int, extras: tuple[Any, ...], names: list[str],
                 cats: list[str]) -> None:
        self.others, self.readable, self.last, self.extras = others, readable, last, extras
        self.names, self.cats = names, cats


def _texts(data: bytes, got: dict[str, Any]) -> _Texts | None:
    others = Others()
    seen = _others(data, got, others)
    if seen is None:
        return None
    extras = _extras(data, got["extras"])
    if extras is None:
        return None
    try:
        names = [checks.text(json.loads(data[o:o + n]), "'name'") for o, n in zip(*_table(got["names"]))]
        cats = [checks.text(data[o:o + n].decode("utf-8"), "'cat'") for o, n in zip(*_table(got["cats"]))]
    except (ValueError, UnicodeDecodeError):
        return None
    return _Texts(others, *seen, extras, names, cats)


def _build(path: str, got: dict[str, Any], texts: _Texts) -> tuple[SpanBatch, dict[str, Any]] | None:
    others, readable, last = texts.others, texts.readable, texts.last
    complete = got["closed"] and got["commas_ok"] and readable == len(got["others_off"]) // 8
    x = _cols(got["x"], X_COLS)
    if not complete and not got["events"] + readable:
        return None
    ex_attrs, ex_failed, ex_errors, ex_sites = texts.extras
    sid = x["sid"]
    order = np.argsort(sid, kind="stable")
    s = sid[order]
    starts = np.r_[True, s[1:] != s[:-1]] if len(s) else np.zeros(0, bool)
    first = order[starts]
    ends = np.r_[starts[1:], True] if len(s) else starts
    last_of = order[ends]
    count = np.diff(np.r_[np.flatnonzero(starts), len(s)])
    host = np.sort(first)  # spans in the order their first event comes in the file
    g = np.searchsorted(s[starts], sid[host])
    dev = np.where(count[g] > 1, last_of[g], -1)
    on = dev >= 0
    if (on & (x["device"][host] == 0)).any() or (x["tid"][dev[on]] == 0).any():
        return None  # device slices of a span whose args lack the device stamps, or on track 0

    tables = Tables()
    name_lut = np.array([tables.names.id(v) for v in texts.names] or [0], np.int32)
    cat_lut = np.array([tables.cats.id(v) for v in texts.cats] or [0], np.int16)
    n = len(host)
    extra = x["extra"][host]
    has_extra = extra >= 0
    failed = np.zeros(n, bool)
    if len(ex_failed):
        failed[has_extra] = np.array(ex_failed, bool)[extra[has_extra]]
        err_rows = np.flatnonzero(has_extra)
        with_error = [(int(i), ex_errors[int(extra[i])]) for i in err_rows.tolist() if ex_errors[int(extra[i])] is not None]
        if any(not failed[i] for i, _ in with_error):
            return None  # an error text on a span that did not fail: the batch keeps errors of failed ones
        errors = dict(with_error)
        table = np.empty(len(ex_attrs) + 1, object)
        table[:-1] = ex_attrs
        table[-1] = None
        attrs = table[extra].tolist()  # -1: the None at the end
        site_ids = np.array([-1 if c is None else tables.sites.id(c) for c in ex_sites] + [-1], np.int32)
        site = site_ids[extra]
    else:
        errors = {}
        attrs = [None] * n
        site = np.full(n, -1, np.int32)
    dts = np.where(on, x["ts"][dev], 0)
    cols = {
        "id": sid[host], "parent": x["parent"][host], "name": name_lut[x["name"][host]],
        "cat": cat_lut[x["cat"][host]], "thread": x["tid"][host], "host_begin": x["ts"][host],
        "host_end": x["ts"][host] + x["dur"][host], "track": np.where(on, x["tid"][dev], 0),
        "dev_queued": np.where(on, x["queued"][host], 0), "dev_submit": np.where(on, x["submit"][host], 0),
        "dev_start": dts, "dev_end": np.where(on, dts + x["dur"][dev], 0),
        "raw_start": np.where(on, x["raw_start"][host], 0), "raw_end": np.where(on, x["raw_end"][host], 0),
        "status": failed.astype(np.int8), "site": site,
    }
    paths = path_ids(cols["id"], cols["parent"], cols["name"], tables, cols["cat"])
    if paths is None:
        return None
    cols["path"] = paths
    batch = SpanBatch(tables, cols, attrs, errors)
    meta = others.finish(n)
    if not complete:
        checks.cut_off(meta, int(last), os.path.getsize(path), int(got["events"] + readable), 0, "events")
    return batch, meta
