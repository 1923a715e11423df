"""The ``cltrace`` command as a user runs it: demo, summary, devices, run, and bad input."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

import cltrace as cltrace_lib


def cltrace(*args: str, cwd: str | os.PathLike[str], env: dict[str, str] | None = None,
            timeout: int = 240) -> subprocess.CompletedProcess[str]:
    full_env = dict(os.environ, **(env or {}))
    return subprocess.run([sys.executable, "-m", "cltrace", *args], cwd=cwd, env=full_env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("demo")
    proc = cltrace("demo", "--out", str(d / "traces"), "--steps", "6", cwd=d,
                   env={"CLTRACE_CACHE_DIR": str(d / "cache")})
    assert proc.returncode == 0, proc.stderr
    return d, proc.stdout


def test_demo_writes_both_formats_and_prints_the_region_report(demo_dir):
    d, out = demo_dir
    for cycle in ("", ".cycle1", ".cycle2"):  # the whole run, then one file per active cycle
        assert (d / "traces" / f"demo{cycle}.json").stat().st_size > 0
        assert (d / "traces" / f"demo{cycle}.pftrace").stat().st_size > 0
    for name in ("step", "forward", "backward", "optimizer", "gemm", "compile"):
        assert name in out
    assert "bound ±" in out and "0 dropped" in out
    assert "6 steps: 2 warm-up (not written), 4 active; 2 cycles written" in out


def test_demo_trace_has_nested_regions_on_the_host_and_kernels_on_a_queue_track_with_flows(demo_dir):
    d, _ = demo_dir
    events = json.loads((d / "traces" / "demo.json").read_text())
    host_pid = next(e["pid"] for e in events if e.get("name") == "process_name" and "OpenCL" not in e["args"]["name"])
    x = [e for e in events if e.get("ph") == "X"]
    host = {e["args"]["span"]: e for e in x if e["pid"] == host_pid}
    device = [e for e in x if e["pid"] != host_pid]
    by_name = {}
    for e in host.values():
        by_name.setdefault(e["name"], []).append(e)
    steps = [e for e in host.values() if e["cat"] == "step"]
    assert sorted(e["name"] for e in steps) == ["step 1", "step 2", "step 4", "step 5"]  # 0 and 3: warm-up
    step_ids = {e["args"]["span"] for e in steps}
    for phase in ("forward", "backward", "optimizer"):
        assert len(by_name[phase]) == 4
        assert all(e["args"]["parent"] in step_ids for e in by_name[phase])
    kernels = [e for e in device if e["cat"] == "kernel"]
    assert {e["name"] for e in kernels} >= {"gemm", "sgd", "softmax_xent"}
    queue_tracks = {(e["pid"], e["tid"]) for e in kernels}
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    assert all("queue" in names[t] for t in queue_tracks)
    starts = {e["id"] for e in events if e.get("ph") == "s"}
    ends = {e["id"] for e in events if e.get("ph") == "f"}
    assert {e["args"]["span"] for e in kernels} <= starts & ends
    assert any(e["cat"] == "compile" for e in host.values())
    assert any(e["cat"] == "transfer" and e["args"]["bytes"] > 0 for e in host.values())


def test_summary_reads_both_formats_the_same(demo_dir):
    d, _ = demo_dir
    outs = []
    for f in ("demo.json", "demo.pftrace"):
        proc = cltrace("summary", str(d / "traces" / f), "--json", cwd=d)
        assert proc.returncode == 0, proc.stderr
        outs.append(json.loads(proc.stdout)["regions"])
    assert outs[0].keys() == outs[1].keys()
    for k in outs[0]:
        assert outs[0][k]["device"] == outs[1][k]["device"], k
    text = cltrace("summary", str(d / "traces" / "demo.pftrace"), cwd=d)
    assert text.returncode == 0 and "forward" in text.stdout


@pytest.mark.parametrize("content, reason", [
    (None, "no such file"),
    (b"", "empty"),
    (b"\x00\x01garbage\xff" * 10, "not a trace"),
    (b'{"hello": 1}', "traceEvents"),
    (b'[{"ph": "X", "name": "x", "ts": 1, "dur": ', "no complete event"),
])
@pytest.mark.parametrize("command", ["summary", "diff", "analyze"])
def test_a_bad_file_exits_nonzero_with_one_line_naming_it(tmp_path, content, reason, command):
    path = tmp_path / "bad.json"
    if content is not None:
        path.write_bytes(content)
    good = tmp_path / "good.json"
    with cltrace_lib.trace(good, quiet=True):
        with cltrace_lib.region("r"):
            pass
    args = [str(good), str(path)] if command == "diff" else [str(path)]  # the second file named, not the first
    proc = cltrace(command, *args, cwd=tmp_path)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"cltrace: error: {path}: "), proc.stderr
    assert reason in lines[0]
    assert proc.stdout == ""


def test_devices_lists_pocl_with_profiling_and_a_measured_bound(tmp_path):
    proc = cltrace("devices", "--samples", "16", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "profiling: yes" in proc.stdout
    assert "bound ±" in proc.stdout and ("monotonic" in proc.stdout or "unix-epoch" in proc.stdout)


def test_run_traces_an_unmodified_script_and_keeps_its_exit_code(tmp_path):
    script = tmp_path / "prog.py"
    script.write_text(textwrap.dedent("""
        import sys
        import numpy as np
        import pyopencl as cl
        import pyopencl.array as cla

        ctx = cl.create_some_context(interactive=False)
        q = cl.CommandQueue(ctx)
        a = cla.to_device(q, np.arange(4096, dtype=np.float32))
        b = (a * 3 + 1).get()
        assert b[2] == 7
        print("args", sys.argv[1:])
        sys.exit(5)
    """))
    out = tmp_path / "prog.json"
    proc = cltrace("run", "--out", str(out), str(script), "x", "--flag", cwd=tmp_path)
    assert proc.returncode == 5, proc.stderr
    assert "args ['x', '--flag']" in proc.stdout
    events = json.loads(out.read_text())
    x = [e for e in events if e.get("ph") == "X"]
    assert any(e["cat"] == "kernel" and e["args"]["source"] == "device" for e in x)
    assert any(e["cat"] == "transfer" and e["args"].get("bytes") == 4 * 4096 for e in x)


def test_unknown_format_is_a_usage_error(tmp_path):
    proc = cltrace("demo", "--format", "xml", cwd=tmp_path)
    assert proc.returncode == 2
    assert "unknown format" in proc.stderr
