"""Work a program need not wait for once its trace files are closed, on one background thread: a closed
file's fsync, the last close of a file a rename replaced (where the kernel frees its blocks), the heap's
free memory given back to the OS.

``stop()`` paid all of it inline: for a 2,000-step trace on an H200 host 2-12 ms of fsync for two
files, 6-9 ms freeing the previous run's files, ~1 ms trimming the heap. Nothing here may change a
file's bytes: its path can be written afresh, in place, before a job runs. A closed file's bytes are the kernel's at once: every
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
from typing import Any, Callable

EXIT_WAIT_S = 10.0

_jobs: "queue.SimpleQueue[tuple[Callable[..., Any], tuple[Any, ...]]]" = queue.SimpleQueue()
_done = threading.Condition()
_open_jobs = 0
_thread: threading.Thread | None = None
_exiting = False


def sync_and_close(fd: int) -> None:
    """fsync ``fd``, then close it. ``fd`` is handed over: e.g. an ``os.dup`` of a file the caller closes."""
    later(_sync_close, fd)


def close(fd: int) -> None:
    """Close ``fd`` (handed over)."""
    later(_close, fd)


def later(fn: Callable[..., Any], *args: Any) -> None:
    """Run ``fn(*args)`` on the background thread (inline once the interpreter is exiting); what it
    raises is dropped: a job here has no caller left to tell."""
    _submit(fn, args)


def wait(timeout: float | None = None) -> bool:
    """Block until every job handed over so far is done (or ``timeout`` seconds); True if all are."""
    with _done:
        return _done.wait_for(lambda: _open_jobs == 0, timeout)


def _submit(fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
    global _open_jobs, _thread
    if not _exiting:
        with _done:
            _open_jobs += 1
            try:
                if _thread is None:
                    t = threading.Thread(target=_run, name="cltrace-offpath", daemon=True)
                    t.start()
                    _thread = t
                _jobs.put((fn, args))
                return
            except RuntimeError:  # no new threads now (the interpreter is shutting down)
                _open_jobs -= 1
    _do(fn, args)


def _do(fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
    with contextlib.suppress(Exception):
        fn(*args)


def _sync_close(fd: int) -> None:
    try:
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        _close(fd)


def _close(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.close(fd)


def _run() -> None:
    global _open_jobs
    while True:
        fn, args = _jobs.get()
        try:
            _do(fn, args)
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
            fn, args = old.get_nowait()
        except queue.Empty:
            break
        if fn in (_sync_close, _close):
            _close(args[0])


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
