"""A ``.pftrace`` written by cltrace, read into a ``SpanBatch`` without a Python object per packet.

The scanner (``scan.NATIVE.pftrace``) walks the packets once, keeping each sequence's state as
``perfetto._Reader`` keeps it (defaults, incremental clocks, interned names and source locations, the
device-stamp offset), and hands back one row per slice BEGIN/END and one per COUNTER sample. Here, with
numpy: slices are paired per track after a stable sort by time (a stack, as the general reader pairs
them: an END with nothing open is skipped), host and device slices are joined by span id, and names,
categories, call sites and attributes are looked up once per distinct value; counter samples are named
by the counter track descriptor before them in the file (device memory, dropped spans). Descriptors and
the metadata instant are few: Python reads them with the perfetto protos. The result is what
``perfetto.load_pftrace`` gives, as columns; a file outside the layout (inline names, duplicate span ids,
out-of-range values...) returns None for the general reader.
"""
from __future__ import annotations

from typing import Any

import numpy as np
from google.protobuf.message import DecodeError
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

from ..errors import TraceFileError
from ..export.perfetto.wire import (A_DEV_END, A_DEV_START, A_ERROR, A_PARENT, A_SPAN, A_STATUS, BEGIN,
                                    DROPPED_TRACK, INSTANT, METADATA_EVENT, uv)
from ..record.memory import COUNTER_PREFIX
from ..timeline import sites
from ..timeline.batch import SpanBatch, Tables
from ..timeline.spans import STATUS_ERROR
from . import checks
from .inflate import Expanded, expand
from .perfetto import metadata_of, _annotation_value, _site, _str, note_track, tracks_meta, with_callers
from .scan import C_COLS, P_COLS
from .tree import path_ids

_RESERVED = {A_SPAN, A_PARENT, A_STATUS, A_ERROR, A_DEV_START, A_DEV_END, sites.STACK}
_STANDARD = {A_SPAN, A_PARENT, A_DEV_START, A_DEV_END}  # the scanner reads these itself
_LIMIT = 1 << 62


class _Rest:
    """Descriptors and metadata: the packets the scanner leaves to Python."""

    def __init__(self) -> None:
        self.counter_names: dict[int, str] = {}
        self.track_names: dict[int, tuple[str, int, int]] = {}
        self.pids: dict[int, int] = {}  # pid -> its process track's uuid
        self.counter_tracks: dict[int, tuple[list[int], list[str]]] = {}  # uuid -> (packet index, name) each time
        self.meta: dict[str, Any] = {}
        self.closed = False

    def packet(self, p: Any, index: int) -> None:
        if p.HasField("track_descriptor"):
            td = p.track_descriptor
            note_track(td, self.counter_names, self.track_names, self.pids)
            if td.HasField("counter"):
                at, names = self.counter_tracks.setdefault(td.uuid, ([], []))
                at.append(index)
                names.append(self.counter_names[td.uuid])
            return
        te = p.track_event
        if te.type == INSTANT and te.name == METADATA_EVENT:
            for meta in metadata_of(te):
                self.meta = meta
                self.closed = self.closed or "recorded_spans" in meta


def _counters(got: dict[str, Any], rest: _Rest) -> tuple[int, dict[str, list[tuple[int, int]]]]:
    """Dropped spans and device-memory samples per context label, from the COUNTER rows: each sample
    is named by the last counter descriptor of its track before it in the file, as the general reader
    names it."""
    c = {name: np.frombuffer(b, np.int64) for name, b in zip(C_COLS, got["counters"])}
    index, uuid, ts, value = c["index"], c["uuid"], c["ts"], c["value"]
    dropped = 0
    found: list[tuple[int, str, np.ndarray]] = []  # (first index, label, rows) of each memory counter
    for track, (at, names) in rest.counter_tracks.items():
        rows = np.flatnonzero(uuid == (track - (1 << 64) if track >= 1 << 63 else track))
        if not len(rows):
            continue
        which = np.searchsorted(np.array(at, np.int64), index[rows]) - 1  # -1: before any descriptor
        for k, name in enumerate(names):
            mine = rows[which == k]
            if not len(mine):
                continue
            if name == DROPPED_TRACK:
                dropped = max(dropped, int(value[mine].max()))
            elif name.startswith(COUNTER_PREFIX):
                found.append((int(index[mine[0]]), name[len(COUNTER_PREFIX):], mine))
    memory: dict[str, list[tuple[int, int]]] = {}
    for _, label, mine in sorted(found, key=lambda f: f[0]):  # labels in the order the file first has them
        memory.setdefault(label, []).extend(zip(ts[mine].tolist(), value[mine].tolist()))
    return dropped, {k: sorted(v) for k, v in memory.items()}


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


def _rows_of(extra: np.ndarray, runs: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """(row, run) of the rows whose annotation run is one of ``runs``."""
    rows = np.flatnonzero(np.isin(extra, runs)) if runs else np.zeros(0, np.int64)
    return rows, extra[rows]


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
    expanded = expand(data)
    data = expanded.data
    got = scanner.pftrace(data)
    if got is None or not got["packets"] or not got["first_snapshot"]:
        return None
    try:
        return _build(data, got, expanded)
    except (TraceFileError, DecodeError, ValueError, RecursionError):
        return None  # the general reader says what is wrong


Interned = dict[tuple[int, int], dict[int, str]]  # (sequence, generation) -> iid -> text


def _names(got: dict[str, Any], tables: Tables) -> tuple[np.ndarray, np.ndarray, Interned, Interned]:
    """Name and category ids (in ``tables``) of the interned entries, by entry (the last category id is the
    "?" of a slice without one), and the debug annotation names and string values per (sequence,
    generation) (the scanner's tables 2 and 4)."""
    *cols, text = got["entries"]
    seq, gen, table, iid, off, ln = (np.frombuffer(b, np.int64).tolist() for b in cols)
    texts = [_str(text[o:o + n]) for o, n in zip(off, ln)]
    names = np.array([tables.names.id(x) if t == 1 else -1 for x, t in zip(texts, table)] or [0], np.int32)
    cats = np.array([tables.cats.id(x) if t == 0 else -1 for x, t in zip(texts, table)] + [tables.cats.id("?")],
                    np.int16)
    dnames: Interned = {}
    strings: Interned = {}
    for s, g, t, i, text in zip(seq, gen, table, iid, texts):
        if t == 2 or t == 4:
            (dnames if t == 2 else strings).setdefault((s, g), {})[i] = text
    return names, cats, dnames, strings


def _site_locations(sites: tuple[bytes, ...], start: int = 0) -> list[Any]:
    """The scanner's distinct source locations from the ``start``-th on, as call sites."""
    *cols, text = sites
    off, ln, _ = (np.frombuffer(b, np.int64)[start:].tolist() for b in cols)
    return [_site(pb.SourceLocation.FromString(text[o:o + n])) for o, n in zip(off, ln)]


def _sites(got: dict[str, Any], site: np.ndarray, extra: np.ndarray, stacks: list[Any], tables: Tables) -> np.ndarray:
    """Each span's call site id in ``tables`` (-1: none): its source location, with the callers of its
    "code.stacktrace" annotation where it has one."""
    out = np.full(len(site), -1, np.int32)
    has = np.flatnonzero(site >= 0)
    if not len(has):
        return out
    locs = _site_locations(got["sites"])
    m = len(stacks) + 1  # distinct (location, annotation run) pairs: the run's -1 (none) as 0
    pairs, inverse = np.unique(site[has] * m + extra[has] + 1, return_inverse=True)
    ids = []
    for loc, run in zip((pairs // m).tolist(), (pairs % m).tolist()):
        ids.append(tables.sites.id(with_callers(locs[loc], stacks[run - 1] if run else None)))
    out[has] = np.array(ids, np.int32)[inverse]
    return out


_TRACK_EVENT_TAG = bytes([pb.TracePacket.DESCRIPTOR.fields_by_name["track_event"].number << 3 | 2])


def _track_event(raw: bytes) -> Any:
    """A packet's TrackEvent, parsed inside its TracePacket as the general reader parses it, so that
    annotations nested past protobuf's depth limit are refused on both paths alike."""
    return pb.TracePacket.FromString(_TRACK_EVENT_TAG + uv(len(raw)) + raw).track_event


def _extras_of_run(raw: bytes, names: dict[int, str], values: dict[int, str]
                   ) -> tuple[Any, bool, str | None, Any] | None:
    """One run of other annotations (a TrackEvent's fields): attributes (None: none), failed, error text,
    call stack; None where the general reader must judge it."""
    te = _track_event(raw)
    ann: dict[str, Any] = {}
    for a in te.debug_annotations:
        name = _str(a.name) if a.HasField("name") else names.get(a.name_iid, f"#{a.name_iid}")
        ann.setdefault(name, _annotation_value(a, values))
    if _STANDARD.intersection(ann):
        return None
    bad = ann.get(A_STATUS) == STATUS_ERROR
    error = ann.get(A_ERROR) if bad else None
    if not checks.plain(ann):
        return None  # the general reader, which knows each span's category, says whether it matters
    return (checks.attrs({k2: v for k2, v in ann.items() if k2 not in _RESERVED}, "annotations") or None, bad,
            None if error is None else checks.text(error, "error"), ann.get(sites.STACK))


def _extras(got: dict[str, Any], dnames: Interned, strings: Interned
            ) -> tuple[list[Any], list[bool], list[str | None], list[Any]] | None:
    """Per distinct run of other annotations: attributes (None: none), failed, error text, call stack."""
    *cols, text = got["extras"]
    off, ln, key = (np.frombuffer(b, np.int64).tolist() for b in cols)
    attrs: list[Any] = []
    failed: list[bool] = []
    errors: list[str | None] = []
    stacks: list[Any] = []
    for o, n, k in zip(off, ln, key):
        run = _extras_of_run(text[o:o + n], dnames.get((k >> 20, k & 0xFFFFF), {}),
                             strings.get((k >> 20, k & 0xFFFFF), {}))
        if run is None:
            return None
        attrs.append(run[0])
        failed.append(run[1])
        errors.append(run[2])
        stacks.append(run[3])
    return attrs, failed, errors, stacks


_KEPT = ("uuid", "ts", "dev", "sid", "parent", "has_parent", "raw_start", "has_raw_end", "raw_end", "name", "cat",
         "extra", "site")


def _span_rows(got: dict[str, Any]) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """The scanner's BEGIN rows of the slices that are spans (paired with their END: ``end_ts``), in file
    order, with the columns the spans are built from. The scanner's rows (BEGIN and END, every column) are
    taken out of ``got`` and freed column by column as the BEGIN rows that may be spans are taken from them,
    before the pairing, which reads only the four columns it needs of every row: the scanner's rows and the
    spans' columns are never in memory together."""
    r = {name: np.frombuffer(b, np.int64) for name, b in zip(P_COLS, got.pop("rows"))}
    begin = r["type"] == BEGIN
    cand = np.flatnonzero(begin & (r["sid_kind"] != 0))  # slices without a span id are not spans
    kept = {}
    for k in P_COLS:
        if k in ("uuid", "ts", "index", "type"):
            continue
        col = r.pop(k)
        if k in _KEPT:
            kept[k] = col[cand]
        del col
    all_b, all_e = _pairs(r["uuid"], r["ts"], r.pop("index"), begin)
    del begin
    r.pop("type")
    at = np.minimum(np.searchsorted(cand, all_b), max(len(cand) - 1, 0))
    paired = cand[at] == all_b if len(cand) else np.zeros(len(all_b), bool)
    at, end_ts = at[paired], r["ts"][all_e[paired]]
    del all_b, all_e, paired
    for k in ("uuid", "ts"):
        kept[k] = r.pop(k)[cand]
    o = np.argsort(at, kind="stable")  # file order, as the rows came
    at, end_ts = at[o], end_ts[o]
    return {k: v[at] for k, v in kept.items()}, end_ts


def _build(data: bytes, got: dict[str, Any], expanded: Expanded) -> tuple[SpanBatch, dict[str, Any]] | None:
    rest = _Rest()
    for o, n, index in zip(*(np.frombuffer(b, np.int64).tolist() for b in got["python"])):
        rest.packet(pb.TracePacket.FromString(data[o:o + n]), index)
    tables = Tables()
    name_ids, cat_ids, dnames, strings = _names(got, tables)
    ext = _extras(got, dnames, strings)
    if ext is None:
        return None
    ex_attrs, ex_failed, ex_errors, ex_stacks = ext
    r, end_ts = _span_rows(got)
    is_dev = r["dev"] != 0
    hrows, drows = np.flatnonzero(~is_dev), np.flatnonzero(is_dev)
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

    names = name_ids[r["name"][hrows]]
    cats = cat_ids[r["cat"][hrows]]  # -1: the "?" at the end
    n = len(hrows)
    extra = r["extra"][hrows]
    has = extra >= 0
    failed = np.zeros(n, bool)
    errors: dict[int, str] = {}
    if ex_attrs:
        failed[has] = np.array(ex_failed, bool)[extra[has]]
        with_error = [k for k, e in enumerate(ex_errors) if e is not None]
        errors = {i: ex_errors[k] for i, k in zip(*(a.tolist() for a in _rows_of(extra, with_error)))}
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
        "site": _sites(got, r["site"][hrows], extra, ex_stacks, tables),
    }
    paths = path_ids(cols["id"], cols["parent"], names, tables, cats)
    if paths is None:
        return None
    cols["path"] = paths
    batch = SpanBatch(tables, cols, attrs, errors)
    meta = rest.meta
    dropped, memory = _counters(got, rest)
    meta["dropped_spans"] = max(dropped, meta.get("dropped_spans", 0))
    if memory:
        meta["memory_samples"] = memory
    meta.setdefault("recorded_spans", n)
    meta.setdefault("tracks", tracks_meta(rest.track_names, rest.pids))
    if got["end"] < len(data) or not rest.closed:  # the tail after the last complete packet is the file's own
        checks.cut_off(meta, expanded.file_offset(int(got["end"])), expanded.file_bytes, int(got["packets"]), 0,
                       "packets")
    expanded.note(meta)
    return batch, meta
