"""Trace files of several processes (``.json`` or ``.pftrace``, mixed) into one file of either format.

Each input becomes one host process, under its own pid, on the first file's timeline (see
``align``). Span ids and track ids are renumbered per input so that parents, flows and tracks
never mix between files. Device queue tracks say their pid (``... · queue 0 · pid 123``) and stay
under one process per device, so work of several processes on one device shows side by side;
a device of another machine is a process of its own (``OpenCL: <device> @ <host>``).

Inputs are read as ``SpanBatch`` columns (``read.batches``): a large one a window at a time, so memory is bounded
by the windows and what each windowed input keeps between its two passes (its parents' paths, bitmaps of its span
ids), whatever the files' sizes; a smaller one whole, held from the start (the merged file's first metadata names
its tracks and devices) until it is written. Spans are renumbered, given the merged trace's tracks and moved on
the columns, and written input by input, batch by batch, each batch sorted by host begin (a sink takes spans in
any order, as a live run hands them over); the trace's end and the span counts are counted as they go and go
out with the final metadata.
"""
from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from .._version import version
from ..errors import TraceFileError
from ..export.base import FixedTrace
from ..export.formats import format_for, sink_for
from ..read.batches import FileBatches, open_batches
from ..timeline.batch import NAMES, SpanBatch, Tables
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

    def __len__(self) -> int:
        return len(self._tracks)


@dataclass
class Process:
    """One merged input: its file, pid, name, span count and placement; whether it was read in windows."""

    path: str
    pid: int
    name: str
    spans: int
    alignment: Alignment
    recorded_pid: int = 0
    windowed: bool = False

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
            how = " (large: read in windows)" if p.windowed else ""
            out.append(f"  pid {p.pid} ({p.name}): {p.spans:,} spans from {p.path}{how}; {a.method}{where}; "
                       f"{a.uncertainty}")
        return out


def _check_meta(path: str, meta: dict[str, Any]) -> None:
    if "merged" in meta:
        raise TraceFileError(f"{path}: is already a merged trace; merge the files of each process instead")
    for key in ("start_ns", "start_unix_ns"):
        v = meta.get(key)
        if isinstance(v, bool) or not isinstance(v, int):
            raise TraceFileError(f"{path}: the trace does not record its start time ({key}); "
                                 "only traces written by cltrace can be merged")


@dataclass
class _Input:
    """An input being merged: its file (open), its process, and where its tracks go in the merged trace."""

    file: FileBatches
    process: Process
    host: str  # " @ <host>" after the name of a device of another clock domain, else ""
    tracks: dict[int, int] = field(default_factory=dict)  # its track ids -> the merged trace's


def _open(path: str, windowed_from: int | None, window_bytes: int | None) -> FileBatches:
    source = open_batches(path, windowed_from, window_bytes)  # its errors name the file
    _check_meta(path, source.meta)
    return source


def _device_key(meta: dict[str, Any], label: str) -> tuple[str, dict[str, Any]]:
    """The uid and metadata entry of the device whose label a queue track's name starts with."""
    devices = meta.get("devices") if isinstance(meta.get("devices"), dict) else {}
    for uid, info in devices.items():
        if isinstance(info, dict) and (info.get("label") or info.get("name")) == label:
            return str(uid), info
    return label, {"name": label, "label": label}


FLOOR_NS = 1_000_000_000  # the earliest start a merged timeline keeps: a .pftrace has no time before 0


def _lift(alignments: list[Alignment], starts: list[int]) -> None:
    """Move the whole timeline later where an input would start before ``FLOOR_NS`` on it (a file placed by Unix
    time that began before the first file's host booted): every input by the same amount, so each stays exactly
    where it was against the others, and the first file's line says it moved."""
    lift = FLOOR_NS - min(s + a.shift_ns for s, a in zip(starts, alignments))
    if lift > 0:
        for a in alignments:
            a.shift_ns += lift


def _track_ids(batch: SpanBatch) -> tuple[np.ndarray, np.ndarray]:
    """The host thread and device track ids a batch's spans name."""
    return np.unique(batch.thread), np.unique(batch.track[batch.track != 0])


def _add_tracks(inp: _Input, tracks: MergedTracks, merged_meta: dict[str, Any], threads: np.ndarray,
                devices: np.ndarray) -> None:
    """Merged-trace ids for the input's tracks not seen before, numbered on in the order of their own ids.
    A device queue's track says the pid, under one process per device (``uid`` or ``uid @ host``)."""
    meta = inp.file.meta
    names = meta.get("tracks") if isinstance(meta.get("tracks"), dict) else {}
    pid = inp.process.pid
    pname = tracks.process_names[pid]
    device_ids = set(devices.tolist())
    for tid in np.union1d(threads, devices).tolist():
        if tid in inp.tracks:
            continue
        info = names.get(str(tid)) if isinstance(names.get(str(tid)), dict) else {}
        name = str(info.get("name") or f"thread {tid}")
        new = inp.tracks[tid] = len(tracks) + 1
        if tid in device_ids:
            label = name.split(" · queue")[0]
            uid, dev = _device_key(meta, label)
            key = uid + inp.host
            tracks.devices.setdefault(key, dev)
            merged_meta["devices"].setdefault(key, dev)
            clock = (meta.get("clocks") or {}).get(uid)
            if clock is not None:
                merged_meta["clocks"].setdefault(key, clock)
            tracks.add(Track(new, DEVICE_QUEUE, f"{name} · pid {pid}", f"OpenCL: {label}{inp.host}", device=key,
                             pid=pid))
        else:
            kind = COMPILE if name == COMPILE_TRACK_NAME else HOST_THREAD
            tracks.add(Track(new, kind, name, pname, pid=pid))


def _mapped(col: np.ndarray, ids: dict[int, int]) -> np.ndarray:
    uniq, inv = np.unique(col, return_inverse=True)
    return np.array([ids[t] for t in uniq.tolist()], np.int64)[inv]


def _place(batch: SpanBatch, inp: _Input, id_base: int, tables: Tables) -> SpanBatch:
    """The batch on the merged timeline: ids past ``id_base``, the merged trace's tracks, host times moved by
    the input's shift; sorted by (host begin, id), its names (paths, sites) those of the merged trace's ``tables``."""
    shift = inp.process.alignment.shift_ns
    dev = batch.track != 0
    cols = {c: getattr(batch, c) for c in NAMES}
    cols["id"] = batch.id + id_base
    cols["parent"] = np.where(batch.parent != 0, batch.parent + id_base, 0)
    cols["thread"] = _mapped(batch.thread, inp.tracks)
    track = batch.track.copy()
    track[dev] = _mapped(batch.track[dev], inp.tracks)
    cols["track"] = track
    for c in ("host_begin", "host_end"):
        cols[c] = cols[c] + shift
    for c in ("dev_queued", "dev_submit", "dev_start", "dev_end"):
        cols[c] = np.where(dev, cols[c] + shift, cols[c])
    placed = SpanBatch(batch.tables, cols, batch.attrs, batch.errors)
    order = np.lexsort((cols["id"], cols["host_begin"]))
    if not (order == np.arange(len(order))).all():
        placed = placed.take(order)
    return placed.in_tables(tables)


def _extent(batch: SpanBatch) -> int:
    """The last time a batch's spans reach, host or device."""
    dev = batch.track != 0
    return max(int(batch.host_end.max()), int(batch.dev_end[dev].max()) if dev.any() else 0)


def merge(paths: Sequence[str | os.PathLike[str]], out: str | os.PathLike[str], *, windowed_from: int | None = None,
          window_bytes: int | None = None) -> MergeResult:
    """Merge cltrace trace files into ``out`` (``.json`` or ``.pftrace``), written atomically (``out``
    may be one of the inputs). An input of ``windowed_from`` bytes or more (None: ``read.batches.WINDOWED_FROM``
    of its format) is read in windows of ``window_bytes`` (None: the reader's own). Raises TraceFileError naming
    the file and the cause."""
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
    tables = Tables()
    opened = [_open(p, windowed_from, window_bytes) for p in files]
    alignments = align([f.meta for f in opened])
    _lift(alignments, [int(f.meta["start_ns"]) for f in opened])
    first_meta = opened[0].meta
    tracks = MergedTracks(int(first_meta.get("pid") or 0))
    result = MergeResult(target)
    merged_meta: dict[str, Any] = {"clocks": {}, "devices": {}}
    inputs: list[_Input] = []
    used_pids: set[int] = set()
    starts, known_end = [], 0
    for k, (source, a) in enumerate(zip(opened, alignments)):
        meta = source.meta
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
        name = pname + (" (cut off)" if "truncated" in meta else "")
        process = Process(files[k], pid, name, 0, a, recorded_pid, source.windowed)
        result.processes.append(process)
        inp = _Input(source, process, f" @ {a.host or 'host ' + str(a.domain)}" if a.domain else "")
        inputs.append(inp)
        starts.append(int(meta["start_ns"]) + a.shift_ns)
        whole = source.whole
        if whole is not None and whole.n:  # read already: its tracks, spans and extent are known before writing
            _add_tracks(inp, tracks, merged_meta, *_track_ids(whole))
            process.spans = whole.n
            known_end = max(known_end, _extent(whole) + a.shift_ns)
    start = min(starts)
    unix_offset = int(first_meta["start_unix_ns"]) - int(first_meta["start_ns"]) - alignments[0].shift_ns
    dropped = sum(int(f.meta.get("dropped_spans") or 0) for f in opened)

    def metadata() -> dict[str, Any]:
        """The merged trace's metadata as far as the inputs have been read (all of it once they have)."""
        result.spans = sum(p.spans for p in result.processes)
        return {**merged_meta, "cltrace.version": version(), "start_ns": start, "start_unix_ns": start + unix_offset,
                "pid": tracks.pid, "host": first_meta.get("host"), "dropped_spans": dropped,
                "recorded_spans": result.spans, "merged": {"processes": [p.as_dict() for p in result.processes]}}

    # The trace's present (``now_ns``, what a .pftrace stamps its metadata with) is the end of the spans known so far:
    # at the start, those of the inputs read whole; the last span's end once everything is written.
    trace = FixedTrace(tracks, tables, start, start + unix_offset, max(start, known_end), metadata(),
                       process_names=tracks.process_names)

    def write_spans(sink: Any) -> None:
        id_base = 0
        for inp in inputs:
            top, n = id_base, 0
            for batch in inp.file.batches():
                if not batch.n:
                    continue
                _add_tracks(inp, tracks, merged_meta, *_track_ids(batch))
                batch = _place(batch, inp, id_base, tables)
                top = max(top, int(batch.id.max()))
                trace.end_ns = max(trace.end_ns, _extent(batch))
                sink.write(batch)
                n += batch.n
            inp.process.spans = n
            id_base = top
        trace.meta = metadata()

    _write(target, fmt, trace, write_spans)
    return result


def _write(target: str, fmt: str, trace: FixedTrace, write_spans: Callable[[Any], None]) -> None:
    """Write through the format's own sink into a temporary file, then put it in place."""
    folder = os.path.dirname(os.path.abspath(target))
    if not os.path.isdir(folder):
        raise TraceFileError(f"cannot write {target}: there is no folder {folder}; create it or choose another path")
    tmp = os.path.join(folder, f".{os.path.basename(target)}.{os.getpid()}.{time.monotonic_ns()}.tmp")
    sink: Any = None
    try:
        sink = sink_for(tmp, fmt)
        sink.start(trace)
        write_spans(sink)
        sink, done = None, sink
        done.close(trace.metadata())
        os.replace(tmp, target)
    except OSError as exc:
        raise TraceFileError(f"cannot write {target}: {exc.strerror or exc}") from None
    finally:
        if sink is not None:  # an input failed part way (its second pass): let the sink go, then its file
            with contextlib.suppress(Exception):
                sink.close(trace.metadata())
        if os.path.exists(tmp):
            os.remove(tmp)
