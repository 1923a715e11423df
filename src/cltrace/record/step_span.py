"""A step's span: a root region named ``step N`` that the regions opened during the step nest under.

Opened and closed once per step (never on a launch or region's path). The step goes on top
of the calling thread's region stack with the path ``("step",)`` and parent 0, whatever is
open beneath it: it is always a root, and every step's children add up under one path
(``step/forward``) in the reports. With a queue (given, or the active one of
``cltrace.set_queue``) it also gets a device span, as a region does: projected from the commands the
thread launched during the step (no command of its own) while regions are projected, else bracketed by
two markers.

Steps have three parts, one per layer: this span (``record``), the table of traced steps' host intervals that
decides which step a span belongs to (``timeline/step_table.py``), and a scheduled session's steps and
cycles (``capture/stepper.py``, ``capture/schedule.py``).
"""
from __future__ import annotations

import time
from typing import Any

import pyopencl as cl

from .callsite import capture
from ..errors import ProfilingNotEnabledError
from . import queues as _queues
from .queues import has_profiling
from .recorder import RECORDER, new_id
from .regions import _projected, _projects, _tls
from ..timeline.spans import STEP

PATH = (STEP,)
_perf = time.perf_counter_ns


class OpenStep:
    """A step begun and not yet ended: what its record needs at the end."""

    __slots__ = ("name", "span_id", "begin_ns", "attrs", "_stack", "_queue", "_ev0", "_project")

    def __init__(self, number: int, attrs: dict[str, Any] | None, queue: Any = None) -> None:
        self.name = f"step {number}"
        self.attrs = attrs
        self._stack = st = _tls.stack
        if queue is None:
            queue = _queues._default_queue
        if queue is not None and not has_profiling(queue):
            raise ProfilingNotEnabledError(f"cltrace.step on {self.name}")
        self._queue = queue
        self._project = project = queue is not None and _projects(queue, self.name)  # as a region's
        self.span_id = sid = new_id()
        st.append((sid, PATH))
        self.begin_ns = _perf()
        # projected: the thread's last command so far marks where the step's own commands begin
        self._ev0 = None if queue is None else st.last_ev if project else cl.enqueue_marker(queue)

    def end(self) -> int:
        """Close the step and record its span; returns its host end."""
        q, e0, ev1 = self._queue, self._ev0, None
        st = self._stack
        if q is not None:
            if self._project:
                e0, q = _projected(st, q, e0)
            else:
                ev1 = cl.enqueue_marker(q)
        end = _perf()
        sid = self.span_id
        if st and st[-1][0] == sid:
            st.pop()
        else:  # a region opened before the step is still open beneath it, or the step outlived one
            st[:] = [e for e in st if e[0] != sid]
        if not st and self._project:  # the thread's last command is no region's end now
            st.last_q = st.last_ev = None
        RECORDER.push((STEP, self.name, sid, 0, PATH, st.key, self.begin_ns, end, q, e0, ev1,
                       self.attrs, None, None, capture()))
        return end
