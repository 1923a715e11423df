"""OpenTelemetry context, both ways, while an OTLP sink is attached.

In: a region opened under a foreign OpenTelemetry span (the SDK's, or one extracted from a
request) notes it in ``PARENTS``, keyed by cltrace span id, so the OTLP mapping hangs the region,
and through it its kernels and nested regions, under that span in that span's trace.
Out: while open, each region is the current OpenTelemetry span (a non-recording one carrying the
ids the OTLP sink exports the region under), so spans the SDK starts inside become its children.

Cost: nothing while no OTLP sink is attached: ``claim`` swaps ``OtelRegion`` in as the type
``timing_region`` makes and ``release`` swaps the import-time choice back, so the region path
reads no extra flag. While on, a region runs the Python path plus one context read, one attach
and one detach (``benchmarks/bench_region.py``).
"""
from __future__ import annotations

import itertools
import os
import threading
from typing import Any

from opentelemetry.context import attach as _attach
from opentelemetry.context import detach as _detach
from opentelemetry.context import get_current as _get_current
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags
from opentelemetry.trace import get_current_span as _current_span
from opentelemetry.trace import set_span_in_context as _set_span

from . import regions
from .regions import _Region

# cltrace span id -> (trace id, OTel parent span id, parent is remote) of a region whose OTLP
# placement differs from the default (its cltrace parent, in the run's trace). Only grows while
# on; past PARENTS_MAX the older half goes (their spans are long exported by then).
PARENTS: dict[int, tuple[int, int, bool]] = {}
PARENTS_MAX = 1 << 17

# The ids the claimed OTLP sinks export under: span id = cltrace id ^ KEY, the run's trace id,
# and (trace id, span id) of the span current when the first sink started (the ``cltrace.run``
# root's parent; a top-level region under it stays under ``cltrace.run``).
KEY = 0
TRACE_ID = 0
ROOT_PARENT: tuple[int, int] | None = None
_root_remote = False
_users = 0
_saved: tuple[Any, Any] | None = None
_lock = threading.Lock()
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)


class OtelRegion(_Region):
    """A region that also takes part in the OpenTelemetry context (see the module docstring)."""

    __slots__ = ("_token",)

    def __enter__(self) -> "OtelRegion":
        _Region.__enter__(self)
        sid = self._id
        p = self._parent
        ctx = _get_current()
        cur = _current_span(ctx).get_span_context()
        pe = PARENTS.get(p) if p else None
        ptrace = TRACE_ID if pe is None else pe[0]
        natural = (ptrace, p ^ KEY) if p else ROOT_PARENT
        if cur.is_valid and (cur.trace_id, cur.span_id) != natural:
            e: tuple[int, int, bool] | None = (cur.trace_id, cur.span_id, cur.is_remote)
        elif pe is not None:  # under a region that has its own trace: inherit it
            e = (ptrace, p ^ KEY, False)
        else:
            e = None
        trace = TRACE_ID
        if e is not None:
            trace = e[0]
            PARENTS[sid] = e
            if len(PARENTS) > PARENTS_MAX:
                _evict()
        span = NonRecordingSpan(SpanContext(trace, sid ^ KEY, False, _SAMPLED))
        self._token = _attach(_set_span(span, ctx))
        return self

    def __exit__(self, et: Any, ev: Any, tb: Any) -> None:
        try:
            _detach(self._token)
        finally:
            _Region.__exit__(self, et, ev, tb)


def _evict() -> None:
    for k in list(itertools.islice(PARENTS, len(PARENTS) // 2)):
        PARENTS.pop(k, None)


def claim(key: int, trace_id: int, root_parent: int | None, root_remote: bool) -> tuple[int, int, int | None, bool]:
    """An OTLP sink starts: the first one's ids become those every region exposes, and the
    returned (key, trace id, root parent span id, root parent remote) are what the sink exports
    under (a sink started while another is attached shares its ids)."""
    global KEY, TRACE_ID, ROOT_PARENT, _root_remote, _users, _saved
    with _lock:
        if _users == 0:
            KEY, TRACE_ID, _root_remote = key, trace_id, root_remote
            ROOT_PARENT = None if root_parent is None else (trace_id, root_parent)
            PARENTS.clear()
            _saved = regions.swap_region_types((OtelRegion, OtelRegion))
        _users += 1
        return KEY, TRACE_ID, None if ROOT_PARENT is None else ROOT_PARENT[1], _root_remote


def release() -> None:
    """An OTLP sink closed: the last one puts the region types back and forgets ``PARENTS``."""
    global _users, _saved
    with _lock:
        if _users == 0:
            return
        _users -= 1
        if _users == 0:
            if _saved is not None:
                regions.swap_region_types(_saved)
                _saved = None
            PARENTS.clear()


def active() -> bool:
    """Whether regions take part in the OpenTelemetry context now."""
    return _users > 0


def _forget_after_fork() -> None:
    """A forked child has abandoned the parent's OTLP sinks: it claims ids of its own when its sink starts."""
    global _users, _saved, ROOT_PARENT, _lock
    _lock = threading.Lock()
    if _saved is not None:
        regions.swap_region_types(_saved)
    _users, _saved, ROOT_PARENT = 0, None, None
    PARENTS.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)
