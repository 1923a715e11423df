"""cltrace: where the time of OpenCL programs goes.

Spans with device timestamps (cl_event QUEUED/SUBMIT/START/END) mapped onto
one host timeline, nested regions, and exporters for Chrome JSON, Perfetto
and OTLP. Tracing is off until ``start()``/``trace()`` or ``CLTRACE=1``.
"""
from __future__ import annotations

from typing import Any

from .errors import (CltraceError, DeviceError, EventTimerError, MissingExtraError, OutputError, ProfilingNotEnabledError,
                     TraceFileError, WindowError)
from .record.queues import active_queue, default_device, has_profiling, profiling_queue, set_queue
from .record import callsite as _callsite
from .record import regions as _regions
from .export import processes as _processes
from .record.recorder import RECORDER
from .record.allocations import Buffer, Image, SVMAllocation
from .record.regions import copy, launch, record_launch, region, timing_region
from .analyzers.report import PerfCounter
from .capture import session as _session
from .capture.session import enabled, start, stop, trace
from .capture.schedule import Schedule, schedule
from .capture.stepper import Cycle, step, steps
from .capture import children as _children  # noqa: F401  (forked children trace into files of their own)
from .timeline.spans import Span
from .record.timing import EventTimer, timing
from .programs.compiler import BuildError, Kernel, Program, ProgramCache, compile
from .capture.instrument import instrument, uninstrument
from .record.profile import LaunchProfile
from .tune import AutotuneResult, Autotuner, Config, KernelTemplate, Trial, autotune

__all__ = [
    "CltraceError", "DeviceError", "EventTimerError", "OutputError", "ProfilingNotEnabledError", "TraceFileError",
    "WindowError", "MissingExtraError",
    "active_queue", "default_device", "has_profiling", "profiling_queue", "set_queue",
    "RECORDER", "Buffer", "Image", "SVMAllocation", "copy", "launch", "record_launch", "region", "timing_region",
    "PerfCounter", "enabled", "start", "stop", "trace", "schedule", "Schedule", "step", "steps", "Cycle", "Span",
    "EventTimer", "timing",
    "compile", "Program", "Kernel", "LaunchProfile", "instrument", "uninstrument", "ProgramCache", "BuildError",
    "autotune", "Autotuner", "AutotuneResult", "KernelTemplate", "Config", "Trial", "analyze", "Analysis", "Window",
    "configure", "CallSite",
]
CallSite = _callsite.CallSite


def configure(*, library_modules: Any = None, stack_depth: int | None = None, regions: str | None = None,
              record_pyopencl: bool | None = None, command_line: str | None = None) -> None:
    """Call-site, region, recording and privacy settings. ``library_modules``: import names of modules
    (packages included) whose frames are not call sites, like cltrace's and pyopencl's own: a span then
    points at the line that called into them. ``stack_depth``: user frames a site records (1 by default;
    0: none). ``regions``: how a region on a queue gets its device span, ``"auto"`` (the default),
    ``"projected"`` or ``"markers"`` (see the README). ``record_pyopencl``: whether tracing records every
    command the program enqueues through pyopencl (True, the default; ``CLTRACE_PYOPENCL=0``) or leaves
    pyopencl alone, recording only cltrace's own launches and regions. ``command_line``: how outputs show
    the program's command line, ``"redacted"`` (the default: secret-looking values as ``***``) or ``"off"``
    (left out; over ``CLTRACE_COMMAND_LINE``). None leaves a setting as it is. A module that does not
    import or an unknown mode is a ``ValueError`` naming it."""
    if record_pyopencl is not None:
        _session.record_pyopencl(record_pyopencl)
    if regions is not None:
        _regions.set_region_mode(regions)
    if command_line is not None:
        _processes.set_command_line(command_line)
    _callsite.configure(library_modules=library_modules, stack_depth=stack_depth)


def __getattr__(name: str) -> object:
    """``cltrace.OtlpSink``, ``cltrace.Analysis`` and ``cltrace.Window``, imported on first use: importing cltrace loads
    neither OpenTelemetry nor the analysis modules."""
    if name == "OtlpSink":
        from .export.otlp import OtlpSink

        return OtlpSink
    if name == "Analysis":
        from .analyzers.analysis import Analysis

        return Analysis
    if name == "Window":
        from .analyzers.window import Window

        return Window
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def analyze(spans_or_path: Any = None, meta: dict[str, Any] | None = None, by_shape: bool = False,
            by: str | None = None, window: Any = "steady") -> Any:
    """Where the time went: an ``Analysis`` of a trace file (``.json``/``.pftrace``), a list of
    spans, or (None) the recorder's spans; ``by="callsite"`` (or ``"shape"``) splits the kernel
    table by the launching line (or launch shape). ``window``: the part of the run analysed, the
    steady state by default; ``None`` the whole run, ``"2:12"`` steps 2 to 12, or a ``cltrace.Window``
    (steps, a time range, a region). See ``cltrace.analyzers.analysis.analyze``; one module a question
    in ``cltrace.analyzers``.
    """
    from .analyzers.analysis import analyze as _analyze

    return _analyze(spans_or_path, meta=meta, by_shape=by_shape, by=by, window=window)


def _init_from_env() -> None:
    from .cli.from_env import start

    start()


_init_from_env()
