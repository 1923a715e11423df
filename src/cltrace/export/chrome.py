"""Chrome trace-event JSON, streamed.

The file uses the JSON *array* format, one event per line, each followed by a
comma: the Trace Event Format allows the closing ``]`` to be missing, so a run
cut off after a flush still loads in ui.perfetto.dev and chrome://tracing
(``cltrace summary`` repairs it the same way). Timestamps are microseconds
with three decimals relative to the trace start (as Kineto writes them), so
nanoseconds survive the trip through a double.

Layout: host threads and the compile track are threads of the host process;
each device is a process ("OpenCL: <device>") whose threads are its queues.
A launch's host slice and device slice are joined by a flow (``s``/``f``
events, binding to the enclosing slices, as Kineto emits them).
"""
from __future__ import annotations

import json
import os
from typing import IO, Any, Sequence

from ..spans import REGION, Span
from ..tracks import DEVICE_QUEUE

_DEVICE_PID_BASE = 1_000_000


def _us(ns: int) -> str:
    """Nanoseconds -> microseconds with exactly three decimals, as text (no float rounding)."""
    if ns < 0:
        ns = -ns
        return f"-{ns // 1000}.{ns % 1000:03d}"
    return f"{ns // 1000}.{ns % 1000:03d}"


def _esc(s: str) -> str:
    return json.dumps(s, ensure_ascii=False)


class ChromeTraceSink:
    """Streams spans to a Chrome trace JSON file.

    ``flush_every`` spans (or an explicit flush) push buffered text to the OS,
    so a crash leaves a loadable file up to the last flush.
    """

    def __init__(self, path: str | os.PathLike[str], flush_every: int = 8192) -> None:
        self.path = os.fspath(path)
        self.flush_every = flush_every
        self._fh: IO[str] | None = None
        self._tracks_written: set[int] = set()
        self._pids: dict[str, int] = {}
        self._base = 0
        self._recorder: Any = None
        self._since_flush = 0
        self.bytes_written = 0
        self.events_written = 0

    # -- SpanSink ---------------------------------------------------------------
    def start(self, recorder: Any) -> None:
        if self._fh is not None:
            return
        self._recorder = recorder
        self._base = recorder.start_ns
        d = os.path.dirname(self.path)
        if d:
            os.makedirs(d, exist_ok=True)
        self._fh = open(self.path, "w", encoding="utf-8", buffering=1 << 20)
        self._host_pid = recorder.tracks.pid
        self._emit_lines([
            "[",
            self._meta("process_name", self._host_pid, 0, {"name": f"host (pid {self._host_pid})"}),
            self._meta("process_sort_index", self._host_pid, 0, {"sort_index": 0}),
        ])
        self._fh.flush()

    def write(self, spans: Sequence[Span]) -> None:
        fh = self._fh
        if fh is None or not spans:
            return
        tracks = self._recorder.tracks
        seen = self._tracks_written
        base = self._base
        host_pid = self._host_pid
        out: list[str] = []
        app = out.append
        for s in spans:
            th = s.thread
            if th not in seen:
                self._track_meta(tracks.get(th), out)
            name = _esc(s.name)
            args = self._args(s)
            hb = s.host_begin - base
            app(f'{{"ph":"X","cat":"{s.cat}","name":{name},"pid":{host_pid},"tid":{th},'
                f'"ts":{_us(hb)},"dur":{_us(s.host_end - s.host_begin)},"args":{args}}},')
            dt = s.device_track
            if dt is not None:
                if dt not in seen:
                    self._track_meta(tracks.get(dt), out)
                dpid = self._pids[tracks.get(dt).process]
                ds = s.dev_start - base
                app(f'{{"ph":"X","cat":"{s.cat}","name":{name},"pid":{dpid},"tid":{dt},'
                    f'"ts":{_us(ds)},"dur":{_us(s.dev_end - s.dev_start)},"args":{args}}},')
                if s.cat != REGION:
                    # Flow: from inside the host launch slice to the device slice (Kineto style).
                    app(f'{{"ph":"s","cat":"launch","name":"launch","id":{s.id},"pid":{host_pid},'
                        f'"tid":{th},"ts":{_us(hb)}}},')
                    app(f'{{"ph":"f","bp":"e","cat":"launch","name":"launch","id":{s.id},'
                        f'"pid":{dpid},"tid":{dt},"ts":{_us(ds)}}},')
        self._emit_lines(out)
        self._since_flush += len(spans)
        if self._since_flush >= self.flush_every:
            self._flush_os()

    def flush(self, meta: dict[str, Any]) -> None:
        if self._fh is None:
            return
        now = self._recorder.start_ns if self._recorder else 0
        import time

        ts = _us(time.perf_counter_ns() - now)
        self._emit_lines([
            f'{{"ph":"C","name":"cltrace.dropped_spans","pid":{self._host_pid},"tid":0,"ts":{ts},'
            f'"args":{{"dropped":{int(meta.get("dropped_spans", 0))}}}}},'
        ])
        self._flush_os()

    def close(self, meta: dict[str, Any]) -> None:
        fh = self._fh
        if fh is None:
            return
        # Final metadata as an instant event; the last line carries no trailing comma.
        fh.write(json.dumps({"ph": "i", "s": "g", "name": "cltrace.metadata", "pid": self._host_pid,
                             "tid": 0, "ts": 0, "args": _jsonable(meta)}))
        fh.write("\n]\n")
        fh.flush()
        try:
            os.fsync(fh.fileno())
        except OSError:
            pass
        fh.close()
        self._fh = None

    # -- helpers ----------------------------------------------------------------
    def _emit_lines(self, lines: list[str]) -> None:
        text = "\n".join(lines) + "\n"
        self._fh.write(text)  # type: ignore[union-attr]
        self.bytes_written += len(text)
        self.events_written += len(lines)

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
                pid = self._pids[track.process] = _DEVICE_PID_BASE + len(self._pids)
                out.append(self._meta("process_name", pid, 0, {"name": track.process}))
                out.append(self._meta("process_sort_index", pid, 0, {"sort_index": len(self._pids)}))
        else:
            pid = self._host_pid
            self._pids.setdefault(track.process, pid)
        out.append(self._meta("thread_name", pid, track.id, {"name": track.name}))
        out.append(self._meta("thread_sort_index", pid, track.id, {"sort_index": track.id}))

    @staticmethod
    def _args(s: Span) -> str:
        parts = [f'"span":{s.id}', f'"parent":{s.parent}']
        if s.dev_start is not None:
            parts.append(f'"source":"device","queued_host_ns":{s.dev_queued},"submit_host_ns":{s.dev_submit},'
                         f'"device.start":{s.raw_start},"device.end":{s.raw_end}')
        else:
            parts.append('"source":"host"')
        if s.status != "ok":
            parts.append(f'"status":"error","error":{_esc(s.error or "")}')
        if s.attrs:
            a = json.dumps(s.attrs, default=str, ensure_ascii=False)
            if len(a) > 2:
                parts.append(a[1:-1])
        return "{" + ",".join(parts) + "}"


def _jsonable(obj: Any) -> Any:
    return json.loads(json.dumps(obj, default=str))
