"""Reading Chrome trace JSON back into spans, tolerating a file cut off mid-write."""
from __future__ import annotations

import json
from typing import Any

from ..errors import TraceFileError
from ..timeline.spans import Span
from .tree import fill_paths

# Args members the reader takes as span fields rather than attributes.
_RESERVED = frozenset({"span", "parent", "source", "status", "error", "queued_host_ns", "submit_host_ns",
                       "device.start", "device.end"})


def _repair_json(text: str) -> list[Any]:
    """Parse a Chrome JSON trace, tolerating a run cut off mid-write."""
    stripped = text.strip()
    if not stripped:
        raise TraceFileError("file is empty")
    if stripped[0] == "{":
        try:
            obj = json.loads(stripped)
        except json.JSONDecodeError as exc:
            raise TraceFileError(f"not valid JSON: {exc}") from None
        events = obj.get("traceEvents")
        if not isinstance(events, list):
            raise TraceFileError("JSON object has no traceEvents list")
        return events
    if stripped[0] != "[":
        raise TraceFileError("not a Chrome trace (expected a JSON array or object)")
    try:
        return json.loads(stripped)
    except json.JSONDecodeError:
        pass
    # Truncated: keep every complete line (one event per line), close the array.
    lines = stripped.split("\n")
    body = [ln for ln in lines[1:] if ln.strip() and ln.strip() != "]"]
    while body:
        candidate = "[" + "\n".join(body).rstrip().rstrip(",") + "]"
        try:
            return json.loads(candidate)
        except json.JSONDecodeError:
            body.pop()
    raise TraceFileError("not a Chrome trace: no complete event could be read")


def load_chrome(path: str) -> tuple[list[Span], dict[str, Any]]:
    with open(path, encoding="utf-8", errors="strict") as fh:
        try:
            text = fh.read()
        except UnicodeDecodeError:
            raise TraceFileError("not a Chrome trace (binary data)") from None
    events = _repair_json(text)
    host: dict[int, dict[str, Any]] = {}
    device: dict[int, dict[str, Any]] = {}
    meta: dict[str, Any] = {}
    dropped = 0
    threads: dict[Any, str] = {}  # tid -> track name
    processes: dict[Any, str] = {}  # pid -> process name
    track_pid: dict[Any, Any] = {}
    for ev in events:
        if not isinstance(ev, dict):
            raise TraceFileError("not a Chrome trace: an event is not an object")
        ph = ev.get("ph")
        if ph == "X":
            args = ev.get("args") or {}
            sid = args.get("span")
            if sid is None:
                continue
            target = host if sid not in host else device
            target[sid] = ev
        elif ph == "M":
            name = ev.get("name")
            if name == "thread_name":
                threads[ev.get("tid")] = str((ev.get("args") or {}).get("name", ""))
                track_pid[ev.get("tid")] = ev.get("pid")
            elif name == "process_name":
                processes[ev.get("pid")] = str((ev.get("args") or {}).get("name", ""))
        elif ph == "i" and ev.get("name") == "cltrace.metadata":
            meta = ev.get("args") or {}
        elif ph == "C" and ev.get("name") == "cltrace.dropped_spans":
            dropped = max(dropped, int((ev.get("args") or {}).get("dropped", 0)))
    meta.setdefault("dropped_spans", dropped)
    spans: dict[int, Span] = {}
    for sid, ev in host.items():
        a = ev.get("args") or {}
        hb = round(float(ev["ts"]) * 1000)
        sp = Span(sid, int(a.get("parent", 0)), ev.get("name", "?"), ev.get("cat", "?"), int(ev.get("tid", 0)),
                  hb, hb + round(float(ev.get("dur", 0)) * 1000),
                  attrs={k: v for k, v in a.items() if k not in _RESERVED} or None,
                  status="error" if a.get("status") == "error" else "ok", error=a.get("error"))
        d = device.get(sid)
        if d is not None:
            ds = round(float(d["ts"]) * 1000)
            sp.device_track = int(d.get("tid", 0))
            sp.dev_start, sp.dev_end = ds, ds + round(float(d.get("dur", 0)) * 1000)
            sp.raw_start, sp.raw_end = a.get("device.start"), a.get("device.end")
            sp.dev_queued, sp.dev_submit = a.get("queued_host_ns"), a.get("submit_host_ns")
        spans[sid] = sp
    fill_paths(spans)
    meta.setdefault("recorded_spans", len(spans))
    meta.setdefault("tracks", {str(t): {"name": n, "process": processes.get(track_pid.get(t), "")}
                               for t, n in threads.items()})
    return list(spans.values()), meta
