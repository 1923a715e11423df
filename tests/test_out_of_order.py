"""Out-of-order queues run commands concurrently: their slices go on lanes, never overlapping."""
from __future__ import annotations

import numpy as np
import pyopencl as cl

import cltrace
from cltrace.record.recorder import RECORDER


def test_out_of_order_queue_commands_get_lanes_without_overlap(tmp_path, cl_ctx, kernels, chrome):
    q = cltrace.profiling_queue(cl_ctx, out_of_order=True)
    spin = kernels.kernel("spin")
    bufs = [cl.Buffer(cl_ctx, cl.mem_flags.READ_WRITE, 4 * kernels.n) for _ in range(8)]
    path = tmp_path / "ooo.json"
    with cltrace.trace(path):
        for step in range(3):
            with cltrace.region("step", q):
                for i, buf in enumerate(bufs):  # independent commands the device may overlap
                    cltrace.launch(spin, q, (kernels.n,), None, buf, np.int32(50 + 40 * i))
    q.finish()
    trace = chrome.read(path)
    assert trace.misnested() == []
    assert trace.children_outside_parents() == []
    names = trace.track_names()
    kernel_tracks = {(e["pid"], e["tid"]) for e in trace.slices if e["cat"] == "kernel" and e["pid"] != trace.host_pid}
    region_tracks = {(e["pid"], e["tid"]) for e in trace.slices if e["cat"] == "region" and e["pid"] != trace.host_pid}
    assert all("lane" in names[t] for t in kernel_tracks)
    assert [names[t] for t in region_tracks] == [names[next(iter(region_tracks))]] and "regions" in names[next(iter(region_tracks))]
    spans = [s for s in RECORDER.spans() if s.cat == "kernel"]
    assert len(spans) == 24 and all(s.source == "device" for s in spans)
    # As many lanes as commands ever ran at once (PoCL runs several; a driver that serialises needs one).
    edges = sorted([(s.dev_start, 1) for s in spans] + [(s.dev_end, -1) for s in spans])
    depth = most = 0
    for _, d in edges:
        depth += d
        most = max(most, depth)
    assert len(kernel_tracks) >= most
    assert all(s.dev_end - s.dev_start == s.raw_end - s.raw_start for s in spans)


def test_lanes_are_reused_when_commands_do_not_overlap(cl_ctx, kernels):
    q = cltrace.profiling_queue(cl_ctx, out_of_order=True)
    with cltrace.trace():
        for _ in range(5):
            ev = kernels.launch_add(q)
            ev.wait()  # one at a time: nothing overlaps, so one lane suffices
    tracks = {s.device_track for s in RECORDER.spans() if s.cat == "kernel"}  # not ev.wait()'s host-only spans
    assert len(tracks) == 1
