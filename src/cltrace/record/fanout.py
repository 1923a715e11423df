"""Writing one batch of spans into several sinks at once.

A sink's write is mostly C with the GIL released (``_chrome.fill`` for ``.json``, the ``.pftrace``
writer's encoding), so on a machine with cores to spare the second sink's write can run beside the
first's. ``stop()`` of a 2,000-step training loop traced to both files on an H200 host spent 3-13 ms
writing its last batch into one file after the other. A batch of at least ``MIN_ROWS`` rows, with two or
more sinks, on a machine of at least ``MIN_CPUS`` cores, goes to every sink but the first on a helper
thread of its own while the caller writes the first; anything else is written in turn on the caller's
thread, as before (on a small machine the helpers would take the traced program's cores).
``each`` does the same for any call, without the row threshold: ``stop()`` closes its files side by side
(on an H200 host the ``.json``'s close took 0.9-5.5 ms and the ``.pftrace``'s 1.9-2.9 ms, one after the other).
"""
from __future__ import annotations

import os
import queue
import threading
from typing import Any, Callable, Sequence

MIN_ROWS = 1024
MIN_CPUS = 4

OnError = Callable[[Any, BaseException], None]


def write_each(sinks: Sequence[Any], batch: Any, on_error: OnError) -> None:
    """``sink.write(batch)`` for every sink in turn; a sink that raises is reported to ``on_error``."""
    call_each(sinks, lambda sink: sink.write(batch), on_error)


def call_each(sinks: Sequence[Any], job: Callable[[Any], Any], on_error: OnError) -> None:
    """``job(sink)`` for every sink in turn; a sink that raises is reported to ``on_error``."""
    for sink in sinks:
        try:
            job(sink)
        except Exception as exc:
            on_error(sink, exc)


class _Helper:
    """A daemon thread running one job on one sink at a time, handed over by ``start``, awaited by ``join``."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[tuple[Any, Any]] = queue.SimpleQueue()
        self._done: queue.SimpleQueue[BaseException | None] = queue.SimpleQueue()
        threading.Thread(target=self._run, name="cltrace-sink-writer", daemon=True).start()

    def _run(self) -> None:
        while True:
            sink, job = self._jobs.get()
            try:
                job(sink)
            except BaseException as exc:  # handed back to the caller, who reports it as its own sink's
                self._done.put(exc)
            else:
                self._done.put(None)
            del sink, job  # not kept alive while idle

    def start(self, sink: Any, job: Callable[[Any], Any]) -> None:
        self._jobs.put((sink, job))

    def join(self) -> BaseException | None:
        return self._done.get()


class Fanout:
    """``write(sinks, batch, on_error)``: as ``write_each``, the sinks side by side where that pays (above);
    ``each(sinks, job, on_error)``: as ``call_each``, side by side wherever there are cores to spare."""

    def __init__(self) -> None:
        self._helpers: list[_Helper] = []
        self._pid = os.getpid()

    def write(self, sinks: Sequence[Any], batch: Any, on_error: OnError) -> None:
        if len(batch) < MIN_ROWS:
            write_each(sinks, batch, on_error)
        else:
            self.each(sinks, lambda sink: sink.write(batch), on_error)

    def each(self, sinks: Sequence[Any], job: Callable[[Any], Any], on_error: OnError) -> None:
        if len(sinks) < 2 or (os.cpu_count() or 1) < MIN_CPUS:
            call_each(sinks, job, on_error)
            return
        helpers = self._ready(len(sinks) - 1)
        if helpers is None:  # no thread to be had (the interpreter is shutting down)
            call_each(sinks, job, on_error)
            return
        for helper, sink in zip(helpers, sinks[1:]):
            helper.start(sink, job)
        try:
            call_each(sinks[:1], job, on_error)
        finally:
            for helper, sink in zip(helpers, sinks[1:]):
                exc = helper.join()
                if isinstance(exc, Exception):
                    on_error(sink, exc)
                elif exc is not None:
                    raise exc

    def _ready(self, n: int) -> list[_Helper] | None:
        """``n`` helpers of this process (a forked child's are its own: the parent's threads are not there)."""
        if self._pid != os.getpid():
            self._helpers, self._pid = [], os.getpid()
        try:
            while len(self._helpers) < n:
                self._helpers.append(_Helper())
        except RuntimeError:
            return None
        return self._helpers[:n]
