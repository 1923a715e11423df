"""Waking the main thread for a SIGTERM it has not handled: the session's SIGTERM handler must run.

Python runs a signal's handler in the main thread, when that thread next checks for signals. A
SIGTERM caught by another thread, or just before the main thread blocks, waits while the main thread
sleeps: for ever in a lock nobody releases. Seen in a pool worker terminated by its pool, asleep in
the task queue's lock (gdb: SIGTERM tripped, the main thread in ``sem_wait``), which hung the pool's
``join`` with it. Without cltrace's handler the default action would have ended the process.

The interpreter writes every signal it catches to the wakeup fd: a thread here waits on it; a SIGTERM
byte that nobody has taken after ``GRACE_S`` means the handler has not run, and the thread sends
SIGTERM to the main thread itself (``pthread_kill``), which interrupts its wait; the handler drains
the pipe first thing (``handled()``). Used only where no wakeup fd was set (asyncio's is left alone).
"""
from __future__ import annotations

import contextlib
import os
import select
import signal
import threading
import time
from typing import Any

GRACE_S = 0.1  # how long a SIGTERM may wait for the handler before the main thread is woken

_lock = threading.RLock()  # taking the bytes and waking vs. the handler draining them
_pipe: tuple[int, int] | None = None  # (read end, write end) of this process's watcher


def start(handler: Any) -> None:
    """Watch for SIGTERMs the main thread misses while ``handler`` is SIGTERM's (call from the main
    thread)."""
    global _pipe
    if _pipe is not None or not hasattr(signal, "pthread_kill") or not hasattr(os, "pipe2"):
        return
    r, w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        prev = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
    except (ValueError, OSError):
        prev = None
    if prev != -1:  # the program's (asyncio), or none possible: leave it as it is
        if prev is not None:
            signal.set_wakeup_fd(prev)
        os.close(r)
        os.close(w)
        return
    _pipe = (r, w)
    threading.Thread(target=_watch, args=(r, threading.main_thread().ident, handler), name="cltrace-sigterm",
                     daemon=True).start()


def stop() -> None:
    """Stop watching (from the main thread): the wakeup fd back to none, the watcher ends."""
    global _pipe
    if _pipe is None:
        return
    r, w = _pipe
    _pipe = None
    with contextlib.suppress(ValueError, OSError):
        now = signal.set_wakeup_fd(-1)
        if now != w:  # set by the program since: its own
            signal.set_wakeup_fd(now)
    os.close(w)  # the watcher reads the end of the pipe, closes its end and ends


def handled() -> None:
    """The handler is running: take the bytes that woke the watcher, so it does not wake the main
    thread again."""
    if _pipe is None:
        return
    with _lock, contextlib.suppress(OSError):
        while os.read(_pipe[0], 512):
            pass


def _after_fork_in_child() -> None:
    """The parent's pipe is the parent's (its watcher did not come along): a signal here must not
    wake the parent's main thread. ``start()`` makes this process's own, if it traces."""
    global _pipe, _lock
    _lock = threading.RLock()  # the parent's may have been held by its watcher
    if _pipe is None:
        return
    r, w = _pipe
    _pipe = None
    with contextlib.suppress(ValueError, OSError):  # (the forking thread is this process's main thread)
        now = signal.set_wakeup_fd(-1)
        if now != w:
            signal.set_wakeup_fd(now)
    for fd in (r, w):
        with contextlib.suppress(OSError):
            os.close(fd)


def _watch(r: int, main: int, handler: Any) -> None:
    try:
        while True:
            select.select([r], [], [])
            time.sleep(GRACE_S)
            with _lock:
                try:
                    data = os.read(r, 512)
                except BlockingIOError:  # the handler took them
                    continue
                if not data:  # stop() closed the write end
                    return
                if signal.SIGTERM in data and signal.getsignal(signal.SIGTERM) is handler:
                    signal.pthread_kill(main, signal.SIGTERM)
    except (OSError, ValueError):
        return
    finally:
        with contextlib.suppress(OSError):
            os.close(r)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
