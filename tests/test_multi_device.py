"""Several devices in one process, on PoCL's two identical devices (``POCL_DEVICES="pthread pthread"``).

PoCL reads ``POCL_DEVICES`` when pyopencl first lists platforms, so every multi-device case runs in
a subprocess with it set; the test process keeps its single device. Cases: one context holding
both devices and a context per device; compile + launch on both queues (a segfault before
programs were built for every device); traces of a loop on both (via benchmarks/multi_gpu_proof.py);
program cache entries, tune store and transfers per device; ``cltrace devices``.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pyopencl as cl
import pytest

import cltrace
from cltrace.programs.compiler import common_options
from cltrace.timeline.device_id import (CL_DEVICE_PCI_BUS_INFO_KHR, decode_pci_bus_info, decode_uuid,
                                        hardware_id, raw_device_info)
from cltrace.timeline.tracks import device_info
from conftest import POCL_PLATFORM, pocl_platform  # noqa: E402  (tests/ is on sys.path under pytest)

ROOT = Path(__file__).resolve().parents[1]
# PoCL names its CPU device after the host's CPU ("pthread-AMD EPYC" on the reference machine).
POCL_PLAT = pocl_platform()
POCL = POCL_PLAT.get_devices()[0].name.strip()

SOURCE = """
__kernel void add(__global float *a) { a[get_global_id(0)] += 1.0f; }
__kernel void lsize(__global int *out) { out[get_global_id(0)] = (int)get_local_size(0); }
"""

# Shared by the subprocess scripts: PoCL's two devices, queues, and a JSON line for the test to read.
PRELUDE = """
import json, os, sys
import numpy as np
import pyopencl as cl
import cltrace
from cltrace.timeline.tracks import device_info
from cltrace.record.probe import verdict
PLAT = %s
D0, D1 = PLAT.get_devices()
PROF = cl.command_queue_properties.PROFILING_ENABLE
SOURCE = %r
def done(**kw):
    print("RESULT " + json.dumps(kw, default=str), flush=True)
""" % (POCL_PLATFORM, SOURCE)


def run_two(tmp_path: Path, script: str, *args: str, timeout: int = 240) -> dict[str, Any]:
    """Run a script with PoCL's two devices and a private program/tune cache; its RESULT line."""
    env = {k: v for k, v in os.environ.items() if k not in ("CLTRACE", "CLTRACE_OUT", "PYOPENCL_CTX")}
    env.update(POCL_DEVICES="pthread pthread", CLTRACE_CACHE_DIR=str(tmp_path / "cache"))
    proc = subprocess.run([sys.executable, "-c", PRELUDE + textwrap.dedent(script), *args], capture_output=True,
                          text=True, timeout=timeout, cwd=tmp_path, env=env)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


def test_compile_for_a_context_of_two_devices_launches_on_both(tmp_path: Path) -> None:
    """One context holding both devices: compile builds for both, both launch forms run on both queues
    (before, the launch on the second device's queue crashed the process)."""
    res = run_two(tmp_path, """
        ctx = cl.Context([D0, D1])
        qs = [cl.CommandQueue(ctx, d, properties=PROF) for d in (D0, D1)]
        cltrace.start()
        prg = cltrace.compile(SOURCE, context=ctx)
        a = cl.Buffer(ctx, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR, hostbuf=np.zeros(64, np.float32))
        for q in qs:
            prg.add[64, None, q](a); q.finish()
            prg.add(q, (64,), None, a); q.finish()
        cltrace.stop()
        untraced = cltrace.compile(SOURCE, context=ctx)
        for q in qs:
            untraced.add(q, (64,), None, a); q.finish()
        out = np.empty(64, np.float32)
        cl.enqueue_copy(qs[1], out, a, is_blocking=True)
        spans = [s for s in cltrace.RECORDER.spans() if s.cat in ("compile", "build")]
        done(value=float(out[0]), devices=[device_info(d).label for d in prg.devices], cache=untraced.cache_hit,
             spans=[(s.name, s.attrs) for s in spans],
             kernels=sorted({(s.name, s.device_track) for s in cltrace.RECORDER.spans() if s.cat == "kernel"}))
    """)
    assert res["value"] == 6.0
    assert res["devices"] == [f"{POCL} #0", f"{POCL} #1"]
    assert res["cache"] == "memory"
    spans = {name: [a for n, a in res["spans"] if n == name] for name, _ in res["spans"]}
    (build,) = spans["clBuildProgram"]  # identical devices: one source build, on the first
    assert build["device"] == f"{POCL} #0" and build["devices"] == res["devices"]
    (load,) = spans["load binary"]  # one program for both devices
    assert load["devices"] == res["devices"]
    (top,) = [a for n, a in res["spans"] if n.startswith("compile ")]
    assert top["devices"] == res["devices"] and top["cache"] == "miss"
    assert len({track for _, track in res["kernels"]}) == 2, "kernels on two device tracks"


def test_a_program_built_for_one_device_refuses_the_other_device_queue(tmp_path: Path) -> None:
    """devices=/device= build for those alone; a launch on another device's queue is a one-line error,
    in both launch forms, traced or not, before and after a first launch (PoCL crashes on it)."""
    res = run_two(tmp_path, """
        ctx = cl.Context([D0, D1])
        q0, q1 = (cl.CommandQueue(ctx, d, properties=PROF) for d in (D0, D1))
        prg = cltrace.compile(SOURCE, context=ctx, devices=[D1])
        a = cl.Buffer(ctx, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR, hostbuf=np.zeros(64, np.float32))
        errors = []
        for traced in (False, True, False):
            if traced: cltrace.start()
            for launch in (lambda: prg.add[64, None, q0](a), lambda: prg.add(q0, (64,), None, a)):
                try:
                    launch()
                except ValueError as exc:
                    errors.append(str(exc))
            prg.add(q1, (64,), None, a); q1.finish()
            cltrace.stop()
        default_q = prg.add[64, None](a); default_q.wait()
        out = np.empty(64, np.float32)
        cl.enqueue_copy(q1, out, a, is_blocking=True)
        try:
            cltrace.compile(SOURCE, devices=[D0, D1])
        except TypeError as exc:
            errors.append(str(exc))
        done(errors=errors, value=float(out[0]), devices=[device_info(d).label for d in prg.devices],
             default_device=device_info(default_q.command_queue.device).label)
    """)
    assert res["devices"] == [f"{POCL} #1"] and res["default_device"] == f"{POCL} #1"
    assert res["value"] == 4.0
    refusals, (no_context,) = res["errors"][:-1], res["errors"][-1:]
    assert len(refusals) == 6
    assert all(e.startswith(f"kernel 'add' was compiled for {POCL} #1, not for this queue's device "
                            f"{POCL} #0") for e in refusals)
    assert "needs the context=" in no_context


def test_cache_entries_per_device_and_a_shared_tune_store(tmp_path: Path) -> None:
    """A context per device: the second compile loads the first's binary from disk (identical devices
    share binaries and tuned winners); memory entries stay per context and device set."""
    res = run_two(tmp_path, """
        from cltrace.programs import tunedb
        from cltrace.programs.compiler import ProgramCache, device_key
        ctx0, ctx1 = cl.Context([D0]), cl.Context([D1])
        both = cl.Context([D0, D1])
        cache = ProgramCache()
        first = cltrace.compile(SOURCE, context=ctx0, cache=cache)
        second = cltrace.compile(SOURCE, context=ctx1, cache=cache)
        again = cltrace.compile(SOURCE, context=ctx1, cache=cache)
        shared = cltrace.compile(SOURCE, context=both, cache=cache)
        shared_again = cltrace.compile(SOURCE, context=both, cache=cache)
        files = list(__import__("pathlib").Path(cache.directory).rglob("*.clbin"))
        keys = [device_key(D0), device_key(D1)]
        uids = [device_info(D0).uid, device_info(D1).uid]
        tunedb.store(tunedb.source_hash(SOURCE), (), keys[0], {"defines": {"W": 1}, "local_size": [8]})
        tuned1 = cltrace.compile(SOURCE, context=ctx1, cache=cache)
        q1 = cl.CommandQueue(ctx1, D1, properties=PROF)
        out = cl.Buffer(ctx1, cl.mem_flags.READ_WRITE, 4 * 64)
        tuned1.lsize(q1, (64,), None, out)
        got = np.empty(64, np.int32)
        cl.enqueue_copy(q1, got, out, is_blocking=True)
        tuned_both = cltrace.compile(SOURCE, context=both, cache=cache)
        done(hits=[p.cache_hit for p in (first, second, again, shared, shared_again)], keys=keys, uids=uids,
             memory=len(cache._mem), files=len(files), tuned=[tuned1.tuned, tuned_both.tuned],
             options=[tuned1.options, tuned_both.options], local_size=int(got[0]))
    """)
    assert res["hits"] == ["miss", "disk", "memory", "disk", "memory"]
    assert res["keys"][0] == res["keys"][1], "the model key (binaries, tuned winners) is shared"
    assert res["uids"][0] != res["uids"][1], "the device uid (tracks, clocks) is not"
    assert res["files"] == 1, "identical devices share one binary on disk"
    assert res["memory"] == 5  # ctx0, ctx1, both devices of the shared context; tuned: ctx1, the shared context
    want = {"defines": {"W": 1}, "local_size": [8]}
    assert res["tuned"] == [want, want] and res["options"] == [["-DW=1"], ["-DW=1"]]
    assert res["local_size"] == 8, "the winner stored for device 0 sets device 1's local size"


def test_transfers_go_on_the_track_of_their_queue_device(tmp_path: Path) -> None:
    """cltrace.copy and instrumented pyopencl copies on device 1's queue land on device 1's track,
    and their OTLP attributes name that device."""
    res = run_two(tmp_path, """
        ctx = cl.Context([D0, D1])
        q0, q1 = (cl.CommandQueue(ctx, d, properties=PROF) for d in (D0, D1))
        host = np.arange(1024, dtype=np.float32)
        buf = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, host.nbytes)
        cltrace.start()
        cltrace.copy(q0, buf, host, name="to0").wait()
        out = np.empty_like(host)
        cltrace.copy(q1, out, buf, name="from1").wait()  # written through device 0, read on device 1
        cltrace.instrument()
        cl.enqueue_copy(q1, buf, host).wait()
        cltrace.uninstrument()
        cltrace.stop()
        tracks = {t.id: t for t in cltrace.RECORDER.tracks.tracks()}
        spans = [s for s in cltrace.RECORDER.spans() if s.cat == "transfer"]
        from cltrace.export.otlp.mapping import Mapper
        otlp = [Mapper(cltrace.RECORDER, 1, 1).convert(s)[5] for s in spans]
        res = Mapper(cltrace.RECORDER, 1, 1).root(0, 0, cltrace.RECORDER.metadata(), {"dropped": 0, "failed": 0})[5]
        done(ok=bool((out == host).all()), uids=[device_info(D0).uid, device_info(D1).uid],
             placed=[(s.name, tracks[s.device_track].device, tracks[s.device_track].name) for s in spans],
             otlp=[(a["cltrace.device.id"], a["cltrace.queue"]) for a in otlp],
             resource={k: res[k] for k in ("cltrace.opencl.device.ids", "cltrace.opencl.device.labels")})
    """)
    assert res["ok"]
    uid0, uid1 = res["uids"]
    placed = {n: (d, track) for n, d, track in res["placed"]}
    assert len(placed) == 3, res["placed"]
    instrumented = next(n for n in placed if n not in ("to0", "from1"))
    assert placed["to0"][0] == uid0 and placed["to0"][1].startswith(f"{POCL} #0 · queue ")
    for name in ("from1", instrumented):
        assert placed[name][0] == uid1 and placed[name][1].startswith(f"{POCL} #1 · queue "), placed
    # OTLP: each device span names its physical device; the run's root span lists both.
    assert res["otlp"] == [[d, track] for _, d, track in res["placed"]]
    assert sorted(res["resource"]["cltrace.opencl.device.ids"]) == sorted(res["uids"])
    assert sorted(res["resource"]["cltrace.opencl.device.labels"]) == [f"{POCL} #0", f"{POCL} #1"]


def test_traced_loop_on_both_devices_in_both_setups(tmp_path: Path) -> None:
    """benchmarks/multi_gpu_proof.py on PoCL's two devices: distinct track names, 0 overlaps on every
    queue track, one clock per device in the .json and .pftrace metadata, every launch in the files."""
    env = {k: v for k, v in os.environ.items() if k not in ("CLTRACE", "CLTRACE_OUT", "PYOPENCL_CTX")}
    env.update(POCL_DEVICES="pthread pthread", CLTRACE_CACHE_DIR=str(tmp_path / "cache"))
    out = tmp_path / "proof"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "multi_gpu_proof.py"), str(out),
                           "--steps", "40", "--seconds", "0.2", "--json"],
                          capture_output=True, text=True, timeout=240, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-3000:]
    assert "PROOF OK" in proc.stdout
    doc = json.loads(next(ln for ln in proc.stdout.splitlines() if ln.startswith("{")))
    uids = [d["uid"] for d in doc["devices"]]
    assert len(set(uids)) == 2
    assert [r["setup"] for r in doc["results"]] == ["shared", "per-device"]
    for r in doc["results"]:
        assert set(r["files"]) == {f"{r['setup']}.json", f"{r['setup']}.pftrace"}
        for f in r["files"].values():
            assert f["clock_entries"] == 2 and set(f["devices"]) == set(uids)
            names = [n for d in f["devices"].values() for n in d["tracks"]]
            assert len(names) == 2 and len(set(names)) == 2
            assert {n.split(" · ")[0] for n in names} == {f"{POCL} #0", f"{POCL} #1"}
            for d in f["devices"].values():
                assert d["kernels"] == 80 and d["transfers"] == 80
                assert all(t["overlaps"] == 0 for t in d["tracks"].values())
                assert d["clock"]["bound_ns"] > 0
    assert [c["cache"] for c in doc["results"][1]["compiled"]] == ["disk", "disk"]
    for suffix in (".json", ".pftrace"):
        summary = subprocess.run([sys.executable, "-m", "cltrace", "summary", str(out / f"shared{suffix}")],
                                 capture_output=True, text=True, timeout=120, env=env)
        assert summary.returncode == 0, summary.stderr
        clock_lines = [ln for ln in summary.stdout.splitlines() if ln.startswith("clock ")]
        assert sorted(ln.split(":")[0] for ln in clock_lines) == [f"clock {POCL} #0",
                                                                  f"clock {POCL} #1"]


def test_devices_command_names_each_device(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("CLTRACE", "PYOPENCL_CTX")}
    env.update(POCL_DEVICES="pthread pthread")
    text = subprocess.run([sys.executable, "-m", "cltrace", "devices", "--samples", "4"],
                          capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert text.returncode == 0, text.stderr
    pi = cl.get_platforms().index(POCL_PLAT)
    assert f"{pi}:0 {POCL} #0 [" in text.stdout and f" {pi}:1 {POCL} #1 [" in text.stdout
    proc = subprocess.run([sys.executable, "-m", "cltrace", "devices", "--samples", "4", "--json"],
                          capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    rows = [r for r in json.loads(proc.stdout) if r["index"].startswith(f"{pi}:")]  # JSON only on stdout
    assert len({r["id"] for r in rows}) == 2 and all(r["id"].endswith("|" + r["index"]) for r in rows)


def test_a_lone_device_keeps_its_plain_name(queue: Any) -> None:
    """The test process has one PoCL device: its label is its name, its uid carries the index."""
    info = device_info(queue.device)
    assert info.label == queue.device.name.strip()
    plat = queue.device.platform  # not platform 0 where an earlier platform's compiler fails
    index = f"{cl.get_platforms().index(plat)}:{plat.get_devices().index(queue.device)}"
    assert info.uid == f"{info.key}|{info.index}" and info.index == index
    assert device_info(queue.device) is info, "computed once per device"
    assert info.hardware_id == hardware_id(queue.device) == ""


def test_raw_device_queries_and_hardware_id_decoding(queue: Any) -> None:
    dev = queue.device
    raw = raw_device_info(dev, 0x1001, 4)  # CL_DEVICE_VENDOR_ID through the same path as the KHR queries
    assert raw is not None and int.from_bytes(raw, sys.byteorder) == dev.vendor_id
    assert raw_device_info(dev, CL_DEVICE_PCI_BUS_INFO_KHR, 16) is None  # PoCL's CPU device has no PCI address
    assert decode_pci_bus_info((0).to_bytes(4, sys.byteorder) + (0x1B).to_bytes(4, sys.byteorder)
                               + (0).to_bytes(8, sys.byteorder)) == "0000:1b:00.0"
    assert decode_uuid(bytes(range(16))) == "00010203-0405-0607-0809-0a0b0c0d0e0f"


def test_different_tuned_configurations_of_device_models_give_none(caplog: Any) -> None:
    same = {"a": (("-DX=1",), {"defines": {"X": 1}}), "b": (("-DX=1",), {"defines": {"X": 1}})}
    assert common_options(same, ()) == (("-DX=1",), {"defines": {"X": 1}})
    differ = {"a": (("-DX=1",), {"defines": {"X": 1}}), "b": ((), None)}
    with caplog.at_level("WARNING", logger="cltrace"):
        assert common_options(differ, ("-O",)) == (("-O",), None)
    assert "different tuned configurations" in caplog.text


def test_compile_rejects_conflicting_device_arguments(cl_ctx: Any) -> None:
    dev = cl_ctx.devices[0]
    with pytest.raises(TypeError, match="device= or devices="):
        cltrace.compile(SOURCE, context=cl_ctx, device=dev, devices=[dev])
    with pytest.raises(ValueError, match="devices= is empty"):
        cltrace.compile(SOURCE, context=cl_ctx, devices=[])
    prg = cltrace.compile(SOURCE, context=cl_ctx, devices=[dev, dev])
    assert prg.devices == (dev,) and prg.device == dev
    other = [d for p in cl.get_platforms() for d in p.get_devices() if d != dev]
    if other:
        with pytest.raises(ValueError, match="not in the given context"):
            cltrace.compile(SOURCE, context=cl_ctx, devices=[other[0]])
