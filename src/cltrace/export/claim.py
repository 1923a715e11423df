"""Taking trace paths exclusively, so that two processes never write one file.

A trace file is written as ``<path>.partial`` and renamed into place when complete (``base.put_in_place``).
Two processes given the same path (four ``cltrace run --out s.json`` at once) would otherwise truncate
and append to one ``.partial`` together and rename it in turn: an interleaved JSON, an unreadable
``.pftrace``, every process exiting 0. A writer first takes the path: it creates (or opens) the
``.partial`` and holds an exclusive ``flock`` on it until the file is renamed into place. A path another
live process holds is not used: the writer takes the next free numbered name instead, ``s.1.json``,
``s.2.json``, ..., the same number for all the outputs of one ``start`` (``s.1.json`` and ``s.1.pftrace``
are one run's), and says so in one line.

The lock, not the file's existence, decides: the kernel drops a lock when its process ends however it
ends, so a ``.partial`` left by a killed process is taken over (as before) rather than diverting every
later run to a numbered name. Where the system has no ``flock`` (Windows), the ``.partial`` is created
with ``O_EXCL`` instead, and a leftover one is treated as held.
"""
from __future__ import annotations

import os
from typing import Sequence

from ..record.files import make_dirs
from .base import FILE_MODE, FOLDER_MODE, partial_path
from .formats import format_for, suffix

try:
    import fcntl
except ImportError:  # pragma: no cover (Windows)
    fcntl = None  # type: ignore[assignment]

MAX_NUMBER = 999  # numbered names tried before giving up (999 live writers of one path)


def numbered(path: str, n: int) -> str:
    """``s.json`` -> ``s.<n>.json`` (the number before the format's suffix; 0: ``path`` itself)."""
    if n == 0:
        return path
    try:
        end = suffix(format_for(path))
    except ValueError:  # a suffix no format claims (a sink of the user's): before the last dot
        end = os.path.splitext(path)[1]
    return f"{path[:len(path) - len(end)]}.{n}{end}"


def _take(path: str) -> tuple[int, bool] | None:
    """An open descriptor holding ``partial_path(path)`` exclusively and whether this call created the file,
    or None where another process holds it. OSError where the file cannot be created (no such folder, no
    permission)."""
    partial = partial_path(path)
    if fcntl is None:  # pragma: no cover (Windows)
        try:
            return os.open(partial, os.O_RDWR | os.O_CREAT | os.O_EXCL, FILE_MODE), True
        except FileExistsError:
            return None
    while True:
        try:
            fd, created = os.open(partial, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, FILE_MODE), True
        except FileExistsError:
            try:
                fd, created = os.open(partial, os.O_RDWR | os.O_CLOEXEC), False
            except FileNotFoundError:  # renamed into place meanwhile: create it afresh
                continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        except OSError:  # a file system without locks (some network mounts): the file is ours as before
            return fd, created
        try:  # the holder may have renamed it into place between our open and our lock: then it is not the .partial
            st = os.stat(partial)
            mine = os.fstat(fd)
            if (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino):
                return fd, created
        except FileNotFoundError:
            pass
        os.close(fd)  # try again on the .partial that is there now


def claim(paths: Sequence[str]) -> tuple[list[str], list[int]]:
    """Take ``paths`` for writing, together: each path's ``.partial`` is created (folders too) and held until
    ``release``. Returns the paths taken (``paths`` themselves, or all with the first number ``n`` at which
    every ``numbered(p, n)`` is free) and the descriptors holding them. OSError where a file cannot be created.
    A name given up (another of its group was held, or an error) leaves no ``.partial`` it created behind."""
    for p in paths:
        d = os.path.dirname(p)
        if d:
            make_dirs(d, FOLDER_MODE)
    for n in range(MAX_NUMBER + 1):
        names = [numbered(p, n) for p in paths]
        taken: list[tuple[str, int, bool]] = []
        try:
            for name in names:
                got = _take(name)
                if got is None:
                    break
                taken.append((name, *got))
            else:
                return names, [fd for _, fd, _ in taken]
        except BaseException:
            _give_up(taken)
            raise
        _give_up(taken)
    raise OSError(f"{MAX_NUMBER + 1} processes are writing {', '.join(paths)} and its numbered names")


def _give_up(taken: Sequence[tuple[str, int, bool]]) -> None:
    """Release names of a group not taken whole, removing the ``.partial`` files this process created for
    them (while still held: no other writer has them)."""
    for name, fd, created in taken:
        if created:
            try:
                os.unlink(partial_path(name))
            except OSError:
                pass
    release([fd for _, fd, _ in taken])


def release(fds: Sequence[int]) -> None:
    """Let go of paths ``claim`` took (after their files were renamed into place, or left ``.partial``)."""
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass
