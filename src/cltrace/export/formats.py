"""Trace file formats: which sink writes a path, chosen by name or by the path's suffix.

Sinks are imported on first use, so ``import cltrace`` loads no OpenTelemetry; no sink here needs the
perfetto package or protobuf (only reading a .pftrace does).
"""
from __future__ import annotations

import importlib
from typing import Any, Callable

from ..record.recorder import Recorder
from .base import partial_path, put_in_place

# Format name -> (file suffix, "module:attribute" of its sink class, relative to this package).
_BUILTIN: dict[str, tuple[str, str]] = {
    "json": (".json", ".chrome:ChromeTraceSink"),
    "pftrace": (".pftrace", ".perfetto:PerfettoTraceSink"),
    "speedscope": (".speedscope.json", ".speedscope:SpeedscopeSink"),
}
_EXTRA: dict[str, tuple[str, Callable[[str], Any]]] = {}


def register_format(name: str, suffix: str, factory: Callable[[str], Any]) -> None:
    """Add a format: paths ending in ``suffix`` are written by ``factory(path)``."""
    _EXTRA[name] = (suffix, factory)


def names() -> list[str]:
    return sorted({*_BUILTIN, *_EXTRA})


def suffix(fmt: str) -> str:
    """The file suffix of a format name (``speedscope`` -> ``.speedscope.json``)."""
    if fmt in _EXTRA:
        return _EXTRA[fmt][0]
    if fmt not in _BUILTIN:
        raise ValueError(f"unknown trace format {fmt!r}: choose from {names()}")
    return _BUILTIN[fmt][0]


def format_for(path: str) -> str:
    """The format name a path's suffix stands for (the longest suffix that fits: ``.speedscope.json``
    before ``.json``)."""
    known = [*_EXTRA.items(), *_BUILTIN.items()]
    for name, (suffix, _) in sorted(known, key=lambda kv: -len(kv[1][0])):  # stable: extras first
        if path.endswith(suffix):
            return name
    suffixes = sorted({s for s, _ in [*_BUILTIN.values(), *_EXTRA.values()]})
    raise ValueError(f"cannot tell the trace format of {path!r}: use one of {suffixes}")


def factory(fmt: str) -> Callable[[str], Any]:
    """The sink class (or factory) of a format name."""
    if fmt in _EXTRA:
        return _EXTRA[fmt][1]
    if fmt not in _BUILTIN:
        raise ValueError(f"unknown trace format {fmt!r}: choose from {names()}")
    module, attr = _BUILTIN[fmt][1].split(":")
    return getattr(importlib.import_module(module, __package__), attr)


def sink_for(path: str, fmt: str | None = None) -> Any:
    """A new sink writing ``path`` in ``fmt`` (default: the format of the path's suffix)."""
    return factory(fmt or format_for(path))(path)


def file_writer(path: str) -> tuple[Any, Callable[[], None]]:
    """A sink writing the trace file ``path`` (format from its suffix) as ``<path>.partial``, and the
    call that renames it to ``path`` once the sink is closed (``Recorder.export`` of a path)."""
    sink = sink_for(partial_path(path), format_for(path))
    return sink, lambda: put_in_place(path)


Recorder.file_writer = staticmethod(file_writer)
