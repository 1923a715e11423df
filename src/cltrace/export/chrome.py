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
from typing import IO, Any, Sequence

from .base import open_trace_file
from .processes import device_pid, program_name
from ..timeline.batch import as_batch
from ..timeline.spans import REGION_CATS, Span
from ..timeline.tracks import DEVICE_QUEUE

def _us(ns: int) -> str:
    """Nanoseconds -> microseconds with exactly three decimals, as text (no float rounding)."""
    if ns < 0:
        ns = -ns
        return f"-{ns // 1000}.{ns % 1000:03d}"
    return f"{ns // 1000}.{ns % 1000:03d}"


_MS = tuple(f"{i:03d}" for i in range(1000))  # ns % 1000 -> its three decimals, without a format spec per number

_esc = json.encoder.encode_basestring  # == json.dumps(s, ensure_ascii=False), in C


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


class ChromeTraceSink:
    """Streams spans to a Chrome trace JSON file.

    ``flush_every`` spans (or an explicit flush) push buffered text to the OS,
    so a crash leaves a loadable file up to the last flush.
    """

    def __init__(self, path: str | os.PathLike[str], flush_every: int = 8192) -> None:
        self.path = os.fspath(path)
        self.flush_every = flush_every
        self._fh: IO[bytes] | None = None
        self._tracks_written: set[int] = set()
        self._pids: dict[str, int] = {}
        # Track -> its events' constant '"pid":..,"tid":..,"ts":' text, once its metadata is out.
        self._hheads: dict[int, str] = {}
        self._dheads: dict[int, str] = {}
        self._x_heads: dict[str, tuple[str, str]] = {}  # span name -> (cat, '{"ph":"X","cat":..,"name":..,')
        # id(attrs) -> (attrs, encoded): the dict is held, so its id cannot be reused meanwhile.
        self._attrs_json: dict[int, tuple[dict[str, Any], str]] = {}
        self._base = 0
        self._recorder: Any = None
        self._since_flush = 0
        self._clocks_written = ""
        self.bytes_written = 0
        self.events_written = 0

    # -- SpanSink ---------------------------------------------------------------
    def start(self, recorder: Any) -> None:
        if self._fh is not None:
            return
        self._recorder = recorder
        self._base = recorder.start_ns
        self._fh = open_trace_file(self.path)
        self._host_pid = recorder.tracks.pid
        self._hheads.clear()  # they hold the host pid
        self._emit_lines([
            "[",
            self._meta("process_name", self._host_pid, 0, {"name": program_name()}),
            self._meta("process_sort_index", self._host_pid, 0, {"sort_index": 0}),
        ])
        self._fh.flush()

    def write(self, spans: Sequence[Span]) -> None:
        fh = self._fh
        if fh is None or not spans:
            return
        b = as_batch(spans, self._recorder.tables)
        tracks = self._recorder.tracks
        seen = self._tracks_written
        base = self._base
        host_pid = self._host_pid
        heads = self._x_heads
        hheads = self._hheads
        dheads = self._dheads
        enc_cache = self._attrs_json
        ms = _MS
        out: list[str] = []
        app = out.append
        packed = 0  # events written inside another's list entry
        region_cats = REGION_CATS
        errors = b.errors
        # Columns as lists of Python ints: one pass, one string per span, no per-span calls on the
        # common path (measured in benchmarks/bench_pipeline.py).
        hb_ = (b.host_begin - base).tolist()
        hd_ = (b.host_end - b.host_begin).tolist()
        ds_ = (b.dev_start - base).tolist()
        dd_ = (b.dev_end - b.dev_start).tolist()
        rows = zip(b.id.tolist(), b.parent.tolist(), b.name_list(), b.cat_list(), b.thread.tolist(), hb_, hd_,
                   b.track.tolist(), b.dev_queued.tolist(), b.dev_submit.tolist(), ds_, dd_,
                   b.raw_start.tolist(), b.raw_end.tolist(), b.status.tolist(), b.attrs)
        for i, (sid, parent, name, cat, th, hb, hd, dt, dq, dsub, ds, dd, rs, re_, bad, attrs) in enumerate(rows):
            if len(out) >= 256:  # small chunks: reused memory, no page faults on one huge join
                self._emit_lines(out)
                out.clear()
            hh = hheads.get(th)
            if hh is None:
                if th not in seen:
                    self._track_meta(tracks.get(th), out)
                hh = f'"pid":{host_pid},"tid":{th},"ts":'
                if th in seen:
                    hheads[th] = hh
            head = heads.get(name)
            if head is None or head[0] != cat:
                if len(heads) >= 4096:  # bounded even when every span has its own name
                    heads.clear()
                head = heads[name] = (cat, f'{{"ph":"X","cat":"{cat}","name":{_esc(name)},')
            xh = head[1]
            ts = f"{hb // 1000}.{ms[hb % 1000]}" if hb >= 0 else _us(hb)
            dur = f"{hd // 1000}.{ms[hd % 1000]}" if hd >= 0 else _us(hd)
            if attrs:
                hit = enc_cache.get(id(attrs))
                # launchers share one attrs dict per configuration
                a = hit[1] if hit is not None and hit[0] is attrs else self._attrs_text(attrs)
            else:
                a = ""
            if dt:
                dev = (f',"source":"device","queued_host_ns":{dq},"submit_host_ns":{dsub},'
                       f'"device.start":{rs},"device.end":{re_}')
            else:
                dev = ',"source":"host"'
            if bad:
                dev += f',"status":"error","error":{_esc(errors.get(i) or "")}'
            args = f'{{"span":{sid},"parent":{parent}{dev}{a}}}'
            if not dt:
                app(f'{xh}{hh}{ts},"dur":{dur},"args":{args}}},')
                continue
            dh = dheads.get(dt)
            if dh is None:  # first span on this device track in this sink
                lead = f'{xh}{hh}{ts},"dur":{dur},"args":{args}}},\n'
                packed += 1
                if dt not in seen:  # the device track's metadata goes between the two slices
                    app(lead[:-1])
                    self._track_meta(tracks.get(dt), out)
                    lead = ""
                    packed -= 1
                dh = self._device_head(dt)
                if dt in seen:
                    dheads[dt] = dh
            else:
                lead = None
            dts = f"{ds // 1000}.{ms[ds % 1000]}" if ds >= 0 else _us(ds)
            ddur = f"{dd // 1000}.{ms[dd % 1000]}" if dd >= 0 else _us(dd)
            # Each f-string stays under 30 parts: CPython compiles longer ones to a slower list join.
            if lead is None:
                if cat in region_cats:
                    app(f'{xh}{hh}{ts},"dur":{dur},"args":{args}}},\n{xh}{dh}{dts},"dur":{ddur},"args":{args}}},')
                    packed += 1
                else:
                    # Flow: from inside the host launch slice to the device slice (Kineto style).
                    app(f'{xh}{hh}{ts},"dur":{dur},"args":{args}}},\n{xh}{dh}{dts},"dur":{ddur},"args":{args}}},\n'
                        f'{{"ph":"s","cat":"{cat}","name":"launch","id":{sid},{hh}{ts}}},\n'
                        f'{{"ph":"f","bp":"e","cat":"{cat}","name":"launch","id":{sid},{dh}{dts}}},')
                    packed += 3
            elif cat in region_cats:
                app(f'{lead}{xh}{dh}{dts},"dur":{ddur},"args":{args}}},')
            else:
                app(f'{lead}{xh}{dh}{dts},"dur":{ddur},"args":{args}}},\n'
                    f'{{"ph":"s","cat":"{cat}","name":"launch","id":{sid},{hh}{ts}}},\n'
                    f'{{"ph":"f","bp":"e","cat":"{cat}","name":"launch","id":{sid},{dh}{dts}}},')
                packed += 2
        self.events_written += packed
        if out:
            self._emit_lines(out)
        self._since_flush += b.n
        if self._since_flush >= self.flush_every:
            self._flush_os()

    def flush(self, meta: dict[str, Any]) -> None:
        if self._fh is None:
            return
        now = self._recorder.start_ns if self._recorder else 0
        import time

        ts = _us(time.perf_counter_ns() - now)
        lines = [
            f'{{"ph":"C","name":"cltrace.dropped_spans","pid":{self._host_pid},"tid":0,"ts":{ts},'
            f'"args":{{"dropped":{int(meta.get("dropped_spans", 0))}}}}},'
        ]
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
        # Final metadata as an instant event; the last line carries no trailing comma.
        tail = (self._metadata_event(meta) + "\n]\n").encode()
        fh.write(tail)
        self.bytes_written += len(tail)
        self.events_written += 1
        fh.flush()
        try:
            os.fsync(fh.fileno())
        except OSError:
            pass
        fh.close()
        self._fh = None

    # -- helpers ----------------------------------------------------------------
    def _metadata_event(self, meta: dict[str, Any]) -> str:
        """Run metadata (clock calibrations, counts) as a global instant event; readers keep the last."""
        return json.dumps({"ph": "i", "s": "g", "name": "cltrace.metadata", "pid": self._host_pid,
                           "tid": 0, "ts": 0, "args": _jsonable(meta)})

    def _emit_lines(self, lines: list[str]) -> None:
        lines.append("")  # the trailing newline, without copying the text once more
        data = "\n".join(lines).encode()
        lines.pop()
        self._fh.write(data)  # type: ignore[union-attr]
        self.bytes_written += len(data)
        self.events_written += len(lines)

    def _attrs_text(self, attrs: dict[str, Any]) -> str:
        """The attrs' members as JSON text after a comma, cached by the dict's identity."""
        cache = self._attrs_json
        if len(cache) >= 4096:
            cache.clear()
        a = _encode_attrs(attrs)
        a = "," + a[1:-1] if len(a) > 2 else ""
        cache[id(attrs)] = (attrs, a)
        return a

    def _device_head(self, dt: int) -> str:
        dpid = self._pids[self._recorder.tracks.get(dt).process]
        return f'"pid":{dpid},"tid":{dt},"ts":'

    def _flush_os(self) -> None:
        self._since_flush = 0
        self._fh.flush()  # type: ignore[union-attr]

    @staticmethod
    def _meta(name: str, pid: int, tid: int, args: dict[str, Any]) -> str:
        return json.dumps({"ph": "M", "name": name, "pid": pid, "tid": tid, "args": args}) + ","

    def _track_meta(self, track: Any, out: list[str]) -> None:
        self._tracks_written.add(track.id)
        if track.kind == DEVICE_QUEUE:
            pid = self._pids.get(track.process)
            if pid is None:
                pid = self._pids[track.process] = device_pid(self._recorder.tracks, track.device)
                out.append(self._meta("process_name", pid, 0, {"name": track.process}))
                out.append(self._meta("process_sort_index", pid, 0, {"sort_index": len(self._pids)}))
        else:
            pid = self._host_pid
            self._pids.setdefault(track.process, pid)
        out.append(self._meta("thread_name", pid, track.id, {"name": track.name}))
        out.append(self._meta("thread_sort_index", pid, track.id, {"sort_index": track.id}))


def _jsonable(obj: Any) -> Any:
    return json.loads(json.dumps(obj, default=str))
