"""The resolved span: what every exporter and report consumes.

A span is one logical piece of work. It always has a host placement (the
thread that opened it, host ``perf_counter_ns`` begin/end). Work that ran on a
device also has a device placement: the four OpenCL profiling stamps mapped
onto the host timeline (``dev_*``), plus the raw device stamps, so that
``dev_end - dev_start`` equals the event's ``END - START`` exactly.
"""
from __future__ import annotations

from typing import Any

# Categories. Plain strings so exporters can write them without a lookup.
REGION = "region"
KERNEL = "kernel"
TRANSFER = "transfer"
FILL = "fill"
MARKER = "marker"
COMPILE = "compile"
BUILD = "build"
AUTOTUNE = "autotune"
TRIAL = "trial"
SYNC = "sync"  # host-only: the host blocked until the device caught up (finish, wait)
STEP = "step"  # a training step of a scheduled session: a root span named "step N", path ("step",)
# Categories a timing_region may carry: bracketing spans whose path is recorded as is (it ends in
# their name; a step's ends in "step", so every step's children add up under one path).
REGION_CATS = frozenset({REGION, AUTOTUNE, TRIAL, STEP})

# Where a span's times come from (principle: a number says where it came from).
SOURCE_DEVICE = "device"  # device stamps exist and were mapped to the host clock
SOURCE_HOST = "host"  # host-only: no device stamps (no queue, or a queue without profiling)

STATUS_OK = "ok"
STATUS_ERROR = "error"


class Span:
    """One resolved span. Times are nanoseconds on the host ``perf_counter_ns`` timeline."""

    __slots__ = (
        "id", "parent", "name", "cat", "thread", "host_begin", "host_end",
        "device_track", "dev_queued", "dev_submit", "dev_start", "dev_end",
        "raw_start", "raw_end", "attrs", "status", "error", "path", "site",
    )

    def __init__(
        self,
        id: int,
        parent: int,
        name: str,
        cat: str,
        thread: int,
        host_begin: int,
        host_end: int,
        device_track: int | None = None,
        dev_queued: int | None = None,
        dev_submit: int | None = None,
        dev_start: int | None = None,
        dev_end: int | None = None,
        raw_start: int | None = None,
        raw_end: int | None = None,
        attrs: dict[str, Any] | None = None,
        status: str = STATUS_OK,
        error: str | None = None,
        path: tuple[str, ...] = (),
        site: Any = None,
    ) -> None:
        self.id = id
        self.parent = parent
        self.name = name
        self.cat = cat
        self.thread = thread  # host track id (see tracks.TrackRegistry)
        self.host_begin = host_begin
        self.host_end = host_end
        self.device_track = device_track  # device track id, or None for host-only spans
        self.dev_queued = dev_queued
        self.dev_submit = dev_submit
        self.dev_start = dev_start
        self.dev_end = dev_end
        self.raw_start = raw_start
        self.raw_end = raw_end
        self.attrs = attrs
        self.status = status
        self.error = error
        self.path = path  # region names from the root down to (and including) this span
        self.site = site  # the user's code location that caused it (timeline.sites.CallSite), or None

    @property
    def source(self) -> str:
        return SOURCE_DEVICE if self.dev_start is not None else SOURCE_HOST

    @property
    def host_ns(self) -> int:
        return self.host_end - self.host_begin

    @property
    def device_ns(self) -> int | None:
        """END - START in device ticks (ns), exactly as the driver reported them."""
        if self.raw_start is None or self.raw_end is None:
            return None
        return self.raw_end - self.raw_start

    def __repr__(self) -> str:
        dev = f" dev={self.device_ns}ns" if self.dev_start is not None else " host-only"
        return f"<Span {self.id} {self.cat}:{self.name} host={self.host_ns}ns{dev} {self.status}>"
