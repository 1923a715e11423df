"""Switching tracing on and off, and attaching file exporters by path."""
from __future__ import annotations

import contextlib
import os
from typing import Any, Iterator

from .. import _state
from ..export.formats import format_for, register_format, sink_for
from ..record.recorder import RECORDER

__all__ = ["start", "stop", "trace", "enabled", "start_from_env", "format_for", "sink_for", "register_format"]

_session_sinks: list[Any] = []


def start(*outputs: str | Any, capacity: int | None = None, overflow: str | None = None) -> None:
    """Turn tracing on. Each output is a path (format from its suffix) or a sink object."""
    RECORDER.configure(capacity=capacity, overflow=overflow)
    for out in outputs:
        sink = sink_for(os.fspath(out)) if isinstance(out, (str, os.PathLike)) else out
        RECORDER.add_sink(sink)
        _session_sinks.append(sink)
    _state.ENABLED = True
    RECORDER.activate()


def stop() -> None:
    """Turn tracing off, flush everything recorded and close the sinks ``start`` attached."""
    _state.ENABLED = False
    RECORDER.flush(block=True)
    while _session_sinks:
        RECORDER.remove_sink(_session_sinks.pop())


def enabled() -> bool:
    return _state.ENABLED


@contextlib.contextmanager
def trace(*outputs: str | Any, capacity: int | None = None, overflow: str | None = None) -> Iterator[Any]:
    """``with cltrace.trace("out.json"):`` traces the block and writes the file(s) at exit."""
    start(*outputs, capacity=capacity, overflow=overflow)
    try:
        yield RECORDER
    finally:
        stop()


def start_from_env() -> None:
    """``CLTRACE=1`` turns tracing on at import; ``CLTRACE_OUT`` names the output file(s);
    OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT also sends the spans there (``otlp_sink_from_env``)."""
    if os.environ.get("CLTRACE", "").strip().lower() in ("1", "true", "yes", "on"):
        outs: list[Any] = [p for p in os.environ.get("CLTRACE_OUT", "").split(os.pathsep) if p]
        if os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
            from ..export.otlp import otlp_sink_from_env

            sink = otlp_sink_from_env()
            if sink is not None:
                outs.append(sink)
        start(*outs)
