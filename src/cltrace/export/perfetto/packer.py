"""Packer: compresses the .pftrace sink's chunks of packets and writes them, in order, on a thread of its own.

The compressors run without the GIL (``compress``), so on a machine with a core to spare the sink's
worker goes on resolving and encoding the next batch while the last one is packed, and its own rate
is that of the plain writer; the CPU time is the same. ``wait`` returns once every chunk handed over
is in the file object, which the sink calls before each flush, so what a flush makes durable is
everything written before it. At most ``DEPTH`` chunks wait: past that, ``submit`` waits for the
packer (the worker waits, never the program's threads). A write that fails (a full disk) is raised
by the next ``submit`` or ``wait``, in the sink's thread, as the plain writer would have raised it.
"""
from __future__ import annotations

import threading
from collections import deque
from typing import IO, Callable

DEPTH = 4


class Packer:
    def __init__(self, fh: IO[bytes], pack: Callable[[bytes | list[bytes]], bytes], written: Callable[[int], None]) -> None:
        self._fh = fh
        self._pack = pack
        self._written = written
        self._todo: deque[bytes | list[bytes]] = deque()
        self._busy = False
        self._error: BaseException | None = None
        self._cv = threading.Condition()
        self._stop = False
        self._thread: threading.Thread | None = None

    def submit(self, raw: bytes | list[bytes]) -> None:
        """Hands a chunk of whole packets over (in file order; a list of pieces is one chunk, joined by ``pack``)."""
        with self._cv:
            self._raise()
            while len(self._todo) >= DEPTH:
                self._cv.wait()
                self._raise()
            self._todo.append(raw)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="cltrace-pftrace-packer", daemon=True)
                self._thread.start()
            self._cv.notify_all()

    def wait(self) -> None:
        """Returns once every chunk handed over is written to the file object."""
        with self._cv:
            while self._todo or self._busy:
                self._cv.wait()
            self._raise()

    def close(self) -> None:
        """``wait``, then ends the thread."""
        try:
            self.wait()
        finally:
            with self._cv:
                self._stop = True
                self._cv.notify_all()
            if self._thread is not None:
                self._thread.join()
                self._thread = None

    def abandon(self) -> None:
        """In a forked child: the thread is the parent's (it does not run here); drop what waits."""
        self._todo.clear()
        self._thread = None
        self._cv = threading.Condition()

    def _raise(self) -> None:
        if self._error is not None:
            err, self._error = self._error, None
            raise err

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._todo and not self._stop:
                    self._cv.wait()
                if not self._todo:
                    return
                raw = self._todo.popleft()
                self._busy = True
                self._cv.notify_all()
            try:
                data = self._pack(raw)
                self._fh.write(data)
                self._written(len(data))
            except BaseException as exc:  # handed to the sink's thread: the next submit or wait raises it
                with self._cv:
                    self._error = exc
                    self._todo.clear()  # packets after a lost chunk would refer to its interned names
            finally:
                with self._cv:
                    self._busy = False
                    self._cv.notify_all()
