"""cltrace: where the time of OpenCL programs goes.

Spans with device timestamps (cl_event QUEUED/SUBMIT/START/END) mapped onto
one host timeline, nested regions, and exporters for Chrome JSON, Perfetto
and OTLP. Tracing is off until ``start()``/``trace()`` or ``CLTRACE=1``.
"""
from __future__ import annotations

from .errors import CltraceError, EventTimerError, ProfilingNotEnabledError, TraceFileError
from .queues import active_queue, default_device, has_profiling, profiling_queue, set_queue
from .recorder import RECORDER
from .regions import copy, launch, record_launch, region, timing_region
from .report import PerfCounter
from .session import enabled, start, stop, trace
from .spans import Span
from .timing import EventTimer, timing
from .compiler import BuildError, Kernel, Program, ProgramCache, compile
from .instrument import instrument, uninstrument
from .profile import LaunchProfile
from . import autotune  # the old module path, loaded first so that no later import of it rebinds the name below
from .tuning import AutotuneResult, Autotuner, Config, KernelTemplate, Trial, autotune

__all__ = [
    "CltraceError", "EventTimerError", "ProfilingNotEnabledError", "TraceFileError",
    "active_queue", "default_device", "has_profiling", "profiling_queue", "set_queue",
    "RECORDER", "copy", "launch", "record_launch", "region", "timing_region", "PerfCounter",
    "enabled", "start", "stop", "trace", "Span", "EventTimer", "timing",
    "compile", "Program", "Kernel", "LaunchProfile", "instrument", "uninstrument", "ProgramCache", "BuildError",
    "autotune", "Autotuner", "AutotuneResult", "KernelTemplate", "Config", "Trial",
]


def __getattr__(name: str) -> object:
    """``cltrace.OtlpSink``, imported on first use: importing cltrace does not load OpenTelemetry."""
    if name == "OtlpSink":
        from .export.otlp import OtlpSink

        return OtlpSink
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _init_from_env() -> None:
    from .session import start_from_env

    start_from_env()


_init_from_env()
