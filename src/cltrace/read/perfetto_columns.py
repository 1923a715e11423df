"""A ``.pftrace`` written by cltrace, read into a ``SpanBatch`` without a Python object per packet.

The scanner (``scan.NATIVE.pftrace``) walks the packets once, keeping each sequence's state as
``perfetto._Reader`` keeps it (defaults, incremental clocks, interned names, the device-stamp offset),
and hands back one row per slice BEGIN/END. Here, with numpy: slices are paired per track after a
stable sort by time (a stack, as the general reader pairs them: an END with nothing open is skipped),
host and device slices are joined by span id, and names, categories and attributes are looked up once
per distinct value. Descriptors, counters and the metadata instant are few: Python reads them with the
perfetto protos. The result is what ``perfetto.load_pftrace`` gives, as columns; a file outside the
layout (inline names, duplicate span ids, out-of-range values...) returns None for the general reader.
"""
from __future__ import annotations

import json
from typing import Any

import numpy as np
from google.protobuf.message import DecodeError
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

from ..errors import TraceFileError
from ..export.perfetto.wire import (A_DEV_END, A_DEV_START, A_ERROR, A_PARENT, A_SPAN, A_STATUS, BEGIN, COUNTER,
                                    DROPPED_TRACK, INSTANT, METADATA_EVENT)
from ..timeline.batch import SpanBatch, Tables
from ..timeline.spans import STATUS_ERROR
from . import checks
from .perfetto import _annotation_value, _str, note_track
from .scan import P_COLS
from .tree import path_ids

_RESERVED = {A_SPAN, A_PARENT, A_STATUS, A_ERROR, A_DEV_START, A_DEV_END}
_STANDARD = {A_SPAN, A_PARENT, A_DEV_START, A_DEV_END}  # the scanner reads these itself
_LIMIT = 1 << 62


class _Rest:
    """Descriptors, counters and metadata: the packets the scanner leaves to Python."""

    def __init__(self) -> None:
        self.counter_names: dict[int, str] = {}
        self.track_names: dict[int, tuple[str, int]] = {}
        self.meta: dict[str, Any] = {}
        self.dropped = 0
        self.closed = False

    def packet(self, p: Any, uuid: int) -> None:
        if p.HasField("track_descriptor"):
            note_track(p.track_descriptor, self.counter_names, self.track_names)
            return
        te = p.track_event
        if te.type == COUNTER and self.counter_names.get(uuid) == DROPPED_TRACK:
            self.dropped = max(self.dropped, te.counter_value)
        elif te.type == INSTANT and te.name == METADATA_EVENT:
            for a in te.debug_annotations:
                if a.name == "json":
                    try:
                        meta = json.loads(a.string_value)
                    except (ValueError, RecursionError):
                        raise TraceFileError("corrupt Perfetto trace: cltrace.metadata is not JSON") from None
                    self.meta = checks.metadata(meta)
                    self.closed = self.closed or "recorded_spans" in meta


def _pairs(uuid: np.ndarray, ts: np.ndarray, index: np.ndarray, begin: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(BEGIN row, its END row) of each slice: per track in (time, file) order, each END closes the
    latest open BEGIN; an END with nothing open is skipped, a BEGIN never closed is left out."""
    order = np.lexsort((index, ts, uuid))
    u = uuid[order]
    cuts = np.flatnonzero(u[1:] != u[:-1]) + 1
    bs, es = [], []
    for lo, hi in zip(np.r_[0, cuts].tolist(), np.r_[cuts, len(u)].tolist()):
        rows = order[lo:hi]
        step = np.where(begin[rows], 1, -1)
        s = np.cumsum(step)
        depth = s - np.minimum.accumulate(np.minimum(s, 0))  # open slices after each row (never below 0)
        before = np.r_[0, depth[:-1]]
        is_b = begin[rows]
        closes = ~is_b & (before > 0)
        level = np.where(is_b, depth, before)
        keep = is_b | closes
        r, lv, b = rows[keep], level[keep], is_b[keep]
        o = np.argsort(lv, kind="stable")  # per level: BEGIN, END, BEGIN, END...
        r, lv, b = r[o], lv[o], b[o]
        m = b[:-1] & ~b[1:] & (lv[:-1] == lv[1:])
        bs.append(r[:-1][m])
        es.append(r[1:][m])
    if not bs:
        e = np.zeros(0, np.int64)
        return e, e
    return np.concatenate(bs), np.concatenate(es)


def _repeats(v: np.ndarray) -> bool:
    s = np.sort(v)
    return bool((s[1:] == s[:-1]).any())


def load_pftrace_columns(path: str, scanner: Any) -> tuple[SpanBatch, dict[str, Any]] | None:
    """The spans and metadata of a cltrace ``.pftrace``, as ``perfetto.load_pftrace`` reads them, or None
    where the file is not in cltrace's layout."""
    with open(path, "rb") as fh:
        data = fh.read()
    if not data:
        return None
    got = scanner.pftrace(data)
    if got is None or not got["packets"] or not got["first_snapshot"]:
        return None
    try:
        return _build(data, got)
    except (TraceFileError, DecodeError, ValueError, RecursionError):
        return None  # the general reader says what is wrong


Interned = dict[tuple[int, int], dict[int, str]]  # (sequence, generation) -> iid -> text


def _names(data: bytes, got: dict[str, Any]) -> tuple[list[str | None], Interned, Interned]:
    """Text of every interned entry (None for string values: they are no span's name or category), and
    the debug annotation names and string values per (sequence, generation) (the scanner's tables 2, 3)."""
    seq, gen, table, iid, off, ln = (np.frombuffer(b, np.int64).tolist() for b in got["entries"])
    texts = [_str(data[o:o + n]) for o, n in zip(off, ln)]
    dnames: Interned = {}
    strings: Interned = {}
    for s, g, t, i, text in zip(seq, gen, table, iid, texts):
        if t >= 2:
            (dnames if t == 2 else strings).setdefault((s, g), {})[i] = text
    return [None if t == 3 else text for t, text in zip(table, texts)], dnames, strings


def _extras(data: bytes, got: dict[str, Any], dnames: Interned, strings: Interned
            ) -> tuple[list[Any], list[bool], list[str | None]] | None:
    """Per distinct run of other annotations: attributes (None: none), failed, error text."""
    off, ln, key = (np.frombuffer(b, np.int64).tolist() for b in got["extras"])
    attrs: list[Any] = []
    failed: list[bool] = []
    errors: list[str | None] = []
    for o, n, k in zip(off, ln, key):
        names = dnames.get((k >> 20, k & 0xFFFFF), {})
        values = strings.get((k >> 20, k & 0xFFFFF), {})
        te = pb.TrackEvent.FromString(data[o:o + n])
        ann: dict[str, Any] = {}
        for a in te.debug_annotations:
            name = _str(a.name) if a.HasField("name") else names.get(a.name_iid, f"#{a.name_iid}")
            ann.setdefault(name, _annotation_value(a, values))
        if _STANDARD.intersection(ann):
            return None
        bad = ann.get(A_STATUS) == STATUS_ERROR
        error = ann.get(A_ERROR) if bad else None
        attrs.append({k2: v for k2, v in ann.items() if k2 not in _RESERVED} or None)
        failed.append(bad)
        errors.append(None if error is None else checks.text(error, "error"))
    return attrs, failed, errors


def _build(data: bytes, got: dict[str, Any]) -> tuple[SpanBatch, dict[str, Any]] | None:
    rest = _Rest()
    for o, n, _, uuid in zip(*(np.frombuffer(b, np.int64).tolist() for b in got["python"])):
        rest.packet(pb.TracePacket.FromString(data[o:o + n]), uuid)
    texts, dnames, strings = _names(data, got)
    ext = _extras(data, got, dnames, strings)
    if ext is None:
        return None
    ex_attrs, ex_failed, ex_errors = ext
    r = {name: np.frombuffer(b, np.int64) for name, b in zip(P_COLS, got["rows"])}
    all_b, all_e = _pairs(r["uuid"], r["ts"], r["index"], r["type"] == BEGIN)
    end_ts = np.zeros(len(r["ts"]), np.int64)
    end_ts[all_b] = r["ts"][all_e]
    b_rows = np.sort(all_b[r["sid_kind"][all_b] != 0])  # slices without a span id are not spans
    is_dev = r["dev"][b_rows] != 0
    hrows, drows = b_rows[~is_dev], b_rows[is_dev]
    hsid, dsid = r["sid"][hrows], r["sid"][drows]
    for col in (hsid, dsid, r["parent"][hrows], r["raw_start"][drows], r["raw_end"][drows]):
        if ((col >= _LIMIT) | (col <= -_LIMIT)).any():
            return None  # the general reader names the out-of-range value
    if _repeats(hsid) or _repeats(dsid):
        return None  # a span id twice: which one counts depends on the general reader's order
    if (r["uuid"][hrows] < 0).any() or (r["uuid"][drows] <= 0).any():
        return None  # track uuids beyond int64, or a device slice on track 0
    dorder = np.argsort(dsid)
    ds_sorted = dsid[dorder]
    at = np.minimum(np.searchsorted(ds_sorted, hsid), max(len(dsid) - 1, 0))
    on = (ds_sorted[at] == hsid) if len(dsid) else np.zeros(len(hsid), bool)
    d = drows[dorder[at]] if len(dsid) else np.zeros(len(hsid), np.int64)
    hb, he = r["ts"][hrows], end_ts[hrows]
    ds, de = np.where(on, r["ts"][d], 0), np.where(on, end_ts[d], 0)
    raws = np.where(on, r["raw_start"][d], 0)
    rawe = np.where(on, np.where(r["has_raw_end"][d] != 0, r["raw_end"][d], raws + (de - ds)), 0)
    final = np.lexsort((hsid, hb))  # spans by (host begin, id), as the general reader sorts them
    hrows, hsid, hb, he, on, ds, de, raws, rawe = (a[final] for a in (hrows, hsid, hb, he, on, ds, de, raws, rawe))
    d = d[final]

    tables = Tables()
    name_ids = np.array([0 if t is None else tables.names.id(t) for t in texts] or [0], np.int32)
    names = name_ids[r["name"][hrows]]
    cat_ent = r["cat"][hrows]
    cat_ids = np.array([0 if t is None else tables.cats.id(t) for t in texts] + [tables.cats.id("?")], np.int16)
    cats = cat_ids[cat_ent]  # -1: the "?" at the end
    n = len(hrows)
    extra = r["extra"][hrows]
    has = extra >= 0
    failed = np.zeros(n, bool)
    errors: dict[int, str] = {}
    if ex_attrs:
        failed[has] = np.array(ex_failed, bool)[extra[has]]
        errors = {int(i): ex_errors[int(extra[i])] for i in np.flatnonzero(has).tolist()
                  if ex_errors[int(extra[i])] is not None}
        table = np.empty(len(ex_attrs) + 1, object)
        table[:-1] = ex_attrs
        table[-1] = None
        attrs = table[extra].tolist()
    else:
        attrs = [None] * n
    cols = {
        "id": hsid, "parent": np.where(r["has_parent"][hrows] != 0, r["parent"][hrows], 0), "name": names,
        "cat": cats, "thread": r["uuid"][hrows], "host_begin": hb, "host_end": he,
        "track": np.where(on, r["uuid"][d], 0), "dev_queued": ds, "dev_submit": ds, "dev_start": ds, "dev_end": de,
        "raw_start": raws, "raw_end": rawe, "status": failed.astype(np.int8),
    }
    paths = path_ids(cols["id"], cols["parent"], names, tables, cats)
    if paths is None:
        return None
    cols["path"] = paths
    batch = SpanBatch(tables, cols, attrs, errors)
    meta = rest.meta
    meta["dropped_spans"] = max(rest.dropped, meta.get("dropped_spans", 0))
    meta.setdefault("recorded_spans", n)
    tn = rest.track_names
    meta.setdefault("tracks", {str(u): {"name": nm, "process": tn.get(parent, ("", 0))[0]}
                               for u, (nm, parent) in tn.items()})
    if got["end"] < len(data) or not rest.closed:
        checks.cut_off(meta, int(got["end"]), len(data), int(got["packets"]), 0, "packets")
    return batch, meta
