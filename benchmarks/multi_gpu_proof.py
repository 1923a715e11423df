"""Prove tracing of several devices in one process: every device of the default device's platform
and type (every GPU with ``CLTRACE_DEVICE=gpu``), traced in two set-ups:

* ``shared``: one context holding all of them, one ``cltrace.compile`` (built for every device),
  a profiling queue per device;
* ``per-device``: a context per device, a compile per context (the second is a disk-cache hit:
  identical devices share one binary).

Each set-up runs a traced loop (a region per step on each queue, two kernels, a host->device
and a device->host copy) round-robin over the devices, ``--steps`` steps spread over
``--seconds`` (so the clocks are recalibrated several times and drift is measured), writes
``OUTDIR/<setup>.json`` and ``OUTDIR/<setup>.pftrace``, reads both files back and prints, per
device: its label and id, its clock (method, bound, drift), kernels and transfers found on
its queue tracks, and per queue track its name and overlapping commands (must be 0). It checks
that track names are distinct, that each file's metadata holds one clock per device, that every
launch reached the file, and that results are right; exit status 1 if any check fails.

Usage: python benchmarks/multi_gpu_proof.py OUTDIR [--steps 1000] [--seconds 6] [--json]
(on a multi-GPU host: CLTRACE_DEVICE=gpu python benchmarks/multi_gpu_proof.py /tmp/mgpu)
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import defaultdict
from typing import Any

import numpy as np
import pyopencl as cl

import cltrace
from cltrace.read import load
from cltrace.read.perfetto import iter_packets
from cltrace.record.recorder import RECORDER
from cltrace.timeline.spans import FILL, KERNEL, TRANSFER
from cltrace.timeline.tracks import device_info

SRC = """
__kernel void spin(__global float *a, const int iters) {
    int i = get_global_id(0);
    float x = a[i];
    for (int k = 0; k < iters; ++k) x = x * 0.999f + 0.5f;
    a[i] = x;
}
__kernel void add(__global float *a, __global const float *b) {
    int i = get_global_id(0);
    a[i] += b[i];
}
"""
COMMANDS = (KERNEL, TRANSFER, FILL)
N = 1 << 16


def devices_to_drive() -> list[Any]:
    default = cltrace.default_device()
    return default.platform.get_devices(device_type=default.type)


def traced_loop(setup: str, queues: list[Any], programs: list[Any], steps: int, seconds: float,
                outdir: str) -> dict[str, Any]:
    """Drive every queue round-robin under tracing, ``steps`` steps spread over ``seconds``."""
    host = np.ones(N, np.float32)
    bufs = []
    for q in queues:
        a = cl.Buffer(q.context, cl.mem_flags.READ_WRITE, host.nbytes)
        b = cl.Buffer(q.context, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR, hostbuf=host)
        bufs.append((a, b))
    launched: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    paths = [os.path.join(outdir, f"{setup}.json"), os.path.join(outdir, f"{setup}.pftrace")]
    t0 = time.perf_counter()
    with cltrace.trace(*paths):
        for step in range(steps):
            for q, prg, (a, b) in zip(queues, programs, bufs):
                uid = device_info(q.device).uid
                with cltrace.region("step", q):
                    cltrace.copy(q, a, host, name="h2d")
                    prg.spin[N, None, q](a, np.int32(64))
                    prg.add[N, None, q](a, b)
                    out = np.empty_like(host)
                    cltrace.copy(q, out, a, name="d2h")
                launched[uid]["kernel"] += 2
                launched[uid]["transfer"] += 2
            if (step + 1) % 50 == 0:
                for q in queues:
                    q.finish()
                time.sleep(max(0.0, t0 + seconds * (step + 1) / steps - time.perf_counter()))
        for q in queues:
            q.finish()
    # The last step's result on each device: spin(1) then + 1.
    expect = np.ones(N, np.float32)
    for _ in range(64):
        expect = expect * np.float32(0.999) + np.float32(0.5)
    expect += 1
    ok = True
    for q, (a, _) in zip(queues, bufs):
        out = np.empty_like(host)
        cl.enqueue_copy(q, out, a, is_blocking=True)
        ok &= bool(np.allclose(out, expect, rtol=1e-5))
    return {"paths": paths, "launched": {k: dict(v) for k, v in launched.items()}, "steps": steps,
            "results_ok": ok}


def track_names(path: str, host_pid: int) -> dict[int, str]:
    """Device track id -> name, as the file states it."""
    if path.endswith(".json"):
        with open(path, encoding="utf-8") as fh:
            events = json.load(fh)
        return {e["tid"]: e["args"]["name"] for e in events
                if e.get("ph") == "M" and e.get("name") == "thread_name" and e.get("pid") != host_pid}
    from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

    with open(path, "rb") as fh:
        data = fh.read()
    names = {}
    for _, raw in iter_packets(data):
        p = pb.TracePacket.FromString(raw)
        if p.HasField("track_descriptor"):
            d = p.track_descriptor  # device queues are threads of their device's process
            names[d.uuid] = d.thread.thread_name if d.HasField("thread") else d.name
    return names


def analyse(path: str, launched: dict[str, dict[str, int]]) -> dict[str, Any]:
    """Per device, from one trace file: clock, commands, and per queue track its name and overlaps."""
    spans, meta = load(path)
    names = track_names(path, meta.get("pid"))
    clocks, devices = meta.get("clocks") or {}, meta.get("devices") or {}
    by_track: dict[int, list[Any]] = defaultdict(list)
    for s in spans:
        if s.dev_start is not None and s.cat in COMMANDS:
            by_track[s.device_track].append(s)
    # A track belongs to the device whose label its name starts with (the longest label: "#1" vs "#10").
    labels = sorted(((d.get("label") or d.get("name"), uid) for uid, d in devices.items()), key=lambda t: -len(t[0]))
    out: dict[str, Any] = {"clock_entries": len(clocks), "devices": {}}
    for uid, dev in sorted(devices.items(), key=lambda kv: str(kv[1].get("index"))):
        c = clocks.get(uid, {})
        out["devices"][uid] = {"label": dev.get("label"), "hardware_id": dev.get("hardware_id"),
                               "clock": {k: c.get(k) for k in ("method", "domain", "bound_ns", "drift_ns",
                                                                 "drift_ns_per_s", "points")},
                               "kernels": 0, "transfers": 0, "tracks": {}}
    for track, cmds in by_track.items():
        name = names.get(track, f"track {track}")
        uid = next((u for label, u in labels if name.startswith(label + " · ")), None)
        if uid is None:
            out.setdefault("unassigned_tracks", []).append(name)
            continue
        cmds.sort(key=lambda s: (s.dev_start, s.dev_end))
        overlaps = sum(1 for a, b in zip(cmds, cmds[1:]) if b.dev_start < a.dev_end)
        d = out["devices"][uid]
        d["tracks"][name] = {"commands": len(cmds), "overlaps": overlaps}
        d["kernels"] += sum(1 for s in cmds if s.cat == KERNEL)
        d["transfers"] += sum(1 for s in cmds if s.cat == TRANSFER)
    problems = []
    all_names = [n for d in out["devices"].values() for n in d["tracks"]]
    if len(set(all_names)) != len(all_names):
        problems.append("track names repeat")
    used = [u for u in out["devices"] if out["devices"][u]["tracks"]]
    if len(used) != len(launched):
        problems.append(f"{len(used)} devices with tracks, {len(launched)} driven")
    for uid, want in launched.items():
        d = out["devices"].get(uid)
        if d is None:
            problems.append(f"no device entry for {uid}")
            continue
        if uid not in clocks:
            problems.append(f"no clock for {d['label']}")
        if d["kernels"] != want["kernel"] or d["transfers"] != want["transfer"]:
            problems.append(f"{d['label']}: {d['kernels']} kernels / {d['transfers']} transfers in the file, "
                            f"{want['kernel']} / {want['transfer']} launched")
        bad = {n: t["overlaps"] for n, t in d["tracks"].items() if t["overlaps"]}
        if bad:
            problems.append(f"{d['label']}: overlapping commands on {bad}")
    if out.get("unassigned_tracks"):
        problems.append(f"tracks of no device: {out['unassigned_tracks']}")
    out["problems"] = problems
    return out


def run_setup(setup: str, devs: list[Any], steps: int, seconds: float, outdir: str) -> dict[str, Any]:
    prof = cl.command_queue_properties.PROFILING_ENABLE
    t0 = time.perf_counter()
    if setup == "shared":
        ctx = cl.Context(devs)
        queues = [cl.CommandQueue(ctx, d, properties=prof) for d in devs]
        prg = cltrace.compile(SRC, context=ctx)
        programs = [prg] * len(devs)
        compiled = [{"devices": [device_info(d).label for d in prg.devices], "cache": prg.cache_hit,
                     "ms": round(prg.compile_ns / 1e6, 1)}]
    else:
        queues, programs, compiled = [], [], []
        for d in devs:
            ctx = cl.Context([d])
            queues.append(cl.CommandQueue(ctx, d, properties=prof))
            prg = cltrace.compile(SRC, context=ctx)
            programs.append(prg)
            compiled.append({"devices": [device_info(d).label], "cache": prg.cache_hit,
                             "ms": round(prg.compile_ns / 1e6, 1)})
    run = traced_loop(setup, queues, programs, steps, seconds, outdir)
    files = {os.path.basename(p): analyse(p, run["launched"]) for p in run["paths"]}
    problems = [f"{f}: {p}" for f, a in files.items() for p in a["problems"]]
    if not run["results_ok"]:
        problems.append("wrong results")
    return {"setup": setup, "compiled": compiled, "steps": run["steps"], "launched": run["launched"],
            "files": files, "problems": problems, "seconds": round(time.perf_counter() - t0, 1)}


def report(res: dict[str, Any]) -> None:
    print(f"\n== {res['setup']}: {res['steps']} steps in {res['seconds']} s; compile: "
          + "; ".join(f"{', '.join(c['devices'])} {c['cache']} {c['ms']} ms" for c in res["compiled"]))
    for fname, a in res["files"].items():
        print(f"  {fname}: {a['clock_entries']} clock entries")
        for uid, d in a["devices"].items():
            c = d["clock"]
            print(f"    {d['label']}  [{uid}]")
            print(f"      clock: {c['method']} ({c['domain']}), bound ±{c['bound_ns']} ns, drift {c['drift_ns']} ns "
                  f"({c['drift_ns_per_s']} ns/s, {c['points']} calibrations)")
            print(f"      kernels {d['kernels']}, transfers {d['transfers']}")
            for name, t in d["tracks"].items():
                print(f"      track {name!r}: {t['commands']} commands, {t['overlaps']} overlaps")
    print("  checks: " + ("all passed" if not res["problems"] else "FAILED: " + "; ".join(res["problems"])))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("outdir", help="folder for the .json/.pftrace files (created)")
    ap.add_argument("--steps", type=int, default=1000,
                    help="loop steps per set-up (each: 2 kernels, 2 copies per device)")
    ap.add_argument("--seconds", type=float, default=6.0, help="the least time the steps are spread over, per set-up")
    ap.add_argument("--json", action="store_true", help="also print the results as one JSON line")
    args = ap.parse_args()
    os.makedirs(args.outdir, exist_ok=True)
    devs = devices_to_drive()
    print(f"platform: {devs[0].platform.name.strip()}; driving {len(devs)} device(s):")
    for d in devs:
        info = device_info(d)
        print(f"  {info.index} {info.label}  id {info.uid}")
    RECORDER.clocks.recalibrate_s = 1.0  # several calibrations per set-up: drift is measured
    results = [run_setup(s, devs, args.steps, args.seconds, args.outdir) for s in ("shared", "per-device")]
    for res in results:
        report(res)
    failed = [p for r in results for p in r["problems"]]
    if len(devs) < 2:
        failed.append(f"only {len(devs)} device: nothing multi-device was proven")
    if args.json:
        print(json.dumps({"devices": [vars(device_info(d)) for d in devs], "results": results}))
    print(f"\nfiles in {os.path.abspath(args.outdir)}; " + ("PROOF OK" if not failed else f"FAILED: {failed}"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
