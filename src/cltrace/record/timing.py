"""``timing`` and ``EventTimer``: device-event timing of calls and intervals."""
from __future__ import annotations

import math
import time
from typing import Any, Callable, Sequence

import pyopencl as cl

from .. import _state
from ..errors import EventTimerError
from ..timeline.spans import REGION
from ..timeline.stamps import wait_events
from . import regions
from .callsite import capture as _site
from .queues import active_queue, require_profiling
from .recorder import new_id


class EventTimer:
    """Device time between ``start()`` and ``stop()`` on one queue, from marker events.

    ``stop()`` waits for the end marker and returns milliseconds of device time:
    ``END(stop marker) - END(start marker)``, i.e. the time the queue spent on the
    commands enqueued in between. The timer keeps one pair of event slots and reuses them.
    While tracing, each interval is also a span named ``name``: a region of the thread's open
    region at ``start()``, with its host bracket and its device span between the two markers.
    """

    __slots__ = ("queue", "name", "_ev0", "_ev1", "_rec", "elapsed_ms")

    def __init__(self, queue: Any, name: str = "EventTimer") -> None:
        require_profiling(queue, "EventTimer")
        self.queue = queue
        self.name = name
        self._ev0: Any = None
        self._ev1: Any = None
        self._rec: tuple | None = None  # (id, parent, path, thread key, site, host begin) while traced
        self.elapsed_ms: float | None = None  # set when used as a context manager

    def start(self) -> None:
        if self._ev0 is not None:
            raise EventTimerError("EventTimer.start() called twice without stop()")
        if _state.ENABLED:
            st = regions._tls.stack
            parent, path = st[-1] if st else regions._ROOT
            self._rec = (new_id(), parent, path + (self.name,), st.key, _site(2), time.perf_counter_ns())
        self._ev0 = cl.enqueue_marker(self.queue)

    def stop(self) -> float:
        if self._ev0 is None:
            raise EventTimerError("EventTimer.stop() called before start()")
        self._ev1 = cl.enqueue_marker(self.queue)
        rec, self._rec = self._rec, None
        if rec is not None and _state.ENABLED:
            sid, parent, path, key, site, hb = rec
            regions._push((REGION, self.name, sid, parent, path, key, hb, time.perf_counter_ns(),
                           self.queue, self._ev0, self._ev1, None, None, None, site))
        wait_events([self._ev1])
        ns = self._ev1.profile.end - self._ev0.profile.end
        self._ev0 = None
        return ns / 1e6

    @property
    def running(self) -> bool:
        return self._ev0 is not None

    def __enter__(self) -> "EventTimer":
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._ev0 is not None:
            self.elapsed_ms = self.stop()


def _events_of(result: Any) -> list[Any] | None:
    if isinstance(result, cl.Event):
        return [result]
    if isinstance(result, (list, tuple)) and result and all(isinstance(e, cl.Event) for e in result):
        return list(result)
    return None


def _span_ns(events: Sequence[Any]) -> int:
    """Device time covered by a call's events: first START to last END."""
    return max(e.profile.end for e in events) - min(e.profile.start for e in events)


def timing(fn: Callable[..., Any], *args: Any, n_warmup: int = 3, n: int = 100,
           queue: Any = None, **kwargs: Any) -> tuple[float, float, list[float]]:
    """Device time of ``fn(*args, **kwargs)``: ``(mean_s, std_s, per_call_s)``.

    If ``fn`` returns a ``cl.Event`` (or a list of them) each call's time is first
    START to last END of those events. Otherwise each call is bracketed by two
    markers on ``queue`` (or the active queue), giving the device time the queue
    spent on that call. Wall clock is never used: without events and without a
    queue this raises.
    """
    if n < 1:
        raise ValueError("timing: n must be >= 1")
    q = queue if queue is not None else active_queue()
    for _ in range(n_warmup):
        fn(*args, **kwargs)
    per_call: list[float] = []
    pairs: list[tuple[Any, Any]] = []
    ev_lists: list[list[Any]] = []
    for _ in range(n):
        ev0 = cl.enqueue_marker(q) if q is not None else None
        res = fn(*args, **kwargs)
        evs = _events_of(res)
        if evs is not None:
            for e in evs:
                require_profiling(e.command_queue, "timing")
            ev_lists.append(evs)
            continue
        if q is None:
            raise ValueError(
                "timing: fn returned no cl.Event and no queue is known. Return the event(s) "
                "from fn, pass queue=..., or call cltrace.set_queue(q)."
            )
        require_profiling(q, "timing")
        pairs.append((ev0, cl.enqueue_marker(q)))
    if ev_lists:
        wait_events([e for evs in ev_lists for e in evs])
        per_call = [_span_ns(evs) / 1e9 for evs in ev_lists]
    if pairs:
        wait_events([pairs[-1][1]])
        per_call += [(b.profile.end - a.profile.end) / 1e9 for a, b in pairs]
    mean = sum(per_call) / len(per_call)
    std = math.sqrt(sum((x - mean) ** 2 for x in per_call) / (len(per_call) - 1)) if len(per_call) > 1 else 0.0
    return mean, std, per_call
