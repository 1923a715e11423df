"""Per-device clock calibration: device profiling stamps -> host ``perf_counter_ns``.

Drivers stamp events on clocks of their own (PoCL: CLOCK_MONOTONIC; NVIDIA:
Unix-epoch nanoseconds) and neither offers ``clGetDeviceAndHostTimer``. We
bracket a marker's QUEUED stamp between two host reads: the true offset
``device - host`` lies in ``[queued - h1, queued - h0]``. Intersecting the
intervals of the tightest samples gives the offset and a proven error bound.
Calibration is repeated (``recalibrate``) so drift over a long run is tracked.

The device -> host map is one fixed, strictly increasing function of device time per device:
piecewise linear through knots, extrapolated along the measured drift after the last one. A new
calibration never changes the map for device times already mapped: it first freezes the map
up to the latest stamp mapped so far (a knot there), then bends only the part ahead. So a
stamp maps to the same host time whenever it is resolved, and stamps keep their order.
"""
from __future__ import annotations

import bisect
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from .placement import Placement
from .stamps import wait_events

_perf = time.perf_counter_ns
log = logging.getLogger("cltrace")

# Steepest offset change per ns of device time the map follows (1000 ppm). Real oscillators drift
# by parts per million; a steeper apparent slope is calibration jitter, and a slope below 1 is what
# keeps the map strictly increasing.
MAX_SLOPE = 1e-3
MIN_DRIFT_SPAN_NS = 500_000_000  # points closer than this give no meaningful drift slope


@dataclass(frozen=True)
class CalibrationPoint:
    host_ns: int  # host time the point was taken (perf_counter_ns)
    offset_ns: int  # device_ns - host_ns
    bound_ns: int  # |true offset - offset_ns| <= bound_ns
    samples: int
    method: str  # "device-and-host-timer" or "marker-bracket"


def classify_domain(offset_ns: int) -> str:
    """Name the clock a device stamps with, from its offset to perf_counter_ns."""
    unix = time.time_ns() - _perf()
    mono = time.monotonic_ns() - _perf()
    if abs(offset_ns - unix) < 5_000_000_000:
        return "unix-epoch"
    if abs(offset_ns - mono) < 5_000_000_000:
        return "monotonic"
    return "device-private"


class DeviceClock:
    """Maps one device's stamps to host time, with a recorded error bound."""

    def __init__(self, device: Any, context: Any, samples: int = 64, keep: int = 8) -> None:
        import pyopencl as cl

        self.device = device
        self.samples = samples
        self.keep = keep
        self.resolution_ns = int(getattr(device, "profiling_timer_resolution", 1) or 1)
        self._queue = cl.CommandQueue(
            context, device, properties=cl.command_queue_properties.PROFILING_ENABLE
        )
        self._lock = threading.Lock()
        self.points: list[CalibrationPoint] = []
        self.rejected = 0
        self.failures = 0
        self._hosts: list[int] = []
        # The map: knots (device ns, offset ns), extrapolated with _slope after the last one.
        self._kd: list[int] = []
        self._ko: list[int] = []
        self._sl: list[float] = []  # slope of the segment starting at each knot
        self._mapped_max: int | None = None  # latest device stamp the map was used for
        self._arrays: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None  # the knots as arrays (knots())
        self._err = 0  # largest distance between the map and a calibration point
        self.placement = Placement(max(self.resolution_ns, 100))  # offsets commands are drawn with
        self.calibrate()
        self.domain = classify_domain(self.points[0].offset_ns)

    def _sample_host_timer(self) -> CalibrationPoint | None:
        """Use clGetDeviceAndHostTimer where the driver implements it (OpenCL 2.1+)."""
        get = getattr(self.device, "device_and_host_timer", None)
        if get is None:
            return None
        try:
            h0 = time.monotonic_ns()
            p0 = _perf()
            dev, host = get()
            p1 = _perf()
        except Exception:
            return None
        # The host timer is CLOCK_MONOTONIC on Linux; relate it to perf_counter_ns.
        mono_minus_perf = h0 - p0
        return CalibrationPoint((p0 + p1) // 2, int(dev) - (int(host) - mono_minus_perf),
                                self.resolution_ns + (p1 - p0) // 2, 1, "device-and-host-timer")

    def calibrate(self) -> CalibrationPoint:
        """Take one calibration point now and append it."""
        import pyopencl as cl

        point = self._sample_host_timer()
        if point is None:
            brackets = []
            q = self._queue
            for _ in range(self.samples):
                h0 = _perf()
                ev = cl.enqueue_marker(q)
                h1 = _perf()
                brackets.append((h0, h1, ev))
            wait_events([ev for _, _, ev in brackets])  # not q.finish(): instrument() records that
            stamped = []
            for h0, h1, ev in brackets:
                try:
                    stamped.append((h1 - h0, h0, h1, ev.profile.queued))
                except cl.Error:  # a driver may withhold one marker's stamps; use the others
                    continue
            if not stamped:
                raise RuntimeError("clock calibration: the driver returned no marker timestamps")
            tight = sorted(stamped, key=lambda s: s[0])[: self.keep]
            lo = max(qd - h1 for _, _, h1, qd in tight)
            hi = min(qd - h0 for _, h0, _, qd in tight)
            res = self.resolution_ns
            if lo <= hi:
                offset = (lo + hi) // 2
                bound = (hi - lo + 1) // 2 + res
            else:
                # Intervals disagree (stamp jitter): take the tightest and widen the bound.
                _, h0, h1, qd = tight[0]
                offset = qd - (h0 + h1) // 2
                bound = max(abs(offset - (qd - h1)), abs(offset - (qd - h0)), lo - hi) + res
            host_mid = (tight[0][1] + tight[0][2]) // 2
            point = CalibrationPoint(host_mid, offset, bound, len(tight), "marker-bracket")
        with self._lock:
            if self.points and point.bound_ns > 4 * min(p.bound_ns for p in self.points) + 1000:
                # A noisy calibration (host preempted mid-bracket) would bend the mapping more
                # than it informs it: count it, keep the tighter points.
                self.rejected += 1
                return point
            self.points.append(point)
            self._hosts.append(point.host_ns)
            self._add_knot(point)
        return point

    def _add_knot(self, p: CalibrationPoint) -> None:
        """Bend the map towards a new point, leaving it unchanged up to the latest stamp mapped.

        Each segment keeps the slope it was used with, so a stamp maps by the same formula before
        and after a later calibration (to the ns)."""
        d = p.host_ns + p.offset_ns
        kd, ko, sl = self._kd, self._ko, self._sl
        self._arrays = None
        if not kd:
            kd.append(d)
            ko.append(p.offset_ns)
            sl.append(0.0)
            self._update_slope()
            return
        m = self._mapped_max
        if m is not None and m > kd[-1]:  # freeze what was already used: the extrapolated line up to m
            ko.append(self._extrapolate(m))
            kd.append(m)
            sl.append(sl[-1])
        if d > kd[-1]:
            step = (p.offset_ns - ko[-1]) / (d - kd[-1])
            sl[-1] = max(-MAX_SLOPE, min(MAX_SLOPE, step))
            off = ko[-1] + round(sl[-1] * (d - kd[-1]))
            kd.append(d)
            ko.append(off)
            sl.append(0.0)
            self._err = max(self._err, abs(off - p.offset_ns))
        self._update_slope()

    def _update_slope(self) -> None:
        """Drift per ns from the newest point and the newest one at least MIN_DRIFT_SPAN_NS before it:
        the slope of the map after its last knot (where nothing was mapped yet)."""
        pts = self.points
        last = pts[-1]
        slope = 0.0
        for a in reversed(pts[:-1]):
            span = last.host_ns - a.host_ns
            if span >= MIN_DRIFT_SPAN_NS:
                slope = max(-MAX_SLOPE, min(MAX_SLOPE, (last.offset_ns - a.offset_ns) / span))
                break
        if self._mapped_max is None or self._mapped_max <= self._kd[-1]:
            self._sl[-1] = slope
            self._arrays = None

    def _extrapolate(self, d: int) -> int:
        return self._ko[-1] + round(self._sl[-1] * (d - self._kd[-1]))

    def _commit(self, latest: int) -> None:
        """Note that stamps up to ``latest`` were mapped (no later than the device's present)."""
        # A stamp past the device's present (plus slack for drift) is garbage from a driver: it must
        # not freeze the map ahead of every calibration to come.
        now = _perf() + self._extrapolate(_perf() + self._ko[-1]) + self.points[-1].bound_ns + 50_000_000
        latest = min(latest, now)
        if self._mapped_max is None or latest > self._mapped_max:
            self._mapped_max = latest

    def offsets(self, device_ns: np.ndarray) -> np.ndarray:
        """``offset_at`` for an array of device stamps (int64), in one pass."""
        d = np.asarray(device_ns, np.int64)
        if not len(d):
            return np.zeros(0, np.int64)
        kd, ko, sl = self.knots(int(d.max()))
        i = np.searchsorted(kd, d, "right") - 1
        before = i < 0
        i[before] = 0
        out = ko[i] + np.rint(sl[i] * (d - kd[i])).astype(np.int64)
        out[before] = ko[0]
        return out

    def knots(self, latest: int | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The map as arrays: knots (device ns, int64), offsets at them (int64), slopes after them (float64);
        and, in the same lock, note that stamps up to ``latest`` are mapped with it (None: nothing mapped)."""
        with self._lock:
            if self._arrays is None:
                self._arrays = (np.array(self._kd, np.int64), np.array(self._ko, np.int64),
                                np.array(self._sl, np.float64))
            if latest is not None:
                self._commit(latest)
            return self._arrays

    def to_host(self, device_ns: int) -> int:
        """Map a device stamp onto the host timeline."""
        return device_ns - self.offset_at(device_ns)

    def offset_at(self, device_ns: int) -> int:
        """Offset (device - host) the map applies at ``device_ns``: piecewise linear through the knots,
        along the measured drift after the last one, fixed once used."""
        with self._lock:
            self._commit(device_ns)
            i = bisect.bisect_right(self._kd, device_ns) - 1
            if i < 0:
                return self._ko[0]
            return self._ko[i] + round(self._sl[i] * (device_ns - self._kd[i]))

    @property
    def bound_ns(self) -> int:
        """Error bound of the mapping over the whole run (ns): the widest calibration bracket
        plus how far any point strays from the line through its neighbours (non-linear drift)."""
        pts = self.points
        worst = 0
        for a, b, c in zip(pts, pts[1:], pts[2:]):
            span = c.host_ns - a.host_ns
            if span > 0:
                pred = a.offset_ns + (c.offset_ns - a.offset_ns) * (b.host_ns - a.host_ns) // span
                worst = max(worst, abs(b.offset_ns - pred))
        return max(p.bound_ns for p in pts) + worst + self._err + self.placement.worst_ns

    @property
    def drift_ns(self) -> int:
        """Largest change of offset between the first and any later point."""
        first = self.points[0].offset_ns
        return max(abs(p.offset_ns - first) for p in self.points)

    def drift_rate(self) -> float:
        """Offset change per second of host time between the first and last points."""
        a, b = self.points[0], self.points[-1]
        return 0.0 if b.host_ns == a.host_ns else (b.offset_ns - a.offset_ns) / (b.host_ns - a.host_ns) * 1e9

    def metadata(self) -> dict[str, Any]:
        last = self.points[-1]
        return {
            "method": last.method,
            "domain": self.domain,
            "offset_ns": last.offset_ns,
            "bound_ns": self.bound_ns,
            "drift_ns": self.drift_ns,
            "drift_ns_per_s": round(self.drift_rate(), 1),
            "points": len(self.points),
            "rejected": self.rejected,
            "placement_ns": self.placement.worst_ns,  # how far drawn commands stray from the map (in bound_ns)
            "resolution_ns": self.resolution_ns,
        }


class ClockRegistry:
    """One DeviceClock per physical device, created on first use; metadata keyed by device uid.

    Two identical devices have a clock each, each with its own calibration, bound and drift.
    """

    def __init__(self, recalibrate_s: float = 2.0) -> None:
        self._clocks: dict[int, DeviceClock] = {}
        self._keys: dict[int, str] = {}
        self._lock = threading.Lock()
        self.recalibrate_s = recalibrate_s
        self._last = _perf()

    def for_queue(self, queue: Any, device_uid: str | None = None) -> DeviceClock:
        dev = queue.device
        ptr = dev.int_ptr
        clk = self._clocks.get(ptr)
        if clk is None:
            with self._lock:
                clk = self._clocks.get(ptr)
                if clk is None:
                    if not device_uid:
                        from .tracks import device_info

                        device_uid = device_info(dev).uid
                    clk = DeviceClock(dev, queue.context)
                    self._keys[ptr] = device_uid  # before the clock: metadata() reads both unlocked
                    self._clocks[ptr] = clk
        return clk

    @property
    def count(self) -> int:
        """Devices with a clock so far."""
        return len(self._clocks)

    def maybe_recalibrate(self) -> None:
        now = _perf()
        if (now - self._last) / 1e9 < self.recalibrate_s:
            return
        self._last = now
        for clk in list(self._clocks.values()):
            try:
                clk.calibrate()
            except Exception as exc:  # keep mapping with the points we have
                clk.failures += 1
                log.warning("cltrace: recalibrating %s failed: %s", clk.device.name.strip(), exc)

    def metadata(self) -> dict[str, dict[str, Any]]:
        out = {}
        for ptr, clk in list(self._clocks.items()):
            out[self._keys[ptr]] = clk.metadata()
        return out
