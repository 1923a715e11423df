"""Clock calibration on PoCL, and device spans placed inside their host brackets."""
from __future__ import annotations

import json
import time

import numpy as np
import pytest

import cltrace
from cltrace.timeline.clock import DeviceClock, classify_domain
from cltrace.record.recorder import RECORDER


@pytest.fixture()
def clock(queue):
    return DeviceClock(queue.device, queue.context)


def test_calibration_bound_is_small_positive_and_domain_is_classified(clock, clock_domain):
    p = clock.points[0]
    assert p.method in ("marker-bracket", "device-and-host-timer")
    assert 0 < p.bound_ns < 100_000
    assert clock.bound_ns == p.bound_ns
    assert clock.domain == clock_domain
    meta = clock.metadata()
    assert meta["domain"] == clock_domain and meta["bound_ns"] == clock.bound_ns and meta["points"] == 1


def test_classify_domain_names_the_clock():
    assert classify_domain(time.time_ns() - time.perf_counter_ns()) == "unix-epoch"
    assert classify_domain(time.monotonic_ns() - time.perf_counter_ns()) == "monotonic"
    assert classify_domain(10**17) == "device-private"


def _calibrate(clock, n: int) -> None:
    """``n`` more calibrations, then more until 3 points are kept (a loaded host gets some rejected)."""
    tries = 0
    for _ in range(n):
        clock.calibrate()
        tries += 1
    while len(clock.points) < 3 and tries < 50:
        clock.calibrate()
        tries += 1
    assert len(clock.points) + getattr(clock, "rejected", 0) == 1 + tries
    assert len(clock.points) >= 3


def test_recalibration_adds_points_whose_bounds_agree(clock):
    _calibrate(clock, 5)
    assert [p.host_ns for p in clock.points] == sorted(p.host_ns for p in clock.points)
    # The device and host clocks tick at the same rate over a few ms, so every point's
    # interval [offset - bound, offset + bound] holds the one true offset: they overlap.
    lo = max(p.offset_ns - p.bound_ns for p in clock.points)
    hi = min(p.offset_ns + p.bound_ns for p in clock.points)
    assert lo <= hi, [(p.offset_ns, p.bound_ns) for p in clock.points]
    assert clock.drift_ns <= 2 * clock.bound_ns


def test_interpolation_is_consistent_between_points(clock):
    _calibrate(clock, 3)
    pts = clock.points
    for p in pts:
        assert abs(clock.offset_at(p.host_ns + p.offset_ns) - p.offset_ns) <= 2 * clock.bound_ns
    first, last = pts[0], pts[-1]
    lo = min(p.offset_ns for p in pts)
    hi = max(p.offset_ns for p in pts)
    dev_first = first.host_ns + first.offset_ns
    dev_last = last.host_ns + last.offset_ns
    step = max(1, (dev_last - dev_first) // 50)
    stamps = range(dev_first - 10 * step, dev_last + 10 * step, step)
    for d in stamps:
        assert lo <= clock.offset_at(d) <= hi
        assert clock.to_host(d) == d - clock.offset_at(d)
    assert clock.offset_at(dev_first - 10**9) == first.offset_ns
    # Past the last point the map runs flat (points too close for a drift slope); it follows jittery
    # points at most 1000 ppm steeply, and its distance from them is part of the bound.
    assert abs(clock.offset_at(dev_last + 10**9) - last.offset_ns) <= clock.bound_ns
    hosts = [clock.to_host(d) for d in stamps]
    assert hosts == sorted(hosts)


def test_registry_recalibrates_every_clock_and_exports_the_points(tmp_path, queue, kernels, clock_domain):
    path = tmp_path / "recal.json"
    clocks = RECORDER.clocks
    with cltrace.trace(path):
        with cltrace.region("warm", queue):
            kernels.launch_add(queue)
    clk = clocks.for_queue(queue)
    before = len(clk.points) + getattr(clk, "rejected", 0)
    saved = clocks.recalibrate_s
    clocks.recalibrate_s = 0.0
    try:
        RECORDER.flush()
        RECORDER.flush()
    finally:
        clocks.recalibrate_s = saved
    assert len(clk.points) + getattr(clk, "rejected", 0) == before + 2
    meta = RECORDER.metadata()["clocks"]
    (key,) = [k for k in meta if clk.device.name.strip() in k]
    assert meta[key]["points"] == len(clk.points)
    with open(path) as fh:
        exported = json.load(fh)[-1]["args"]["clocks"][key]
    assert exported["domain"] == clock_domain and 0 < exported["bound_ns"] < 100_000


def test_device_spans_lie_within_their_host_brackets(queue, kernels):
    cltrace.start()
    for i in range(20):
        with cltrace.region("outer", queue):
            kernels.launch_spin(queue, 20 * i)
            with cltrace.region("inner", queue):
                kernels.launch_add(queue)
            with cltrace.region("host_only"):
                kernels.launch_add(queue)
    cltrace.stop()
    spans = RECORDER.spans()
    bound = RECORDER.clocks.for_queue(queue).bound_ns
    kernel_spans = [s for s in spans if s.cat == "kernel"]
    region_spans = [s for s in spans if s.cat == "region" and s.name != "host_only"]
    assert len(kernel_spans) == 60 and len(region_spans) == 40
    for s in kernel_spans:
        assert s.source == "device"
        assert s.host_begin - bound <= s.dev_queued <= s.host_end + bound, s
        assert s.dev_queued <= s.dev_submit <= s.dev_start <= s.dev_end
        assert s.dev_start >= s.host_begin - bound
    for s in region_spans:
        assert s.source == "device"
        assert s.dev_start >= s.host_begin - bound
        assert s.host_begin - bound <= s.dev_queued <= s.host_end + bound


def test_kernel_durations_equal_end_minus_start_exactly(tmp_path, queue, kernels):
    path = tmp_path / "dur.json"
    events = {}
    with cltrace.trace(path):
        for i in range(10):
            events[f"k{i}"] = cltrace.launch(kernels.spin, queue, (kernels.n,), None, kernels.a,
                                             np.int32(10 * i), name=f"k{i}")
    with open(path) as fh:
        evs = json.load(fh)
    host_pid = evs[0]["pid"]
    seen = 0
    for e in evs:
        if e.get("ph") != "X" or e["name"] not in events:
            continue
        p = events[e["name"]].profile
        a = e["args"]
        assert (a["device.start"], a["device.end"]) == (p.start, p.end)
        if e["pid"] != host_pid:
            assert round(e["dur"] * 1000) == p.end - p.start
            seen += 1
    assert seen == 10
    for s in RECORDER.spans():
        if s.name in events:
            p = events[s.name].profile
            assert s.device_ns == p.end - p.start == s.dev_end - s.dev_start
