"""The one small interface every exporter implements.

Like OpenTelemetry's SpanExporter, a sink only receives finished spans in
batches; the recorder (the "span processor") decides when. Sinks never see
raw events, never wait on the device, and must not raise into the program.
"""
from __future__ import annotations

import os
import sys
from typing import IO, Any, Callable, Protocol, Sequence

from ..record.files import make_dirs
from ..timeline.spans import Span

# Outputs (traces, charts, reports) are for others to read, never to rewrite: created 0644 in 0755
# folders, narrowed by the umask but never widened (under umask 000, ``open`` would make them 0666:
# any user of the machine could change a trace CI reads), as ssh-keygen writes a public key.
FILE_MODE = 0o644
FOLDER_MODE = 0o755


class SpanSink(Protocol):
    def start(self, recorder: Any) -> None:
        """Called once before the first batch; ``recorder.tracks`` names the tracks."""

    def write(self, spans: Sequence[Span]) -> None:
        """A batch of resolved spans, in no guaranteed order."""

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
    (one rename: a reader sees the old file or the new one, never a mix)."""
    os.replace(partial_path(path), path)


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
    """
    global _fallocate
    if end + RESERVE // 2 <= reserved:
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
