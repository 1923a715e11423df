"""Reading Chrome trace JSON back into spans, tolerating a file cut off mid-write.

cltrace writes one event per line, so a cut-off file is read line by line: every line that
parses is kept, one that does not (the torn last line, or a corrupt one) is skipped, in one
linear pass. Every field the summary uses is checked; a wrong one is a one-line TraceFileError.
"""
from __future__ import annotations

import json
import os
from typing import Any

from ..export.chrome import OWN_ARGS
from ..errors import TraceFileError
from ..record.memory import COUNTER_ARG, COUNTER_PREFIX
from ..timeline import sites
from ..timeline.spans import Span
from . import checks, schema
from .tree import fill_paths

# Args members the reader takes as span fields rather than attributes.
_RESERVED = OWN_ARGS | {"status", "error"}


def _parse(text: str) -> Any:
    try:
        return json.loads(text)
    except RecursionError:
        raise TraceFileError("not a Chrome trace: JSON nested too deeply") from None


def _repair(text: str, start: int) -> tuple[list[Any], int, int]:
    """(events, characters read, lines skipped) of a cut-off array whose ``[`` ends at ``start``."""
    events: list[Any] = []
    skipped = bad = 0
    read = pos = start
    for line in text[start:].split("\n"):
        nxt = pos + len(line) + 1
        s = line.strip()
        if s.endswith(","):
            s = s[:-1]
        if s and s != "]":
            try:
                ev = _parse(s)
            except (ValueError, TraceFileError):
                ev = None
            if isinstance(ev, dict):
                events.append(ev)
                skipped += bad  # unreadable lines before a readable one were skipped, not cut
                bad = 0
                read = pos + len(line)
            else:
                bad += 1
        pos = nxt
    return events, read, skipped


def _events(text: str) -> tuple[list[Any], tuple[int, int] | None]:
    """The trace's events, and (characters read, lines skipped) where the file was cut off."""
    stripped = text.strip()
    if not stripped:
        raise TraceFileError("file is empty")
    if stripped[0] == "{":
        try:
            obj = _parse(stripped)
        except json.JSONDecodeError as exc:
            raise TraceFileError(f"not valid JSON: {exc}") from None
        events = obj.get("traceEvents") if isinstance(obj, dict) else None
        if not isinstance(events, list) and _speedscope(obj):
            raise TraceFileError("a speedscope profile (open it in https://www.speedscope.app), not a trace: "
                                 "cltrace reads the .json/.pftrace traces it writes")
        if not isinstance(events, list):
            raise TraceFileError("JSON object has no traceEvents list")
        return events, None
    if stripped[0] != "[":
        raise TraceFileError("not a Chrome trace (expected a JSON array or object)")
    try:
        return _parse(stripped), None
    except json.JSONDecodeError:
        pass
    events, read, skipped = _repair(text, text.index("[") + 1)
    if not events:
        raise TraceFileError("not a Chrome trace: no complete event could be read")
    return events, (read, skipped)


def _speedscope(obj: Any) -> bool:
    """Whether a JSON object is a speedscope profile (``cltrace.trace("x.speedscope.json")`` writes them)."""
    return isinstance(obj, dict) and ("speedscope" in str(obj.get("$schema", "")) or
                                      ("shared" in obj and "profiles" in obj))


def read_text(path: str) -> str:
    with open(path, encoding="utf-8", errors="strict") as fh:
        try:
            return fh.read()
        except UnicodeDecodeError:
            raise TraceFileError("not a Chrome trace (binary data)") from None


class Others:
    """What the events other than span slices say: metadata, dropped spans, device memory, track and
    process names."""

    def __init__(self) -> None:
        self.meta: dict[str, Any] = {}
        self.dropped = 0
        self.memory: dict[str, list[tuple[int, int]]] = {}  # context label -> (ns, live bytes)
        self.threads: dict[Any, str] = {}  # tid -> track name
        self.processes: dict[Any, str] = {}  # pid -> process name
        self.track_pid: dict[Any, Any] = {}

    def event(self, ev: dict[str, Any], ph: Any, where: str) -> None:
        if ph == "M":
            name = ev.get("name")
            margs = ev.get("args") if isinstance(ev.get("args"), dict) else {}
            if not all(isinstance(ev.get(k), (int, str)) for k in ("pid", "tid")):
                return  # names of tracks only; a malformed one names nothing
            if name == "thread_name":
                self.threads[ev.get("tid")] = str(margs.get("name", ""))
                self.track_pid[ev.get("tid")] = ev.get("pid")
            elif name == "process_name":
                self.processes[ev.get("pid")] = str(margs.get("name", ""))
        elif ph == "i" and ev.get("name") == "cltrace.metadata":
            self.meta = schema.metadata(ev.get("args"))
        elif ph == "C" and ev.get("name") == "cltrace.dropped_spans":
            args = checks.mapping(ev.get("args"), f"{where}: 'args'")
            self.dropped = max(self.dropped, checks.integer(args.get("dropped", 0), f"{where}: 'args.dropped'"))
        elif ph == "C" and str(ev.get("name", "")).startswith(COUNTER_PREFIX):
            args = checks.mapping(ev.get("args"), f"{where}: 'args'")
            self.memory.setdefault(ev["name"][len(COUNTER_PREFIX):], []).append(
                (checks.micros_to_ns(ev.get("ts"), f"{where}: 'ts'"),
                 checks.integer(args.get(COUNTER_ARG), f"{where}: 'args.{COUNTER_ARG}'")))

    def finish(self, spans: int) -> dict[str, Any]:
        """The trace's metadata, with what the file itself shows filled in where the run did not say it."""
        meta = self.meta
        meta.setdefault("dropped_spans", self.dropped)
        if self.memory:
            meta["memory_samples"] = {k: sorted(v) for k, v in self.memory.items()}
        meta.setdefault("recorded_spans", spans)
        pids = self.track_pid
        meta.setdefault("tracks", {str(t): {"name": n, "process": self.processes.get(pids.get(t), ""),
                                            **({"pid": pids[t]} if type(pids.get(t)) is int else {})}
                                   for t, n in self.threads.items()})
        return meta


def load_chrome(path: str) -> tuple[list[Span], dict[str, Any]]:
    text = read_text(path)
    events, cut = _events(text)
    host: dict[int, tuple[int, dict[str, Any]]] = {}
    device: dict[int, tuple[int, dict[str, Any]]] = {}
    others = Others()
    for i, ev in enumerate(events):
        where = f"event {i + 1}"
        if not isinstance(ev, dict):
            raise TraceFileError(f"not a Chrome trace: {where} is not an object")
        ph = ev.get("ph")
        if ph == "X":
            args = ev.get("args")
            if args is None or (isinstance(args, dict) and args.get("span") is None):
                continue  # not a cltrace span
            sid = checks.integer(checks.mapping(args, f"{where}: 'args'").get("span"), f"{where}: 'args.span'")
            target = host if sid not in host else device
            target[sid] = (i, ev)
        else:
            others.event(ev, ph, where)
    spans: dict[int, Span] = {}
    for sid, (i, ev) in host.items():
        where = f"event {i + 1}"
        a = ev["args"]
        hb = checks.micros_to_ns(ev.get("ts"), f"{where}: 'ts'")
        status = a.get("status")
        error = a.get("error")
        sp = Span(sid, checks.integer(a.get("parent", 0), f"{where}: 'args.parent'"),
                  checks.text(ev.get("name", "?"), f"{where}: 'name'"), checks.text(ev.get("cat", "?"), f"{where}: 'cat'"),
                  checks.integer(ev.get("tid", 0), f"{where}: 'tid'"),
                  hb, hb + checks.micros_to_ns(ev.get("dur", 0), f"{where}: 'dur'"),
                  attrs=checks.attrs({k: v for k, v in a.items() if k not in _RESERVED and k not in sites.KEYS},
                                     f"{where}: 'args'", ev.get("cat")) or None,
                  status="error" if status == "error" else "ok",
                  error=None if error is None else checks.text(error, f"{where}: 'args.error'"),
                  site=sites.from_attrs(a))
        d = device.get(sid)
        if d is not None:
            j, dev = d
            dwhere = f"event {j + 1}"
            ds = checks.micros_to_ns(dev.get("ts"), f"{dwhere}: 'ts'")
            sp.device_track = checks.integer(dev.get("tid", 0), f"{dwhere}: 'tid'")
            sp.dev_start, sp.dev_end = ds, ds + checks.micros_to_ns(dev.get("dur", 0), f"{dwhere}: 'dur'")
            sp.raw_start = checks.optional_integer(a.get("device.start"), f"{where}: 'args.device.start'")
            sp.raw_end = checks.optional_integer(a.get("device.end"), f"{where}: 'args.device.end'")
            sp.dev_queued = checks.optional_integer(a.get("queued_host_ns"), f"{where}: 'args.queued_host_ns'")
            sp.dev_submit = checks.optional_integer(a.get("submit_host_ns"), f"{where}: 'args.submit_host_ns'")
        spans[sid] = sp
    fill_paths(spans)
    meta = others.finish(len(spans))
    if cut is not None:
        read, skipped = cut
        checks.cut_off(meta, len(text[:read].encode()), os.path.getsize(path), len(events), skipped, "events")
    return list(spans.values()), meta
