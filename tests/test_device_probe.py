"""Choosing a device that compiles: the probe is a real build, its verdict is cached on disk and read
as hostile input, a device whose compiler fails is passed by with one line, and where none compiles
(or the chosen one does not) the command line says so in one line and exits 2, touching no trace.

Failures here are real compiler failures (a source the compiler rejects), never mocks; where a test
needs the standard probe to have failed, it stores the verdict of such a real failed build."""
from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import pyopencl as cl
import pytest

import cltrace
from cltrace.errors import DeviceError
from cltrace.record import probe, queues
from cltrace.timeline.tracks import device_info

ROOT = Path(__file__).resolve().parents[1]
BROKEN = "__kernel void cltrace_broken(__global float* x) { x[0] = undeclared; }\n"  # rejected by any compiler


@pytest.fixture()
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A private cltrace cache, and no verdict remembered in this process."""
    d = tmp_path / "cache"
    monkeypatch.setenv("CLTRACE_CACHE_DIR", str(d))
    probe._memo.clear()
    queues._skipped.clear()
    yield d
    probe._memo.clear()
    queues._skipped.clear()


def unprobed_default() -> Any:
    """The default device, its verdict forgotten again (in memory and on disk)."""
    dev = cltrace.default_device()
    probe._memo.clear()
    shutil.rmtree(os.path.dirname(probe.verdict_path(dev)), ignore_errors=True)
    return dev


def all_devices() -> list[Any]:
    return [d for p in cl.get_platforms() for d in p.get_devices()]


def store_failed_standard_probe(device: Any) -> str:
    """Keep, as ``device``'s verdict on the standard probe, the verdict of a real failed build on it."""
    failed = probe.build_probe(device, BROKEN)
    assert not failed.compiles and failed.reason
    path = probe.verdict_path(device)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as fh:
        json.dump({"device_key": device_info(device).key, "probe": probe._probe_id(probe.PROBE_SOURCE, ()),
                   "compiles": False, "reason": failed.reason}, fh)
    return failed.reason


def cli(cwd: Path, cache: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    e = {k: v for k, v in os.environ.items() if k not in ("CLTRACE", "CLTRACE_OUT", "CLTRACE_DEVICE", "PYOPENCL_CTX")}
    e.update(CLTRACE_CACHE_DIR=str(cache), **env)
    return subprocess.run([sys.executable, "-m", "cltrace", *args], cwd=cwd, env=e, capture_output=True, text=True,
                          timeout=300)


def committed_traces(tmp_path: Path) -> dict[str, bytes]:
    """A ``traces/`` folder holding the repository's committed demo traces; their bytes."""
    (tmp_path / "traces").mkdir()
    for name in ("demo.json", "demo.pftrace"):
        shutil.copy(ROOT / "traces" / name, tmp_path / "traces" / name)
    return {p.name: p.read_bytes() for p in (tmp_path / "traces").iterdir()}


def test_the_probe_is_a_real_build(cache: Path) -> None:
    dev = cltrace.default_device()
    assert probe.build_probe(dev).compiles
    bad = probe.build_probe(dev, BROKEN)
    assert not bad.compiles and "undeclared" in bad.reason and "\n" not in bad.reason
    opt = probe.build_probe(dev, options=("-no-such-option",))
    assert not opt.compiles and opt.reason


def test_a_device_whose_probe_fails_is_skipped_with_one_line(cache: Path, capfd: Any) -> None:
    dev = cltrace.default_device()
    sources = iter([BROKEN, probe.PROBE_SOURCE])  # the first candidate's build fails for real
    chosen = queues.choose([dev, dev], lambda d: probe.verdict(d, next(sources)))
    assert chosen is dev
    err = capfd.readouterr().err.splitlines()
    assert len(err) == 1, err
    label = device_info(dev).label
    assert err[0].startswith(f"cltrace: skipping {label}: its OpenCL compiler fails (") and "undeclared" in err[0]


def test_no_device_that_compiles_is_one_error_naming_device_reason_and_fix(cache: Path) -> None:
    devices = all_devices()
    with pytest.raises(DeviceError) as info:
        queues.choose(devices, lambda d: probe.verdict(d, BROKEN))
    msg = str(info.value)
    assert "\n" not in msg and isinstance(info.value, cltrace.CltraceError)
    assert device_info(devices[0]).label in msg and "undeclared" in msg and "apt-get install pocl-opencl-icd" in msg


def test_the_verdict_is_kept_on_disk_and_reused_without_a_build(cache: Path) -> None:
    dev = unprobed_default()
    first = probe.verdict(dev)
    assert first.compiles and not first.cached
    path = Path(probe.verdict_path(dev))
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700 and stat.S_IMODE(cache.stat().st_mode) == 0o700
    doc = json.loads(path.read_text())
    assert doc["compiles"] is True
    # A well-formed verdict no build of this (valid) source could give: seen only if the file is used.
    path.write_text(json.dumps({**doc, "compiles": False, "reason": "kept from an earlier probe"}))
    probe._memo.clear()
    again = probe.verdict(dev)
    assert again.cached and not again.compiles and again.reason == "kept from an earlier probe"


@pytest.mark.parametrize("content", [
    b"\x00\xffnot json",
    b"[true]",
    b'{"compiles": true}',
    "compiles as text",
    "reason as a number",
    "another device",
])
def test_a_corrupt_or_wrongly_typed_verdict_is_ignored_and_probed_again(cache: Path, content: Any) -> None:
    dev = unprobed_default()
    path = Path(probe.verdict_path(dev))
    good = {"device_key": device_info(dev).key, "probe": probe._probe_id(probe.PROBE_SOURCE, ()),
            "compiles": False, "reason": "x"}
    bad = {"compiles as text": {**good, "compiles": "no"}, "reason as a number": {**good, "reason": 7},
           "another device": {**good, "device_key": "Some Platform|Some Device|1.0"}}
    path.parent.mkdir(parents=True)
    path.write_bytes(content if isinstance(content, bytes) else json.dumps(bad[content]).encode())
    got = probe.verdict(dev)
    assert got.compiles and not got.cached  # probed again: the device does compile
    assert json.loads(path.read_text())["compiles"] is True  # and the file rewritten


def test_devices_json_carries_each_verdict(tmp_path: Path, cache: Path) -> None:
    dev = cltrace.default_device()
    reason = store_failed_standard_probe(dev)
    p = cli(tmp_path, cache, "devices", "--json", "--samples", "4")
    assert p.returncode == 0, p.stderr
    rows = json.loads(p.stdout)
    assert all(isinstance(r["compiles"], bool) for r in rows)
    failing = [r for r in rows if r["id"] == device_info(dev).uid]
    assert failing and failing[0]["compiles"] is False and failing[0]["compile_error"] == reason
    assert not failing[0]["default"]
    assert all(r["compile_error"] is None for r in rows if r["compiles"])
    text = cli(tmp_path, cache, "devices", "--samples", "4")
    assert f"compiles: NO: {reason}" in text.stdout


def test_no_device_compiles_demo_is_one_line_exit_2_and_no_trace_touched(tmp_path: Path, cache: Path) -> None:
    before = committed_traces(tmp_path)
    for d in all_devices():
        store_failed_standard_probe(d)
    p = cli(tmp_path, cache, "demo", "--steps", "2")
    assert p.returncode == 2, p.stdout + p.stderr
    lines = p.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("cltrace: error: no OpenCL device here can compile: "), p.stderr
    assert "pocl-opencl-icd" in lines[0]
    assert {q.name: q.read_bytes() for q in (tmp_path / "traces").iterdir()} == before


@pytest.mark.parametrize("variable", ["CLTRACE_DEVICE", "PYOPENCL_CTX"])
def test_a_chosen_device_that_cannot_compile_is_refused_not_replaced(tmp_path: Path, cache: Path,
                                                                     variable: str) -> None:
    dev = cltrace.default_device()
    reason = store_failed_standard_probe(dev)
    plat = dev.platform
    index = f"{cl.get_platforms().index(plat)}:{plat.get_devices().index(dev)}"
    before = committed_traces(tmp_path)
    p = cli(tmp_path, cache, "demo", "--steps", "2", **{variable: index})
    assert p.returncode == 2, p.stdout + p.stderr
    lines = p.stderr.splitlines()
    assert len(lines) == 1 and lines[0] == (
        f"cltrace: error: {variable}={index!r} chose {device_info(dev).label}, whose OpenCL compiler fails "
        f"({reason}); choose another device (`cltrace devices` shows which compile) or {probe.FIX}"), p.stderr
    assert {q.name: q.read_bytes() for q in (tmp_path / "traces").iterdir()} == before


@pytest.mark.parametrize("spec", ["no-such-device", "9:9", "accelerator-x"])
def test_a_device_setting_that_names_no_device_is_one_warning_and_the_default_device(
        cache: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, spec: str) -> None:
    """In the library a CLTRACE_DEVICE naming no device is a bad setting like any other (the command line,
    which checks it before any work, exits 2: ``test_cli_mistakes_are_one_error_line_and_exit_2``)."""
    default = cltrace.default_device()
    monkeypatch.setenv("CLTRACE_DEVICE", spec)
    queues._bad_specs.clear()
    with caplog.at_level("WARNING", logger="cltrace"):
        queue = cltrace.profiling_queue()
        assert cltrace.default_device().int_ptr == queue.device.int_ptr == default.int_ptr
    warned = [r.getMessage() for r in caplog.records if r.name == "cltrace"]
    assert len(warned) == 1 and warned[0].startswith(f"cltrace: CLTRACE_DEVICE={spec!r}")
    assert "using the default device" in warned[0] and "cltrace devices" in warned[0]


def test_a_device_setting_naming_a_device_that_cannot_compile_still_raises(
        cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    dev = cltrace.default_device()
    store_failed_standard_probe(dev)
    probe._memo.clear()  # this process read the verdict before: as a new process, it reads the stored one
    plat = dev.platform
    monkeypatch.setenv("CLTRACE_DEVICE", f"{cl.get_platforms().index(plat)}:{plat.get_devices().index(dev)}")
    with pytest.raises(DeviceError, match="whose OpenCL compiler fails"):
        cltrace.profiling_queue()


@pytest.mark.parametrize("vendors", ["empty folder", "no such folder"])
def test_no_system_opencl_demo_works_or_says_one_line(tmp_path: Path, cache: Path, vendors: str) -> None:
    """OCL_ICD_VENDORS at an empty folder hides the system's runtimes (pyopencl's own PoCL may remain); at a
    folder that does not exist, pyopencl's loader finds no platform at all."""
    before = committed_traces(tmp_path)
    folder = tmp_path / "no-vendors"
    if vendors == "empty folder":
        folder.mkdir()
    for command in (("demo", "--steps", "2"), ("devices",)):
        p = cli(tmp_path, cache, *command, OCL_ICD_VENDORS=str(folder))
        assert "Traceback" not in p.stderr
        if p.returncode == 0:
            assert vendors == "empty folder" and ("wrote" in p.stdout or command == ("devices",))
            continue
        assert p.returncode == 2 and len(p.stderr.splitlines()) == 1, p.stderr
        assert p.stderr.startswith("cltrace: error: no OpenCL ") and "pocl-opencl-icd" in p.stderr
        assert {q.name: q.read_bytes() for q in (tmp_path / "traces").iterdir()} == before


@pytest.mark.parametrize("spec", ["cpu", "pthread"])
def test_a_device_class_or_name_part_takes_the_first_matching_device_that_compiles(tmp_path: Path, cache: Path,
                                                                                   spec: str) -> None:
    matching = [d for d in all_devices() if d.type & cl.device_type.CPU and "pthread" in d.name]
    for d in matching:
        store_failed_standard_probe(d)
    p = cli(tmp_path, cache, "demo", "--steps", "2", CLTRACE_DEVICE=spec)
    assert p.returncode == 2, p.stdout + p.stderr
    lines = p.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"cltrace: error: CLTRACE_DEVICE={spec!r} chose "), p.stderr
    assert (f"as do the {len(matching) - 1} other device(s) it matches" in lines[0]) == (len(matching) > 1)
    probe._memo.clear()
    os.unlink(probe.verdict_path(matching[0]))  # the first matching device compiles again: it is chosen
    p = cli(tmp_path, cache, "devices", "--json", "--samples", "2", CLTRACE_DEVICE=spec)
    rows = json.loads(p.stdout)
    assert [r["default"] for r in rows if r["compiles"]] == [True]
