"""Exceptions cltrace raises. Each message names the fix."""
from __future__ import annotations


class CltraceError(Exception):
    """Base class for cltrace errors."""


class OutputError(CltraceError, ValueError):
    """A trace output path that cannot be written: unknown suffix, a file where a folder
    should be, no permission. The message names the path and the fix."""


class DeviceError(CltraceError, LookupError):
    """No OpenCL device cltrace can use: none found, or the chosen one's compiler fails every
    build. The message names the device, the compiler's reason and the fix."""


class ProfilingNotEnabledError(CltraceError):
    """A queue without PROFILING_ENABLE was asked for device times."""

    def __init__(self, what: str) -> None:
        super().__init__(
            f"{what}: the command queue was created without "
            "cl.command_queue_properties.PROFILING_ENABLE, so the device has no timestamps "
            "for it (the flag cannot be switched on after creation). "
            "Fix: create the queue with cltrace.profiling_queue(ctx) or pass "
            "properties=cl.command_queue_properties.PROFILING_ENABLE."
        )


class EventTimerError(CltraceError):
    """EventTimer used out of order (stop before start, start twice)."""


class TraceFileError(CltraceError):
    """A trace file is missing, truncated beyond repair or not a trace."""


class WindowError(CltraceError, ValueError):
    """A window of a report (steps, a time range, a region) that the trace does not have, or that
    contradicts itself. The message says what the trace has."""


class MissingExtraError(CltraceError, ImportError):
    """A feature whose optional dependencies are not installed. Importing cltrace and writing or
    reading .json/.pftrace need none; OTLP export, plots and the store each need their extra, and
    the message names it: ``--otlp needs the [otlp] extra: pip install 'cltrace[otlp]'``."""

    def __init__(self, feature: str, extra: str) -> None:
        super().__init__(f"{feature} needs the [{extra}] extra: pip install 'cltrace[{extra}]'")
        self.feature = feature
        self.extra = extra
