"""LaunchProfile: the device time of kernel launches, kept apart from compile and enqueue cost.

Pass one to a launch (``knl[gs, ls, q](*args, profile=p)``). The launch itself
only hands over its event and two host clock reads; device stamps are read
when a field is asked for, waiting for that launch's event only.

Reuse accumulates: a profile given to several launches counts them and keeps
count/total/mean/min/max of their kernel times (END - START), while the
per-launch fields (``kernel_ns``, ``start_ns``, ``enqueue_ns``, ``compile_ns``...)
describe the most recent launch. ``reset()`` starts over.
"""
from __future__ import annotations

from typing import Any

import pyopencl as cl

from ..errors import CltraceError
from ..timeline.stamps import wait_events
from .recorder import RECORDER

# Launches whose stamps are not read yet; past this the profile folds them in (waiting once).
MAX_PENDING = 4096


def _stamps(ev: Any, name: str) -> tuple[int, int, int, int]:
    try:
        wait_events([ev])
        p = ev.profile
        return p.queued, p.submit, p.start, p.end
    except cl.Error as exc:
        raise CltraceError(f"kernel {name!r}: no device times ({exc})") from exc


class LaunchProfile:
    """Kernel time of the launches it was passed to (see the module docstring).

    Last launch: ``name``, ``event``, ``kernel_ns`` (END - START, device ticks),
    ``queued_ns``/``submit_ns``/``start_ns``/``end_ns`` (on the host
    ``perf_counter_ns`` timeline), ``device_stamps`` (raw QUEUED/SUBMIT/START/END),
    ``enqueue_ns`` (host cost of the enqueue call), ``from_cache`` (the program came
    from the program cache) and ``compile_ns`` (compile/build time charged to this
    launch: a program's compile time goes to the first launch of its kernels, later
    launches carry 0). All launches: ``count``, ``total_ns``, ``mean_ns``, ``min_ns``, ``max_ns``.
    Not thread-safe: use one profile per launching thread.
    """

    __slots__ = ("count", "_n", "_total", "_min", "_max", "_pending", "name", "event", "queue",
                 "host_begin_ns", "host_end_ns", "from_cache", "compile_ns", "_last_stamps")

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Forget every launch."""
        self.count = 0
        self._n = 0
        self._total = 0
        self._min: int | None = None
        self._max: int | None = None
        self._pending: list[Any] = []
        self.name: str | None = None
        self.event: Any = None
        self.queue: Any = None
        self.host_begin_ns: int | None = None
        self.host_end_ns: int | None = None
        self.from_cache: bool | None = None
        self.compile_ns = 0
        self._last_stamps: tuple[int, int, int, int] | None = None

    def _add(self, event: Any, queue: Any, host_begin: int, host_end: int, name: str,
             from_cache: bool | None, compile_ns: int) -> None:
        """Take one launch (called by the launch path right after the enqueue)."""
        if len(self._pending) >= MAX_PENDING:
            self._fold()
        self._pending.append((event, name))
        self.count += 1
        self.event = event
        self.queue = queue
        self.name = name
        self.host_begin_ns = host_begin
        self.host_end_ns = host_end
        self.from_cache = from_cache
        self.compile_ns = compile_ns
        self._last_stamps = None

    # -- accumulated --------------------------------------------------------------------
    def _fold(self) -> None:
        pending = self._pending
        if not pending:
            return
        try:
            wait_events([ev for ev, _ in pending])
        except cl.Error:
            pass  # a failed launch raises below, with its name
        last = self.event
        for ev, name in pending:
            if ev is last and self._last_stamps is not None:
                st = self._last_stamps
            else:
                st = _stamps(ev, name)
                if ev is last:
                    self._last_stamps = st
            ns = st[3] - st[2]
            self._n += 1
            self._total += ns
            if self._min is None or ns < self._min:
                self._min = ns
            if self._max is None or ns > self._max:
                self._max = ns
        pending.clear()

    @property
    def total_ns(self) -> int:
        self._fold()
        return self._total

    @property
    def mean_ns(self) -> float | None:
        self._fold()
        return self._total / self._n if self._n else None

    @property
    def min_ns(self) -> int | None:
        self._fold()
        return self._min

    @property
    def max_ns(self) -> int | None:
        self._fold()
        return self._max

    # -- last launch --------------------------------------------------------------------
    def _last(self) -> tuple[int, int, int, int]:
        if self.event is None:
            raise CltraceError("LaunchProfile: no launch recorded yet (pass profile=... to a launch)")
        if self._last_stamps is None:
            self._last_stamps = _stamps(self.event, self.name or "?")
        return self._last_stamps

    @property
    def device_stamps(self) -> tuple[int, int, int, int]:
        """Raw device QUEUED, SUBMIT, START, END of the last launch (waits for it)."""
        return self._last()

    @property
    def kernel_ns(self) -> int:
        """END - START of the last launch, exactly as the driver reported them (waits for it)."""
        q, s, st, en = self._last()
        return en - st

    def _host(self, i: int) -> int:
        stamps = self._last()
        clock = RECORDER.clocks.for_queue(self.queue)
        try:  # the offset the trace draws this command with
            off = clock.placement.lookup(stamps[2])
        except LookupError:
            off = clock.offset_at(stamps[2])
        return stamps[i] - off

    @property
    def queued_ns(self) -> int:
        """QUEUED of the last launch on the host ``perf_counter_ns`` timeline."""
        return self._host(0)

    @property
    def submit_ns(self) -> int:
        return self._host(1)

    @property
    def start_ns(self) -> int:
        return self._host(2)

    @property
    def end_ns(self) -> int:
        return self._host(3)

    @property
    def enqueue_ns(self) -> int | None:
        """Host time the last launch's enqueue call took (argument binding excluded)."""
        if self.host_begin_ns is None or self.host_end_ns is None:
            return None
        return self.host_end_ns - self.host_begin_ns

    def as_dict(self) -> dict[str, Any]:
        """Every field (waits for all launches so far)."""
        out: dict[str, Any] = {"count": self.count, "total_ns": self.total_ns, "mean_ns": self.mean_ns,
                               "min_ns": self.min_ns, "max_ns": self.max_ns, "name": self.name}
        if self.event is not None:
            out.update(kernel_ns=self.kernel_ns, queued_ns=self.queued_ns, submit_ns=self.submit_ns,
                       start_ns=self.start_ns, end_ns=self.end_ns, device_stamps=list(self.device_stamps),
                       enqueue_ns=self.enqueue_ns, from_cache=self.from_cache, compile_ns=self.compile_ns)
        return out

    def __repr__(self) -> str:
        if self.event is None:
            return "<LaunchProfile: no launches>"
        return f"<LaunchProfile {self.name}: {self.count} launch(es), last enqueue {self.enqueue_ns} ns>"
