"""Switching tracing on and off, and attaching file exporters by path."""
from __future__ import annotations

import contextlib
import os
from typing import Any, Callable, Iterator

from . import _state
from .recorder import RECORDER

# Format name -> factory(path) -> sink. Exporter modules register themselves here.
FORMATS: dict[str, Callable[[str], Any]] = {}
SUFFIXES: dict[str, str] = {".json": "json"}

_session_sinks: list[Any] = []


def register_format(name: str, suffix: str, factory: Callable[[str], Any]) -> None:
    FORMATS[name] = factory
    SUFFIXES[suffix] = name


def _builtin_formats() -> None:
    from .export.chrome import ChromeTraceSink

    FORMATS.setdefault("json", ChromeTraceSink)
    try:
        from .export import perfetto  # noqa: F401  (registers "pftrace")
    except ImportError:
        pass


def format_for(path: str) -> str:
    _builtin_formats()
    for suffix, name in SUFFIXES.items():
        if path.endswith(suffix):
            return name
    raise ValueError(f"cannot tell the trace format of {path!r}: use one of {sorted(SUFFIXES)}")


def sink_for(path: str, fmt: str | None = None) -> Any:
    _builtin_formats()
    fmt = fmt or format_for(path)
    try:
        return FORMATS[fmt](path)
    except KeyError:
        raise ValueError(f"unknown trace format {fmt!r}: choose from {sorted(FORMATS)}") from None


def start(*outputs: str | Any, capacity: int | None = None, overflow: str | None = None) -> None:
    """Turn tracing on. Each output is a path (format from its suffix) or a sink object."""
    RECORDER.configure(capacity=capacity, overflow=overflow)
    for out in outputs:
        sink = sink_for(os.fspath(out)) if isinstance(out, (str, os.PathLike)) else out
        RECORDER.add_sink(sink)
        _session_sinks.append(sink)
    _state.ENABLED = True


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
            from .export.otlp import otlp_sink_from_env

            sink = otlp_sink_from_env()
            if sink is not None:
                outs.append(sink)
        start(*outs)
