"""The one small interface every exporter implements, and the one thing it reads besides its spans.

Like OpenTelemetry's SpanExporter, a sink only receives finished spans in
batches; the recorder (the "span processor") decides when. Sinks never see
raw events, never wait on the device, and must not raise into the program.

A sink reads about the trace only what ``TraceContext`` states: the recorder of a live run
(``record.recorder.Recorder``) and a trace of fixed parts (``FixedTrace``: a merge's replay of trace files,
spans made by hand) both implement it, and a sink takes it as it is (no probing for what one might lack).
"""
from __future__ import annotations

import contextlib
import os
import sys
from dataclasses import dataclass, field
from typing import IO, Any, Callable, ClassVar, Mapping, Protocol, runtime_checkable

from ..record.files import make_dirs
from . import offpath
from ..record.memory import Ledger
from ..timeline.batch import SpanBatch, Tables
from ..timeline.step_table import StepTable
from ..timeline.tracks import Track

# Outputs (traces, charts, reports) are for others to read, never to rewrite: created 0644 in 0755
# folders, narrowed by the umask but never widened (under umask 000, ``open`` would make them 0666:
# any user of the machine could change a trace CI reads), as ssh-keygen writes a public key.
FILE_MODE = 0o644
FOLDER_MODE = 0o755


class TrackTable(Protocol):
    """The tracks a batch's track ids name (``timeline.tracks.TrackRegistry``; a merge's ``MergedTracks``)."""

    pid: int  # the traced program's process id: a host track's process where its own ``pid`` is 0
    devices: Mapping[str, Any]  # device uid -> its facts (``timeline.tracks.DeviceInfo``), in registration order

    def get(self, track_id: int) -> Track:
        """The track of a batch's ``thread`` or ``track`` id."""


@runtime_checkable
class TraceContext(Protocol):
    """What a sink reads about the trace it writes, besides its spans; read from ``start`` on, never changed."""

    tracks: TrackTable  # names every track id a batch holds (threads, device queues, the compile track)
    tables: Tables  # the interning tables a batch's name, category, path and site ids index
    start_ns: int  # perf_counter_ns at the start of the trace: the zero of a file's timestamps
    start_unix_ns: int  # time.time_ns() at that same moment: the trace on the wall clock (OTLP)
    memory: Ledger | None  # live device memory per context, for counter tracks; None: the trace has none
    steps: StepTable  # a scheduled session's traced steps (OTLP: one trace each); empty: no schedule
    process_names: Mapping[int, str]  # pid -> name of a host process not named after the program (a merge's
    #                                   inputs); empty: the one process is the program (``processes.program_name``)

    def metadata(self) -> dict[str, Any]:
        """The run's metadata so far (clocks, devices, counts): what a file says at its start."""

    def now_ns(self) -> int:
        """The trace's present, on perf_counter_ns: the time of samples written now (memory, drop counts).
        A live run's is the clock's; a replayed trace's is its end."""

    # Optional: ``replay`` (True on ``FixedTrace``): the spans are not this process's own run, so this host's
    # clocks now say nothing about them (a .pftrace then relates BOOTTIME to its timestamps by a fixed relation).


@dataclass
class FixedTrace:
    """A ``TraceContext`` of fixed parts: a trace replayed from files (``cltrace merge``), or spans made by hand
    (tests, benchmarks). Its present (``now_ns``) is ``end_ns``; its ``metadata()`` a copy of ``meta``. A merge
    reading inputs in windows raises ``end_ns`` as it writes them (the end known so far) and sets ``meta``
    once all are written, before ``close``."""

    tracks: TrackTable
    tables: Tables = field(default_factory=Tables)
    start_ns: int = 0
    start_unix_ns: int = 0
    end_ns: int = 0
    meta: dict[str, Any] = field(default_factory=dict)
    memory: Ledger | None = None
    steps: StepTable = field(default_factory=StepTable)
    process_names: Mapping[int, str] = field(default_factory=dict)

    replay: ClassVar[bool] = True  # not this process's run (see ``TraceContext``)

    def metadata(self) -> dict[str, Any]:
        return dict(self.meta)

    def now_ns(self) -> int:
        return self.end_ns


class SpanSink(Protocol):
    """An exporter. ``start`` comes before the first ``write`` (the built-in sinks keep their first context if
    called again); ``write`` and ``flush`` any number of times; ``close`` once."""

    def start(self, ctx: TraceContext) -> None:
        """Called once before the first batch: what the batches' ids name, where the trace starts."""

    def write(self, batch: SpanBatch) -> None:
        """A batch of resolved spans, in no guaranteed order: columns (``timeline.batch.SpanBatch``), which also
        read as a sequence of ``Span`` objects (``for span in batch``, ``batch[i]``, ``len(batch)``)."""

    def flush(self, meta: dict[str, Any]) -> None:
        """Make everything written so far durable (file: readable if the process dies now)."""

    def close(self, meta: dict[str, Any]) -> None:
        """Write final metadata (drop counts, clock bounds) and release resources."""

    # Optional: ``abandon()``, called in a forked child on the parent's sinks: drop everything
    # without writing or closing anything the parent owns (``abandon_file`` for a file).


def abandon_file(fh: IO[bytes] | None) -> None:
    """In a forked child: make the parent's open trace file unreachable without writing to it.

    Its buffered bytes are the parent's; flushed from the child (at exit, by the garbage
    collector) they would land in the parent's file a second time. The descriptor is pointed at
    /dev/null instead, so whatever is flushed later goes nowhere."""
    if fh is None:
        return
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(null, fh.fileno())
        finally:
            os.close(null)
    except (OSError, ValueError):
        pass


PARTIAL = ".partial"


def partial_path(path: str) -> str:
    """Where a trace file named ``path`` is written until it is complete: ``path`` + ``.partial``, in
    the same folder. A killed process leaves it there, readable up to its last flush."""
    return path + PARTIAL


def put_in_place(path: str) -> None:
    """The file at ``partial_path(path)`` is complete: rename it to ``path``, over any earlier file
    (one rename: a reader sees the old file or the new one, never a mix).

    An earlier file is held open across the rename and closed on ``offpath``'s thread: the kernel frees
    its blocks at the last close, which a rename over it would otherwise pay inline (6-9 ms for a
    ~10 MB trace on an H200 host, inside ``stop()``). If the process ends first, its exit closes it."""
    try:
        old = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0))
    except OSError:  # none there (or not ours to read): the rename frees nothing worth moving
        old = -1
    try:
        os.replace(partial_path(path), path)
    finally:
        if old >= 0:
            offpath.close(old)


def close_synced(fh: IO[Any]) -> None:
    """Close the trace file ``fh`` now (its bytes are the kernel's: every reader sees them); its fsync runs
    on ``offpath``'s thread, or here if no descriptor is left to hand over. Only the fsync is deferred: it
    is harmless to a file written afresh at the same path meanwhile, where a deferred truncation was not."""
    try:
        fd = os.dup(fh.fileno())
    except OSError:
        with contextlib.suppress(OSError):
            fh.flush()
            os.fsync(fh.fileno())
        fh.close()
        return
    try:
        fh.close()
    finally:
        offpath.sync_and_close(fd)


def open_trace_file(path: str, buffering: int = 1 << 20) -> IO[bytes]:
    """Create the trace file (and its folder) for a streaming writer, with a large buffer (0: none, for a
    writer that buffers its text itself)."""
    return create_output(path, "wb", buffering=buffering)


def create_output(path: str, mode: str = "wb", buffering: int = -1, encoding: str | None = None) -> IO[Any]:
    """Create (or empty) the output file ``path`` and its missing folders, ``FILE_MODE``/``FOLDER_MODE``;
    an existing file that group or others could write loses that. ``mode``: ``"wb"`` or ``"w"``."""
    d = os.path.dirname(path)
    if d:
        make_dirs(d, FOLDER_MODE)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0), FILE_MODE)
    try:
        st = os.fstat(fd)
        if st.st_mode & 0o022 and st.st_uid == os.getuid():
            os.fchmod(fd, st.st_mode & 0o755)
        return os.fdopen(fd, mode, buffering=buffering, encoding=encoding)
    except BaseException:
        os.close(fd)
        raise


def _libc(name: str, *args: str) -> Any:
    """The C library's function ``name`` (returning int; ``args``: ctypes type names without ``c_``),
    or None where there is none. ctypes is imported here, at first use, not with cltrace."""
    try:
        import ctypes

        f = getattr(ctypes.CDLL(None, use_errno=True), name)
    except (OSError, AttributeError):
        return None
    f.argtypes = [getattr(ctypes, "c_" + a) for a in args]
    f.restype = ctypes.c_int
    return f


_SYNC_FILE_RANGE_WRITE = 2  # <linux/fs.h>: start writeback of the range's dirty pages, do not wait
_sync_file_range: Callable[[int, int, int, int], int] | None | bool = sys.platform.startswith("linux")


def start_writeback(fh: IO[bytes], since: int) -> int:
    """After ``fh.flush()``: asks the kernel to start writing the file's bytes from offset ``since`` to
    its end to disk (Linux ``sync_file_range``), without waiting for it. Returns the end, the next
    call's ``since``.

    The trace files grow by ~1 kB a span (.json); left to the kernel, the dirty pages wait for its
    periodic writeback and ``close()``'s fsync pays for all of them at once (measured 44 ms for a
    97 MB .json here, ~0.5 us a span, more than the span's encoding). Started as the file grows, the
    disk writes while the sinks encode, and close() waits only for the last flush's bytes. Elsewhere,
    or where the call fails, nothing happens: this only moves when the disk writes.
    """
    global _sync_file_range
    try:
        end = fh.tell()
    except (OSError, ValueError):  # not a seekable file (a pipe): nothing to start
        return since
    if _sync_file_range is True:  # first use: look the call up
        _sync_file_range = _libc("sync_file_range", "int", "longlong", "longlong", "uint")
    if _sync_file_range and end > since:
        try:
            _sync_file_range(fh.fileno(), since, end - since, _SYNC_FILE_RANGE_WRITE)
        except (OSError, ValueError):
            pass
    return end


_FALLOC_FL_KEEP_SIZE = 1  # <linux/falloc.h>: allocate blocks past the end, the file's size unchanged
RESERVE = 32 << 20  # bytes of disk reserved ahead of a growing trace file at a time
RESERVE_FROM = RESERVE  # a file reserves nothing before it has this many bytes (see reserve_space)
_fallocate: Callable[[int, int, int, int], int] | None | bool = sys.platform.startswith("linux")


def reserve_space(fd: int, end: int, reserved: int) -> int:
    """Before writing the file's bytes up to ``end``: where fewer than half of ``RESERVE`` bytes past it are
    reserved on disk (``reserved``: the end of the last reservation, 0 at first), reserves the next
    ``RESERVE`` (Linux ``fallocate`` keeping the size: the file reads the same, killed or not). Returns the
    new reserved end, or -1 where the file or system cannot reserve (stop calling).

    Writing into reserved blocks costs the kernel less than writing past them: on ext4 here, the .json
    sink's CPU time ~300 against ~340 ns a span (775 B), the write() and the writeback started at each
    flush both cheaper (no delayed allocation to account for per page). ``release_space`` gives back what
    is left at close; a killed process leaves at most ``RESERVE`` bytes of disk allocated past the file's
    end (``du`` counts them, the file reads the same).

    Nothing is reserved before the file has ``RESERVE_FROM`` bytes: the release at close (an ftruncate)
    took 4.4-6.8 ms in about half of the closes of a ~20 MB .json on an H200 host's ext4 (mounted with
    ``discard``), 0.2-0.5 ms otherwise, against ~40 ns a span saved while writing (~1 ms at 20 MB). A
    trace that outgrows it pays the release once, against the saving on every span after.
    """
    global _fallocate
    if end + RESERVE // 2 <= reserved or (reserved == 0 and end < RESERVE_FROM):
        return reserved
    if _fallocate is True:
        _fallocate = _libc("fallocate", "int", "int", "longlong", "longlong")
    if not _fallocate:
        return -1
    start = max(end, reserved)
    try:
        if _fallocate(fd, _FALLOC_FL_KEEP_SIZE, start, end + RESERVE - start) != 0:
            return -1  # not a regular file, or a file system without it: nothing reserved
    except (OSError, ValueError):
        return -1
    return end + RESERVE


def release_space(fd: int, size: int) -> None:
    """At close: frees the blocks ``reserve_space`` allocated past ``size``, the file's end (truncating
    to its own size)."""
    try:
        os.ftruncate(fd, size)
    except OSError:
        pass
