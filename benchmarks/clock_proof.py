"""Prove the device-clock mapping on whatever device is the default (PoCL here, a GPU elsewhere).

For each run it prints: the clock domain the driver stamps in, the calibration
bound, how the offset drifts over the run, and whether every kernel's mapped
device stamps land inside the host bracket of its launch:

    QUEUED in [host_begin - bound, host_end + bound]  and  START >= host_begin - bound

Usage: python benchmarks/clock_proof.py [--seconds 20] [--launches 2000]
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import pyopencl as cl

import cltrace
from cltrace.record.recorder import RECORDER

SRC = "__kernel void axpy(__global float* y, __global const float* x, const float a)" \
      "{ const int i = get_global_id(0); y[i] = a * x[i] + y[i]; }"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=20.0, help="how long to watch for drift")
    ap.add_argument("--launches", type=int, default=2000)
    ap.add_argument("--recalibrate-s", type=float, default=2.0,
                    help="recalibration interval (the library default is 2 s)")
    args = ap.parse_args()

    q = cltrace.profiling_queue()
    dev = q.device
    print(f"device: {dev.name.strip()} | platform {dev.platform.name.strip()} | driver {dev.driver_version}")
    try:
        dev.device_and_host_timer()
        print("clGetDeviceAndHostTimer: supported")
    except Exception as exc:
        print(f"clGetDeviceAndHostTimer: not supported ({exc})")
    ctx = q.context
    knl = cl.Kernel(cl.Program(ctx, SRC).build(), "axpy")
    n = 1 << 16
    y = cl.Buffer(ctx, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR, hostbuf=np.zeros(n, np.float32))
    x = cl.Buffer(ctx, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR, hostbuf=np.ones(n, np.float32))
    clk = RECORDER.clocks.for_queue(q)
    first = clk.points[0]
    print(f"domain: device stamps are {clk.domain} time; offset device-perf_counter = {first.offset_ns} ns; "
          f"bound ±{first.bound_ns} ns ({first.method}, {first.samples} tightest samples)")

    # Drift: recalibrate repeatedly over the window, while launching work.
    RECORDER.clocks.recalibrate_s = args.recalibrate_s
    t_end = time.perf_counter() + args.seconds
    RECORDER.clear()
    with cltrace.trace():
        i = 0
        while time.perf_counter() < t_end or i < args.launches:
            cltrace.launch(knl, q, (n,), None, y, x, np.float32(0.5))
            i += 1
            if i % 500 == 0:
                q.finish()
    spans = [s for s in RECORDER.spans() if s.cat == "kernel"]
    bound = clk.bound_ns
    bad_q = bad_s = 0
    worst = 0
    for s in spans:
        lo, hi = s.host_begin - bound, s.host_end + bound
        if not (lo <= s.dev_queued <= hi):
            bad_q += 1
            worst = max(worst, lo - s.dev_queued, s.dev_queued - hi)
        if s.dev_start < lo:
            bad_s += 1
        assert s.dev_end - s.dev_start == s.raw_end - s.raw_start
    offs = [p.offset_ns for p in clk.points]
    hosts = [p.host_ns for p in clk.points]
    slope = (offs[-1] - offs[0]) / max(1, hosts[-1] - hosts[0]) * 1e9
    print(f"calibrations: {len(offs)} over {(hosts[-1] - hosts[0]) / 1e9:.1f}s; offset range "
          f"{min(offs) - offs[0]}..{max(offs) - offs[0]} ns; drift ~{slope:.1f} ns/s; "
          f"bounds {min(p.bound_ns for p in clk.points)}..{max(p.bound_ns for p in clk.points)} ns")
    print(f"kernels: {len(spans)}; QUEUED outside host bracket: {bad_q} (worst {worst} ns); "
          f"START before host begin: {bad_s}; END-START exact: yes")
    ok = bad_q == 0 and bad_s == 0
    print("RESULT:", "device spans inside host brackets" if ok else "VIOLATIONS")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
