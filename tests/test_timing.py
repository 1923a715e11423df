"""``timing``, ``EventTimer``, profiling checks and ``PerfCounter`` on real OpenCL."""
from __future__ import annotations

import statistics

import numpy as np
import pyopencl as cl
import pytest

import cltrace
from cltrace import EventTimerError
from cltrace import ProfilingNotEnabledError
from cltrace.record.recorder import RECORDER


def _dur(ev) -> int:
    return ev.profile.end - ev.profile.start


def test_timing_of_fn_returning_an_event_is_end_minus_start(queue, kernels):
    events = []

    def run():
        ev = kernels.spin(queue, (kernels.n,), None, kernels.a, np.int32(100))
        events.append(ev)
        return ev

    mean, std, per_call = cltrace.timing(run, n_warmup=2, n=8)
    assert len(events) == 10 and len(per_call) == 8
    assert per_call == [_dur(ev) / 1e9 for ev in events[2:]]
    assert mean == pytest.approx(statistics.fmean(per_call), rel=1e-12)
    assert std == pytest.approx(statistics.stdev(per_call), rel=1e-9)


def test_timing_of_fn_returning_several_events_spans_first_start_to_last_end(queue, kernels):
    calls = []

    def run():
        evs = [kernels.add(queue, (kernels.n,), None, kernels.a, kernels.b) for _ in range(3)]
        calls.append(evs)
        return evs

    _, _, per_call = cltrace.timing(run, n_warmup=0, n=4)
    assert per_call == [(max(e.profile.end for e in evs) - min(e.profile.start for e in evs)) / 1e9
                        for evs in calls]


def test_timing_marker_mode_brackets_the_call_on_the_queue(queue, kernels):
    events = []

    def run() -> None:
        events.append(kernels.spin(queue, (kernels.n,), None, kernels.a, np.int32(200)))

    mean, std, per_call = cltrace.timing(run, n_warmup=1, n=6, queue=queue)
    assert len(per_call) == 6
    for t, ev in zip(per_call, events[1:]):
        assert t >= _dur(ev) / 1e9  # the markers bracket the kernel on an in-order queue
    cltrace.set_queue(queue)
    assert len(cltrace.timing(run, n_warmup=0, n=3)[2]) == 3


def test_timing_needs_events_or_a_queue(kernels, queue):
    with pytest.raises(ValueError, match="no cl.Event and no queue"):
        cltrace.timing(lambda: None, n_warmup=0, n=2)
    for n in (0, -1):
        with pytest.raises(ValueError, match="n must be >= 1"):
            cltrace.timing(lambda: kernels.add(queue, (kernels.n,), None, kernels.a, kernels.b), n=n)


def test_timing_refuses_events_of_a_queue_without_profiling(plain_queue, kernels):
    with pytest.raises(ProfilingNotEnabledError, match="PROFILING_ENABLE"):
        cltrace.timing(lambda: kernels.add(plain_queue, (kernels.n,), None, kernels.a, kernels.b),
                       n_warmup=0, n=1)
    with pytest.raises(ProfilingNotEnabledError):
        cltrace.timing(lambda: None, n_warmup=0, n=1, queue=plain_queue)
    plain_queue.finish()


def test_event_timer_measures_device_time_between_start_and_stop(queue, kernels):
    t = cltrace.EventTimer(queue)
    assert not t.running
    t.start()
    assert t.running
    ev = kernels.spin(queue, (kernels.n,), None, kernels.a, np.int32(300))
    ms = t.stop()
    assert not t.running
    assert ms >= _dur(ev) / 1e6 > 0
    t.start()  # reusable after stop
    assert t.stop() >= 0
    with cltrace.EventTimer(queue) as timer:
        ev = kernels.spin(queue, (kernels.n,), None, kernels.a, np.int32(300))
    assert timer.elapsed_ms >= _dur(ev) / 1e6


def test_event_timer_out_of_order_use_raises(queue):
    t = cltrace.EventTimer(queue)
    with pytest.raises(EventTimerError, match="before start"):
        t.stop()
    t.start()
    with pytest.raises(EventTimerError, match="twice"):
        t.start()
    assert t.stop() >= 0


def test_queues_without_profiling_are_refused_with_the_fix_named(plain_queue):
    def check(exc_info) -> None:
        msg = str(exc_info.value)
        assert "PROFILING_ENABLE" in msg and "cltrace.profiling_queue" in msg

    with pytest.raises(ProfilingNotEnabledError) as e:
        cltrace.EventTimer(plain_queue)
    check(e)
    assert "EventTimer" in str(e.value)
    with pytest.raises(ProfilingNotEnabledError) as e:
        cltrace.set_queue(plain_queue)
    check(e)
    assert cltrace.active_queue() is None
    cltrace.start()
    with pytest.raises(ProfilingNotEnabledError) as e:
        cltrace.timing_region("step", plain_queue)
    check(e)
    assert "timing_region('step')" in str(e.value)
    cltrace.stop()
    assert RECORDER.spans() == []


def _pct(values, p):
    s = sorted(values)
    k = (len(s) - 1) * p
    f = int(k)
    c = min(f + 1, len(s) - 1)
    return s[f] + (s[c] - s[f]) * (k - f)


def test_perf_counter_reports_nested_paths_on_device_and_host(queue, kernels, clock_domain):
    events = []
    cltrace.start()
    for i in range(12):
        with cltrace.region("train", queue):
            with cltrace.region("forward", queue):
                events.append(kernels.launch_spin(queue, 20 * (i % 4)))
            with cltrace.region("host_step"):
                pass
    try:
        with cltrace.region("train"):
            raise ValueError("x")
    except ValueError:
        pass
    cltrace.stop()
    d = cltrace.PerfCounter().as_dict()
    assert list(d) == ["train", "train/forward", "train/forward/spin", "train/host_step"]
    assert [d[k]["depth"] for k in d] == [0, 1, 2, 1]
    assert d["train"]["errors"] == 1
    assert d["train"]["host"]["count"] == 13 and d["train"]["device"]["count"] == 12

    k = d["train/forward/spin"]
    durs = [_dur(ev) for ev in events]
    dev = k["device"]
    assert dev["count"] == 12 and dev["total_ns"] == sum(durs)
    assert (dev["min_ns"], dev["max_ns"]) == (min(durs), max(durs))
    assert dev["mean_ns"] == pytest.approx(sum(durs) / 12)
    assert dev["p50_ns"] == pytest.approx(_pct(durs, 0.5))
    assert dev["p99_ns"] == pytest.approx(_pct(durs, 0.99))
    assert k["cat"] == "kernel" and k["name"] == "spin"
    for row in d.values():
        h = row["host"]
        assert h["min_ns"] <= h["p50_ns"] <= h["p99_ns"] <= h["max_ns"]
        assert h["total_ns"] >= h["max_ns"] and h["mean_ns"] * h["count"] == pytest.approx(h["total_ns"])
    assert d["train/host_step"]["device"] is None

    text = cltrace.PerfCounter().report()
    lines = text.splitlines()
    assert lines[0] == "cltrace report"
    head = lines[1]
    for col in ("region / kernel", "src", "count", "total ", "self ", "% parent", "% run", "mean ", "p50 ", "p99 "):
        assert col in head, col
    rows = {ln.split()[0]: ln for ln in lines[3:] if ln and not ln.startswith(" " * 12) and ln.split()[0] in
            ("train", "forward", "spin", "host_step")}
    assert rows["train"].startswith("train ") and rows["forward"].startswith("  forward")
    assert rows["spin"].startswith("    spin") and rows["host_step"].startswith("  host_step")
    assert rows["spin"].split()[1:3] == ["device", "12"]
    assert rows["host_step"].split()[1:3] == ["host", "12"]
    spin_enqueue = lines[lines.index(rows["spin"]) + 1]
    assert spin_enqueue.split()[:2] == ["enqueue", "12"]  # a kernel's host row is its enqueue cost
    assert "errors=1" in rows["train"]
    assert "spans: 49 recorded, 0 dropped" in text
    assert "bound ±" in text and f"({clock_domain})" in text


def test_perf_counter_reset_forgets(queue):
    cltrace.start()
    with cltrace.region("once"):
        pass
    pc = cltrace.PerfCounter()
    assert "once" in pc.as_dict()
    pc.reset()
    assert pc.as_dict() == {}
    cltrace.stop()


def test_profiling_check_follows_the_queue_not_a_reused_address(cl_ctx):
    for _ in range(3):
        prof = cltrace.profiling_queue(cl_ctx)
        assert cltrace.has_profiling(prof)
        cltrace.EventTimer(prof)
        del prof
        plain = cl.CommandQueue(cl_ctx)
        assert not cltrace.has_profiling(plain)
        with pytest.raises(ProfilingNotEnabledError):
            cltrace.EventTimer(plain)
        del plain


def test_event_timer_interval_is_a_device_span_under_the_open_region(tmp_path, queue, kernels):
    """While tracing, each EventTimer interval is a span (its name, default "EventTimer") nested under the region
    open at start(), with its host bracket and a device span between its markers holding the kernels it timed, in
    both file formats and in the region report; off, it records nothing."""
    from cltrace import read as tracefile

    paths = [tmp_path / "t.json", tmp_path / "t.pftrace"]
    with cltrace.trace(*paths, quiet=True):
        with cltrace.timing_region("outer", queue):
            t = cltrace.EventTimer(queue, name="fwd-timer")
            t.start()
            kernels.launch_spin(queue, 200)
            ms = t.stop()
            with cltrace.EventTimer(queue) as t2:
                kernels.launch_add(queue)
    assert ms > 0 and t2.elapsed_ms is not None
    for path in paths:
        spans = {s.name: s for s in tracefile.load(path)[0]}
        timer, outer, spin = spans["fwd-timer"], spans["outer"], spans["spin"]
        assert timer.path == ("outer", "fwd-timer") and "EventTimer" in spans, path
        assert timer.source == "device" and spans["EventTimer"].source == "device"
        assert outer.dev_start <= timer.dev_start <= spin.dev_start and spin.dev_end <= timer.dev_end <= outer.dev_end
        assert abs((timer.dev_end - timer.dev_start) / 1e6 - ms) < 0.05 * ms + 0.01  # the timer's own figure
        assert outer.host_begin <= timer.host_begin <= timer.host_end <= outer.host_end
    tree = cltrace.PerfCounter().as_dict()
    assert "outer/fwd-timer" in tree and "outer/EventTimer" in tree
    RECORDER.clear()
    t = cltrace.EventTimer(queue)
    t.start()
    kernels.launch_add(queue)
    t.stop()
    assert RECORDER.batch().n == 0
