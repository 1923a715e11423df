"""Chrome trace-event JSON, streamed.

The file uses the JSON *array* format, one event per line, each followed by a
comma: the Trace Event Format allows the closing ``]`` to be missing, so a run
cut off after a flush still loads in ui.perfetto.dev and chrome://tracing
(``cltrace summary`` repairs it the same way). Timestamps are microseconds
with three decimals relative to the trace start (as Kineto writes them), so
nanoseconds survive the trip through a double.

Layout (``processes``; the .pftrace shows the same tree): host threads and the compile
track are threads of the host process, named after the program (``python3 train.py``);
each device is a process ("OpenCL: <device>") whose threads are its queues.
A launch's host slice and device slice are joined by a flow (``s``/``f``
events, binding to the enclosing slices, as Kineto emits them) in the slices'
own category: Chrome DevTools binds a flow event only to a slice of its category.
"""
from __future__ import annotations

import json
import os
import time
from typing import IO, Any

import numpy as np

from .base import (TraceContext, abandon_file, close_synced, open_trace_file, release_space, reserve_space,
                   start_writeback)
from ..timeline.arrays import distinct as _distinct, first_rows as _first_rows
from . import chrome_lines
from .chrome_lines import DEVICE, IDX, INTS, NO_FLOW, Tables, encode_python
from .processes import device_pid, program_name
from ..record.memory import COUNTER_ARG, counter_name
from ..timeline.batch import SpanBatch, as_batch
from ..timeline.tracks import DEVICE_QUEUE

# Rows encoded at a time: ~400 kB of text, reused from cache; one encoder call for a whole batch of
# 4096 rows writes 3 MB of fresh memory and costs ~4x more per span (benchmarks/bench_chrome.py).
_CHUNK = 512
# The text waiting for the OS: one buffer, reused (cache-warm), handed over by one write() when full or
# at a flush. The native path writes rows straight into it.
_BUFFER = 1 << 20
_FILL_FD = os.name == "posix"  # the C pass writes full buffers to the file's descriptor itself
_NO_TRACK = 1 << 22  # track ids from here on (not a registry's) take the numpy path: no lookup table that long
_CACHE = 4096  # entries each text cache holds, so it stays bounded when every span has its own name
_ERROR = b',"status":"error","error":'


def _us(ns: int) -> str:
    """Nanoseconds -> microseconds with exactly three decimals, as text (no float rounding)."""
    if ns < 0:
        ns = -ns
        return f"-{ns // 1000}.{ns % 1000:03d}"
    return f"{ns // 1000}.{ns % 1000:03d}"


_esc = json.encoder.encode_basestring  # == json.dumps(s, ensure_ascii=False), in C
_esc_ascii = json.encoder.encode_basestring_ascii


def _json_text(s: str) -> bytes:
    """``s`` as a JSON string in UTF-8, or \\u-escaped where it has no UTF-8 form (a lone surrogate)."""
    try:
        return _esc(s).encode()
    except UnicodeEncodeError:
        return _esc_ascii(s).encode()


def _flow_heads(cat: str) -> tuple[bytes, bytes]:
    """The text of a launch's flow events up to their id, for a slice of category ``cat``."""
    # In the slices' own category: Chrome DevTools binds a flow event only to a slice of its category.
    return (f'{{"ph":"s","cat":"{cat}","name":"launch","id":'.encode(),
            f'{{"ph":"f","bp":"e","cat":"{cat}","name":"launch","id":'.encode())


def _attrs_encoder() -> Any:
    """``json.dumps(attrs, default=str, ensure_ascii=False)`` without building an encoder per call."""
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is not None:
        try:
            enc = make(None, str, _esc, None, ": ", ", ", False, False, True)
            sample = {"a": (1, 2.5, None, True), "b": "é\"", "c": [{"d": float("nan")}], "e": object}
            if "".join(enc(sample, 0)) == json.dumps(sample, default=str, ensure_ascii=False):
                def encode(obj: Any) -> str:
                    try:
                        return "".join(enc(obj, 0))
                    except (RecursionError, ValueError):  # circular: let json.dumps say so
                        return json.dumps(obj, default=str, ensure_ascii=False)
                return encode
        except Exception:
            pass
    return lambda obj: json.dumps(obj, default=str, ensure_ascii=False)


_encode_attrs = _attrs_encoder()
# The args cltrace writes on every span: a user attribute of the same name is written as "attr.<name>".
# ("status" and "error" are written only on failed spans, where they take precedence.)
OWN_ARGS = frozenset({"span", "parent", "source", "queued_host_ns", "submit_host_ns", "device.start", "device.end"})


class ChromeTraceSink:
    """Streams spans to a Chrome trace JSON file.

    ``flush_every`` spans (or an explicit flush) push buffered text to the OS,
    so a crash leaves a loadable file up to the last flush. A batch's event lines
    come from the C extension where built (``chrome_lines.NATIVE``), else from the
    Python loop, both writing the same bytes; ``native=False`` picks the Python
    one (tests and benchmarks compare them).

    The text goes through one reused 1 MiB buffer, handed to the OS by one
    write() when full and at each flush; with the C extension a batch
    is written straight into it (``chrome_lines.Batch``). Disk is reserved ahead
    of the file (``base.reserve_space``), which makes the kernel's part cheaper.
    """

    def __init__(self, path: str | os.PathLike[str], flush_every: int = 8192, *,
                 native: bool = True) -> None:
        self.path = os.fspath(path)
        self.flush_every = flush_every
        self._native = chrome_lines.NATIVE if native else None
        self._fh: IO[bytes] | None = None
        self._out = bytearray()  # text not handed to the OS yet: self._out[:self._used]
        self._used = 0
        self._offset = 0  # bytes handed to the OS
        self._reserved = 0  # disk reserved up to here (base.reserve_space); -1: cannot
        self._lut: _Lookup | None = None  # the native path's lookup tables and text
        self._tracks_written: set[int] = set()
        self._pids: dict[str, int] = {}
        # Track -> its events' constant '"pid":..,"tid":..,"ts":' text, once its metadata is out.
        self._hheads: dict[int, bytes] = {}
        self._dheads: dict[int, bytes] = {0: b""}
        # (name id, category id) -> (X event head, flow s head, flow f head)
        self._x_heads: dict[tuple[int, int], tuple[bytes, bytes, bytes]] = {}
        # id(attrs) -> (attrs, encoded): the dict is held, so its id cannot be reused meanwhile.
        self._attrs_json: dict[int, tuple[Any, bytes]] = {}
        self._site_json: dict[int, bytes] = {}  # site id -> its args text
        self._region_lut = np.zeros(0, np.int32)
        self._tables: Any = None  # the interning tables the head cache and region flags belong to
        self._base = 0
        self._ctx: TraceContext | None = None
        self._since_flush = 0
        self._synced = 0  # file offset up to which writeback was started
        self._clocks_written = ""
        self._memory_at = (-1, 0)  # position in the recorder's memory samples
        self._memory_first: list[tuple[int, int, int]] = []  # live bytes when the sink started
        self.bytes_written = 0
        self.events_written = 0
        self.spans_written = 0
        self.first_spans_flushed_ns: int | None = None

    # -- SpanSink ---------------------------------------------------------------
    def start(self, ctx: TraceContext) -> None:
        if self._fh is not None:
            return
        self._ctx = ctx
        self._base = ctx.start_ns
        if ctx.memory is not None:
            self._memory_at, self._memory_first = ctx.memory.open()
        self._fh = open_trace_file(self.path, buffering=0)
        self._out = bytearray(_BUFFER)
        self._host_pid = ctx.tracks.pid
        self._process_names = ctx.process_names  # pid -> name (merged)
        self._named_pids = {self._host_pid}
        self._hheads.clear()  # they hold the host pid
        self._emit_lines([
            "[",
            self._meta("process_name", self._host_pid, 0,
                       {"name": self._process_names.get(self._host_pid) or program_name()}),
            self._meta("process_sort_index", self._host_pid, 0, {"sort_index": 0}),
        ])
        self.events_written -= 1  # the "[" line
        self._drain()

    def write(self, batch: SpanBatch) -> None:
        fh = self._fh
        if fh is None or not batch:
            return
        b = as_batch(batch, self._ctx.tables)
        if not (self._native is not None and self._write_native(b)):
            ints, idx, tables = self._prepare(b)
            for start in range(0, b.n, _CHUNK):  # bounded memory for a batch of any size
                self._put(encode_python(ints, idx, tables, start, min(b.n, start + _CHUNK)))
            flags = idx[5]
            with_flow = int(np.count_nonzero(flags == DEVICE))  # a device slice, not a region
            self.events_written += b.n + int(np.count_nonzero(flags & DEVICE)) + 2 * with_flow
        self._since_flush += b.n
        self.spans_written += b.n
        if self._since_flush >= self.flush_every:
            self._flush_os()

    def _write_native(self, b: SpanBatch) -> bool:
        """The batch through the C extension's batch path (``chrome_lines.Batch``); False where its track
        ids do not suit lookup tables (the numpy path writes it instead, the same text)."""
        n = b.n
        lut = self._lut
        t = b.tables
        if lut is None or lut.tables is not t or len(t.cats.values) > lut.ncat:
            lut = self._lut = _Lookup(t)
        regions = self._regions_of(t)
        scan, fill = self._native  # type: ignore[misc]
        attrs_of = np.empty(n, np.int32)
        cols = [np.ascontiguousarray(c) for c in (  # a batch's columns may be views with strides
            b.id, b.parent, b.thread, b.host_begin, b.host_end, b.track, b.dev_queued, b.dev_submit,
            b.dev_start, b.dev_end, b.raw_start, b.raw_end, b.name, b.cat, b.site, b.status)] + [attrs_of, None]
        need = lut.tracks
        try:
            while True:
                lut.size(need, len(t.names.values), len(t.sites.values), regions)
                misses, objects, devices, flows, failed, need = scan(tuple(cols), lut.luts, lut.ncat, b.attrs, attrs_of)
                if not need:
                    break
                lut.unmark()  # a track id past the tables: larger ones, or (not a registry's) the numpy path
                if need < 0 or need > _NO_TRACK:
                    return False
            if misses:
                self._learn(lut, misses)
        except BaseException:
            self._lut = None  # entries scan marked as pending stay unfilled: start over next batch
            raise
        errors = [b""]
        if failed:
            bad = np.flatnonzero(b.status)
            get = b.errors.get
            errors += [_ERROR + _json_text(get(i) or "") for i in bad.tolist()]
            err = cols[-1] = np.zeros(n, np.int32)
            err[bad] = np.arange(1, len(bad) + 1, dtype=np.int32)
        cols = tuple(cols)
        tables = (lut.heads, lut.flow_s, lut.flow_f, lut.hosts, lut.devices,
                  [self._attrs_text(o) for o in objects], lut.sites, errors)
        fh = self._fh
        fd = fh.fileno() if _FILL_FD else -1
        if fd >= 0 and self._reserved >= 0:  # disk ahead of the file: at least RESERVE / 2 past its end
            self._reserved = reserve_space(fd, self._offset + self._used, self._reserved)
        row = 0
        while row < n:
            at = self._used
            try:  # full buffers go to the file inside the C pass: one hand-over of the GIL a batch
                row, self._used, flushed = fill(self._out, at, row, n, self._base, cols, lut.luts, lut.ncat, tables, fd)
            except OSError:
                self._offset = fh.tell()  # type: ignore[union-attr]  # what reached the file before the failure
                raise
            self._offset += flushed
            self.bytes_written += flushed + self._used - at
            if row < n:  # the buffer is full (without fd) or one row is larger than all of it: a larger one
                if self._used == 0:
                    self._out = bytearray(2 * len(self._out))
                self._drain()
        self.events_written += n + devices + 2 * flows
        return True

    def _learn(self, lut: "_Lookup", misses: list[tuple[int, int, int]]) -> None:
        """Text for the keys ``scan`` found no entry for, in the order the rows name them; tracks not
        written yet get their metadata lines now, ahead of the batch's events."""
        lines: list[str] = []
        tracks = self._ctx.tracks
        for _, kind, key in misses:
            if kind == chrome_lines.HOST_TRACK or kind == chrome_lines.DEVICE_TRACK:
                if key not in self._tracks_written:
                    self._track_meta(tracks.get(key), lines)
                if kind == chrome_lines.HOST_TRACK:
                    lut.host_lut[key] = len(lut.hosts)
                    lut.hosts.append(self._host_head(key))
                else:
                    lut.dev_lut[key] = len(lut.devices)
                    lut.devices.append(self._device_head(key))
            elif kind == chrome_lines.HEAD:
                x, fs, ff = self._head(*divmod(key, lut.ncat))
                lut.head_lut[key] = len(lut.heads)
                lut.heads.append(x)
                lut.flow_s.append(fs)
                lut.flow_f.append(ff)
            else:
                lut.site_lut[key] = len(lut.sites)
                lut.sites.append(self._site_text(key - 1))
        if lines:
            self._emit_lines(lines)

    def _regions_of(self, t: Any) -> np.ndarray:
        """Category id -> is a region category, for the tables ``t``."""
        if t is not self._tables:
            self._tables = t
            self._x_heads.clear()
            self._site_json.clear()
            self._region_lut = np.zeros(0, np.int32)
        return self._regions()

    def _prepare(self, b: SpanBatch) -> tuple[np.ndarray, np.ndarray, Tables]:
        """The encoder's input: int64 columns, per-row table indices and flags, and the tables.

        Work here is per distinct value (track, name, attrs dict, error), never per span. Tracks
        not written before get their metadata lines now, ahead of the batch's events.
        """
        n = b.n
        threads, host_of = _distinct(b.thread)
        tracks, dev_of = _distinct(b.track)
        written = self._tracks_written
        if not written.issuperset(threads.tolist()) or not written.issuperset(tracks[tracks != 0].tolist()):
            self._new_tracks(threads, host_of, tracks, dev_of)

        ints = np.empty((len(INTS), n), np.int64)
        ints[0] = b.id
        ints[1] = b.parent
        np.subtract(b.host_begin, self._base, out=ints[2])
        np.subtract(b.host_end, b.host_begin, out=ints[3])
        ints[4] = b.dev_queued
        ints[5] = b.dev_submit
        np.subtract(b.dev_start, self._base, out=ints[6])
        np.subtract(b.dev_end, b.dev_start, out=ints[7])
        ints[8] = b.raw_start
        ints[9] = b.raw_end

        idx = np.zeros((len(IDX), n), np.int32)
        t = b.tables
        if t is not self._tables:  # heads and region flags are cached by this batch's interned ids
            self._tables = t
            self._x_heads.clear()
            self._site_json.clear()
            self._region_lut = np.zeros(0, np.int32)
        ncat = max(len(t.cats.values), 1)
        keys, idx[0] = _distinct(b.name.astype(np.int64) * ncat + b.cat)  # dense: (name, category) pairs
        heads = [self._head(*divmod(k, ncat)) for k in keys.tolist()]
        idx[1] = host_of
        idx[2] = dev_of
        attrs = b.attrs
        ids, idx[3] = _distinct(b.attrs_ids())
        attrs_text = [self._attrs_text(attrs[i]) for i in _first_rows(idx[3], len(ids)).tolist()]
        if (b.site >= 0).any():  # the call site's args follow the attributes: one text per (attrs, site)
            m = len(t.sites.values) + 1
            keys, idx[3] = _distinct(idx[3].astype(np.int64) * m + b.site + 1)
            attrs_text = [attrs_text[a] + self._site_text(s - 1) for a, s in (divmod(k, m) for k in keys.tolist())]
        errors = [b""]
        bad = np.flatnonzero(b.status)
        if len(bad):
            get = b.errors.get
            errors += [_ERROR + _json_text(get(i) or "") for i in bad.tolist()]
            idx[4, bad] = np.arange(1, len(bad) + 1, dtype=np.int32)
        idx[5] = (b.track != 0) * DEVICE + self._regions()[b.cat] * NO_FLOW
        return ints, idx, Tables([h[0] for h in heads], [h[1] for h in heads], [h[2] for h in heads],
                                 [self._host_head(t) for t in threads.tolist()],
                                 [self._device_head(t) for t in tracks.tolist()], attrs_text, errors)

    def _new_tracks(self, threads: np.ndarray, host_of: np.ndarray, tracks: np.ndarray, dev_of: np.ndarray) -> None:
        """Metadata lines of the tracks not written yet, in the order the rows first name them
        (each row's thread, then its device track), as device pids are numbered by first use."""
        written = self._tracks_written
        first = [(2 * i, t) for t, i in zip(threads.tolist(), _first_rows(host_of, len(threads)).tolist())]
        first += [(2 * i + 1, t) for t, i in zip(tracks.tolist(), _first_rows(dev_of, len(tracks)).tolist()) if t]
        lines: list[str] = []
        for _, t in sorted(first):
            if t not in written:
                self._track_meta(self._ctx.tracks.get(t), lines)
        self._emit_lines(lines)

    def _regions(self) -> np.ndarray:
        """Category id -> is a region category (its spans get no flow)."""
        t = self._tables
        if len(self._region_lut) != len(t.cats.values):
            lut = np.zeros(len(t.cats.values), np.int32)
            lut[sorted(t.region_cats)] = 1
            self._region_lut = lut
        return self._region_lut

    def flush(self, meta: dict[str, Any]) -> None:
        if self._fh is None:
            return
        now = self._ctx.start_ns if self._ctx else 0
        ts = _us(time.perf_counter_ns() - now)
        lines = [
            f'{{"ph":"C","name":"cltrace.dropped_spans","pid":{self._host_pid},"tid":0,"ts":{ts},'
            f'"args":{{"dropped":{int(meta.get("dropped_spans", 0))}}}}},'
        ]
        lines += self._memory_lines()
        clocks = json.dumps([meta.get("clocks"), meta.get("devices")], default=str, sort_keys=True)
        if clocks != self._clocks_written:  # a trace cut off later still carries the calibration
            self._clocks_written = clocks
            lines.append(self._metadata_event(meta) + ",")
        self._emit_lines(lines)
        self._flush_os()

    def close(self, meta: dict[str, Any]) -> None:
        fh = self._fh
        if fh is None:
            return
        self._emit_lines(self._memory_lines())
        # Final metadata as an instant event; the last line carries no trailing comma.
        tail = (self._metadata_event(meta) + "\n]\n").encode()
        self._put(tail)
        self.events_written += 1
        try:
            self._drain()
            if self._reserved > 0:  # here, not later: the path may be written afresh, in place, at once
                release_space(fh.fileno(), self._offset)
        finally:
            close_synced(fh)
            self._fh = None
            self._out = bytearray()
            self._lut = None

    def abandon(self) -> None:
        """In a forked child: the file is the parent's; drop it unwritten (``base.abandon_file``)."""
        abandon_file(self._fh)
        self._fh = None
        self._out = bytearray()
        self._used = 0

    # -- helpers ----------------------------------------------------------------
    def _memory_lines(self) -> list[str]:
        """Live device-memory samples not written yet: a counter ("ph":"C") per context."""
        ledger = self._ctx.memory if self._ctx else None
        if ledger is None:
            return []
        samples, self._memory_at = ledger.since(self._memory_at)
        if self._memory_first:
            samples, self._memory_first = self._memory_first + samples, []
        heads: dict[int, str] = {}
        out = []
        for t, key, live in samples:
            head = heads.get(key)
            if head is None:
                head = heads[key] = (f'{{"ph":"C","cat":"memory","name":{json.dumps(counter_name(ledger.label(key)))},'
                                     f'"pid":{self._host_pid},"tid":0,"ts":')
            out.append(f'{head}{_us(t - self._base)},"args":{{"{COUNTER_ARG}":{live}}}}},')
        return out

    def _metadata_event(self, meta: dict[str, Any]) -> str:
        """Run metadata (clock calibrations, counts) as a global instant event; readers keep the last."""
        return json.dumps({"ph": "i", "s": "g", "name": "cltrace.metadata", "pid": self._host_pid,
                           "tid": 0, "ts": 0, "args": _jsonable(meta)})

    def _emit_lines(self, lines: list[str]) -> None:
        lines.append("")  # the trailing newline, without copying the text once more
        data = "\n".join(lines).encode()
        lines.pop()
        self._put(data)
        self.events_written += len(lines)

    def _put(self, data: bytes) -> None:
        """Text after what is written so far: into the buffer, or straight to the OS if larger than it."""
        n = len(data)
        self.bytes_written += n
        if self._used + n > len(self._out):
            self._drain()
            if n > len(self._out):
                self._write_os(data)
                return
        self._out[self._used:self._used + n] = data
        self._used += n

    def _drain(self) -> None:
        """Hands the buffered text to the OS."""
        if self._used:
            with memoryview(self._out) as view:
                self._write_os(view[:self._used])
            self._used = 0

    def _write_os(self, data: Any) -> None:
        fh = self._fh
        end = self._offset + len(data)
        if self._reserved >= 0:
            self._reserved = reserve_space(fh.fileno(), end, self._reserved)
        with memoryview(data) as view:
            done = 0
            while done < len(view):
                done += fh.write(view[done:])  # type: ignore[union-attr,operator]
        self._offset = end

    def _attrs_text(self, attrs: Any) -> bytes:
        """The attrs' members as JSON text after a comma (b"" for none), cached by the dict's identity."""
        if not attrs:
            return b""
        hit = self._attrs_json.get(id(attrs))
        if hit is not None and hit[0] is attrs:  # launchers share one attrs dict per configuration
            return hit[1]
        if len(self._attrs_json) >= _CACHE:
            self._attrs_json.clear()
        key = attrs
        if not OWN_ARGS.isdisjoint(attrs):  # a user attribute named like one of ours keeps its value, renamed
            attrs = {(f"attr.{k}" if k in OWN_ARGS else k): v for k, v in attrs.items()}
        a = _encode_attrs(attrs)
        try:
            text = ("," + a[1:-1]).encode() if len(a) > 2 else b""
        except UnicodeEncodeError:  # a lone surrogate: \\u-escaped
            text = ("," + json.dumps(attrs, default=str)[1:-1]).encode()
        self._attrs_json[id(key)] = (key, text)
        return text

    def _site_text(self, site_id: int) -> bytes:
        """A call site's args (``code.file.path``, ``code.line.number``, ``code.function.name``, and
        ``code.stacktrace`` with ``stack_depth`` > 1) after a comma; b"" for none."""
        if site_id < 0:
            return b""
        text = self._site_json.get(site_id)
        if text is None:
            a = _encode_attrs(self._tables.sites.values[site_id].attrs())
            try:
                text = ("," + a[1:-1]).encode()
            except UnicodeEncodeError:  # a lone surrogate in a path: \\u-escaped
                text = ("," + json.dumps(self._tables.sites.values[site_id].attrs())[1:-1]).encode()
            self._site_json[site_id] = text
        return text

    def _head(self, name_id: int, cat_id: int) -> tuple[bytes, bytes, bytes]:
        """The X event head and the flow heads of rows with this name and category."""
        heads = self._x_heads.get((name_id, cat_id))
        if heads is None:
            if len(self._x_heads) >= _CACHE:
                self._x_heads.clear()
            t = self._tables
            name, cat = t.names.values[name_id], t.cats.values[cat_id]
            x = b'{"ph":"X","cat":"%s","name":%s,' % (cat.encode(), _json_text(name))
            heads = self._x_heads[name_id, cat_id] = (x, *_flow_heads(cat))
        return heads

    def _host_head(self, th: int) -> bytes:
        hh = self._hheads.get(th)
        if hh is None:
            pid = self._ctx.tracks.get(th).pid or self._host_pid
            hh = self._hheads[th] = f'"pid":{pid},"tid":{th},"ts":'.encode()
        return hh

    def _device_head(self, dt: int) -> bytes:
        dh = self._dheads.get(dt)
        if dh is None:
            dpid = self._pids[self._ctx.tracks.get(dt).process]
            dh = self._dheads[dt] = f'"pid":{dpid},"tid":{dt},"ts":'.encode()
        return dh

    def _flush_os(self) -> None:
        self._since_flush = 0
        self._drain()
        self._synced = start_writeback(self._fh, self._synced)  # type: ignore[arg-type]
        if self.first_spans_flushed_ns is None and self.spans_written:
            self.first_spans_flushed_ns = time.perf_counter_ns()  # when spans first reached the OS

    @staticmethod
    def _meta(name: str, pid: int, tid: int, args: dict[str, Any]) -> str:
        return json.dumps({"ph": "M", "name": name, "pid": pid, "tid": tid, "args": args}) + ","

    def _track_meta(self, track: Any, out: list[str]) -> None:
        self._tracks_written.add(track.id)
        if track.kind == DEVICE_QUEUE:
            pid = self._pids.get(track.process)
            if pid is None:
                pid = self._pids[track.process] = device_pid(self._ctx.tracks, track.device)
                out.append(self._meta("process_name", pid, 0, {"name": track.process}))
                out.append(self._meta("process_sort_index", pid, 0, {"sort_index": len(self._pids)}))
        else:
            pid = track.pid or self._host_pid
            if pid not in self._named_pids:  # another host process (a merged trace)
                self._named_pids.add(pid)
                out.append(self._meta("process_name", pid, 0, {"name": self._process_names.get(pid, track.process)}))
                out.append(self._meta("process_sort_index", pid, 0, {"sort_index": 0}))
            self._pids.setdefault(track.process, pid)
        out.append(self._meta("thread_name", pid, track.id, {"name": track.name}))
        out.append(self._meta("thread_sort_index", pid, track.id, {"sort_index": track.id}))


def _jsonable(obj: Any) -> Any:
    return json.loads(json.dumps(obj, default=str))


class _Lookup:
    """The native path's state for one set of interning tables: lookup tables from ids to text indices
    (-1: no text yet; ``chrome_lines.Batch``) and the text they index. Heads are dropped past ``_CACHE``
    (when every span has its own name), like the numpy path's caches."""

    def __init__(self, tables: Any) -> None:
        self.tables = tables
        self.ncat = 8
        while self.ncat < len(tables.cats.values):
            self.ncat *= 2
        self.host_lut = np.full(64, -1, np.int32)
        self.dev_lut = np.full(64, -1, np.int32)
        self.head_lut = np.full(0, -1, np.int32)
        self.site_lut = np.zeros(1, np.int32)  # no site (id -1): text 0, b""
        self.region = np.zeros(0, np.uint8)
        self.hosts: list[bytes] = []
        self.devices: list[bytes] = [b""]
        self.sites: list[bytes] = [b""]
        self.heads: list[bytes] = []
        self.flow_s: list[bytes] = []
        self.flow_f: list[bytes] = []
        self.luts: tuple[np.ndarray, ...] = ()

    @property
    def tracks(self) -> int:
        """How many track ids the lookup tables cover."""
        return len(self.host_lut)

    def unmark(self) -> None:
        """Entries ``scan`` marked as pending (-2) back to unknown (-1)."""
        for lut in self.luts[:4]:
            lut[lut == -2] = -1

    def size(self, tracks: int, names: int, sites: int, regions: np.ndarray) -> None:
        """Lookup tables long enough for ``tracks`` track ids and the tables' names and sites."""
        if len(self.heads) > _CACHE:
            self.head_lut.fill(-1)
            self.heads, self.flow_s, self.flow_f = [], [], []
        grown = False
        if tracks > len(self.host_lut):
            self.host_lut = _grow(self.host_lut, tracks)
            self.dev_lut = _grow(self.dev_lut, tracks)
            grown = True
        if names * self.ncat > len(self.head_lut):
            self.head_lut = _grow(self.head_lut, names * self.ncat)
            grown = True
        if sites + 1 > len(self.site_lut):
            self.site_lut = _grow(self.site_lut, sites + 1)
            grown = True
        if len(regions) != len(self.region):
            self.region = regions.astype(np.uint8)
            grown = True
        if grown or not self.luts:
            self.luts = (self.host_lut, self.dev_lut, self.head_lut, self.site_lut, self.region)


def _grow(lut: np.ndarray, need: int) -> np.ndarray:
    """``lut`` at least ``need`` long (doubling), new entries -1."""
    out = np.full(max(need, 2 * len(lut)), -1, np.int32)
    out[:len(lut)] = lut
    return out
