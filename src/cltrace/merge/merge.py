"""Trace files of several processes (``.json`` or ``.pftrace``, mixed) into one file of either format.

Each input becomes one host process, under its own pid, on the first file's timeline (see
``align``). Span ids and track ids are renumbered per input so that parents, flows and tracks
never mix between files. Device queue tracks say their pid (``... · queue 0 · pid 123``) and stay
under one process per device, so work of several processes on one device shows side by side;
a device of another machine is a process of its own (``OpenCL: <device> @ <host>``).
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

from .._version import version
from ..errors import TraceFileError
from ..export.base import FixedTrace
from ..export.formats import format_for, sink_for
from ..read import detect, load
from ..timeline.batch import SpanBatch, Tables
from ..timeline.spans import Span
from ..timeline.tracks import COMPILE, COMPILE_TRACK_NAME, DEVICE_QUEUE, HOST_THREAD, Track
from .align import Alignment, align

FORMATS = ("json", "pftrace")


class MergedTracks:
    """The registry the writers read (``get``, ``pid``, ``devices``: ``export.base.TrackTable``), for the
    tracks of every input; ``process_names`` names each host process."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._tracks: dict[int, Track] = {}
        self.devices: dict[str, dict[str, Any]] = {}
        self.process_names: dict[int, str] = {}

    def add(self, track: Track) -> None:
        self._tracks[track.id] = track

    def get(self, track_id: int) -> Track:
        return self._tracks[track_id]

    def tracks(self) -> list[Track]:
        return list(self._tracks.values())


@dataclass
class Process:
    """One merged input: its file, pid, name, span count and placement."""

    path: str
    pid: int
    name: str
    spans: int
    alignment: Alignment
    recorded_pid: int = 0

    def as_dict(self) -> dict[str, Any]:
        d = {"file": self.path, "pid": self.pid, "name": self.name, "spans": self.spans, **self.alignment.as_dict()}
        if self.recorded_pid != self.pid:
            d["recorded_pid"] = self.recorded_pid
        return d


@dataclass
class MergeResult:
    out: str
    processes: list[Process] = field(default_factory=list)
    spans: int = 0

    def lines(self) -> list[str]:
        """What ``cltrace merge`` prints: one line per process, its placement and its uncertainty."""
        out = []
        for p in self.processes:
            a = p.alignment
            where = "" if not a.shift_ns else f", moved {a.shift_ns / 1e6:+.3f} ms"
            out.append(f"  pid {p.pid} ({p.name}): {p.spans:,} spans from {p.path}; {a.method}{where}; {a.uncertainty}")
        return out


def _check_meta(path: str, meta: dict[str, Any]) -> None:
    if "merged" in meta:
        raise TraceFileError(f"{path}: is already a merged trace; merge the files of each process instead")
    for key in ("start_ns", "start_unix_ns"):
        v = meta.get(key)
        if isinstance(v, bool) or not isinstance(v, int):
            raise TraceFileError(f"{path}: the trace does not record its start time ({key}); "
                                 "only traces written by cltrace can be merged")


def _load(path: str) -> tuple[list[Span], dict[str, Any], bool]:
    """Spans (host times made absolute), metadata, and whether the file was cut off."""
    try:
        relative = detect(path) == "json"  # Chrome JSON times count from the run's start
    except OSError as exc:
        raise TraceFileError(f"{path}: cannot read it: {exc.strerror or exc}") from None
    except TraceFileError as exc:
        raise TraceFileError(f"{path}: {exc}") from None
    spans, meta = load(path)  # its errors name the file
    _check_meta(path, meta)
    if relative:
        base = meta["start_ns"]
        for s in spans:
            s.host_begin += base
            s.host_end += base
            if s.dev_start is not None:
                s.dev_start += base
                s.dev_end += base
    return spans, meta, "truncated" in meta


def _device_key(meta: dict[str, Any], label: str) -> tuple[str, dict[str, Any]]:
    """The uid and metadata entry of the device whose label a queue track's name starts with."""
    devices = meta.get("devices") if isinstance(meta.get("devices"), dict) else {}
    for uid, info in devices.items():
        if isinstance(info, dict) and (info.get("label") or info.get("name")) == label:
            return str(uid), info
    return label, {"name": label, "label": label}


def _place(spans: list[Span], a: Alignment, id_base: int, track_map: dict[int, int]) -> None:
    """Renumber ids and tracks, and move the host times, in place."""
    shift = a.shift_ns
    for s in spans:
        s.id += id_base
        if s.parent:
            s.parent += id_base
        s.thread = track_map[s.thread]
        s.host_begin += shift
        s.host_end += shift
        if s.dev_start is not None:
            s.device_track = track_map[s.device_track]
            s.dev_start += shift
            s.dev_end += shift
            if s.dev_queued is not None:
                s.dev_queued += shift
            if s.dev_submit is not None:
                s.dev_submit += shift


def merge(paths: Sequence[str | os.PathLike[str]], out: str | os.PathLike[str]) -> MergeResult:
    """Merge cltrace trace files into ``out`` (``.json`` or ``.pftrace``), written atomically (``out``
    may be one of the inputs). Raises TraceFileError naming the file and the cause."""
    files = [os.fspath(p) for p in paths]
    target = os.fspath(out)
    if not files:
        raise TraceFileError("nothing to merge: give the trace files of the processes")
    try:
        fmt = format_for(target)
    except ValueError as exc:
        raise TraceFileError(str(exc)) from None
    if fmt not in FORMATS:
        raise TraceFileError(f"{target}: a merged trace is .json or .pftrace")
    loaded = [_load(p) for p in files]
    alignments = align([m for _, m, _ in loaded])
    first_meta = loaded[0][1]
    tracks = MergedTracks(int(first_meta.get("pid") or 0))
    result = MergeResult(target)
    merged_meta: dict[str, Any] = {"clocks": {}, "devices": {}}
    all_spans: list[Span] = []
    id_base = track_base = dropped = 0
    used_pids: set[int] = set()
    for k, ((spans, meta, cut), a) in enumerate(zip(loaded, alignments)):
        recorded_pid = int(meta.get("pid") or 0)
        pid = recorded_pid or 1
        while pid in used_pids:  # pid reused (another machine, a later boot): keep the processes apart
            pid += 10_000_000
        used_pids.add(pid)
        if k == 0:
            tracks.pid = pid
        proc = meta.get("process") if isinstance(meta.get("process"), dict) else {}
        names = meta.get("tracks") if isinstance(meta.get("tracks"), dict) else {}
        pname = str(proc.get("name") or next((str(t.get("process")) for t in names.values() if isinstance(t, dict)
                                              and t.get("process") and not str(t["process"]).startswith("OpenCL")),
                                             f"pid {pid}"))
        if pname in tracks.process_names.values():  # two runs of one command: told apart by pid
            pname = f"{pname} (pid {pid})"
        tracks.process_names[pid] = pname
        host = f" @ {a.host or 'host ' + str(a.domain)}" if a.domain else ""
        track_map: dict[int, int] = {}
        device_ids = {s.device_track for s in spans if s.dev_start is not None}
        for tid in sorted({s.thread for s in spans} | device_ids):
            info = names.get(str(tid)) if isinstance(names.get(str(tid)), dict) else {}
            name = str(info.get("name") or f"thread {tid}")
            new = track_base + len(track_map) + 1
            track_map[tid] = new
            if tid in device_ids:
                label = name.split(" · queue")[0]
                uid, dev = _device_key(meta, label)
                key = uid + host
                tracks.devices.setdefault(key, dev)
                merged_meta["devices"].setdefault(key, dev)
                clock = (meta.get("clocks") or {}).get(uid)
                if clock is not None:
                    merged_meta["clocks"].setdefault(key, clock)
                tracks.add(Track(new, DEVICE_QUEUE, f"{name} · pid {pid}", f"OpenCL: {label}{host}", device=key,
                                 pid=pid))
            else:
                kind = COMPILE if name == COMPILE_TRACK_NAME else HOST_THREAD
                tracks.add(Track(new, kind, name, pname, pid=pid))
        track_base += len(track_map)
        _place(spans, a, id_base, track_map)
        id_base = max([id_base, *(s.id for s in spans)])
        dropped += int(meta.get("dropped_spans") or 0)
        all_spans += spans
        name = pname + (" (cut off)" if cut else "")
        result.processes.append(Process(files[k], pid, name, len(spans), a, recorded_pid))
    result.spans = len(all_spans)
    starts = [int(m["start_ns"]) + a.shift_ns for (_, m, _), a in zip(loaded, alignments)]
    start = min(starts)
    end = max([start, *(s.host_end for s in all_spans), *(s.dev_end for s in all_spans if s.dev_end is not None)])
    unix_offset = int(first_meta["start_unix_ns"]) - int(first_meta["start_ns"])
    merged_meta.update({
        "cltrace.version": version(), "start_ns": start, "start_unix_ns": start + unix_offset,
        "pid": tracks.pid, "host": first_meta.get("host"), "dropped_spans": dropped,
        "recorded_spans": len(all_spans),
        "merged": {"processes": [p.as_dict() for p in result.processes]},
    })
    trace = FixedTrace(tracks, Tables(), start, start + unix_offset, end, merged_meta,
                       process_names=tracks.process_names)
    _write(target, fmt, trace, all_spans)
    return result


def _write(target: str, fmt: str, trace: FixedTrace, spans: list[Span]) -> None:
    """Write through the format's own sink into a temporary file, then put it in place."""
    folder = os.path.dirname(os.path.abspath(target))
    if not os.path.isdir(folder):
        raise TraceFileError(f"cannot write {target}: there is no folder {folder}; create it or choose another path")
    tmp = os.path.join(folder, f".{os.path.basename(target)}.{os.getpid()}.{time.monotonic_ns()}.tmp")
    try:
        sink = sink_for(tmp, fmt)
        sink.start(trace)
        sink.write(SpanBatch.from_spans(trace.tables, sorted(spans, key=lambda s: (s.host_begin, s.id))))
        sink.close(trace.metadata())
        os.replace(tmp, target)
    except OSError as exc:
        raise TraceFileError(f"cannot write {target}: {exc.strerror or exc}") from None
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
