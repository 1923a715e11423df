"""File work a program need not wait for, on one background thread: the fsync of a closed trace file,
and the last close of a file a rename replaced (where the kernel frees its blocks).

``stop()`` paid both inline: 2-12 ms of fsync for two files and 6-9 ms freeing the previous run's
files, for a 2,000-step trace on an H200 host. A closed file's bytes are the kernel's at once: every
reader sees them, and a process that dies afterwards loses none of them. Only durability against a
crash of the machine itself comes later: by ``wait()``, which runs at interpreter exit (bounded by
``EXIT_WAIT_S``); a job handed over after that runs inline.
"""
from __future__ import annotations

import atexit
import contextlib
import os
import queue
import threading

EXIT_WAIT_S = 10.0

_jobs: "queue.SimpleQueue[tuple[int, bool]]" = queue.SimpleQueue()
_done = threading.Condition()
_open_jobs = 0
_thread: threading.Thread | None = None
_exiting = False


def sync_and_close(fd: int) -> None:
    """fsync then close ``fd`` (a descriptor the caller hands over, e.g. ``os.dup`` of a file it closes)."""
    _submit(fd, True)


def close(fd: int) -> None:
    """Close ``fd`` (handed over)."""
    _submit(fd, False)


def wait(timeout: float | None = None) -> bool:
    """Block until every job handed over so far is done (or ``timeout`` seconds); True if all are."""
    with _done:
        return _done.wait_for(lambda: _open_jobs == 0, timeout)


def _submit(fd: int, sync: bool) -> None:
    global _open_jobs, _thread
    if not _exiting:
        with _done:
            _open_jobs += 1
            try:
                if _thread is None:
                    t = threading.Thread(target=_run, name="cltrace-offpath", daemon=True)
                    t.start()
                    _thread = t
                _jobs.put((fd, sync))
                return
            except RuntimeError:  # no new threads now (the interpreter is shutting down)
                _open_jobs -= 1
    _do(fd, sync)


def _do(fd: int, sync: bool) -> None:
    try:
        if sync:
            with contextlib.suppress(OSError):
                os.fsync(fd)
    finally:
        with contextlib.suppress(OSError):
            os.close(fd)


def _run() -> None:
    global _open_jobs
    while True:
        fd, sync = _jobs.get()
        try:
            _do(fd, sync)
        finally:
            with _done:
                _open_jobs -= 1
                _done.notify_all()


@atexit.register
def _at_exit() -> None:
    """Jobs handed over before now finish (bounded); any handed over later (sinks closed by another exit
    handler) run inline."""
    global _exiting
    _exiting = True
    wait(EXIT_WAIT_S)


def _after_fork_in_child() -> None:
    """The parent's jobs are the parent's: the child forgets them (its copies of their descriptors are
    closed) and starts its own thread when it needs one."""
    global _jobs, _done, _open_jobs, _thread
    old = _jobs
    _jobs, _done, _open_jobs, _thread = queue.SimpleQueue(), threading.Condition(), 0, None
    while True:
        try:
            fd, _ = old.get_nowait()
        except queue.Empty:
            break
        with contextlib.suppress(OSError):
            os.close(fd)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
