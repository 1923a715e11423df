"""Child processes: ``cltrace run`` follows Python children (multiprocessing fork, spawn and
forkserver; subprocess running Python), each writes its own files, and the run ends with one
merged trace, one process per pid on one timeline; ``cltrace merge`` does the same for any files.
Real PoCL, real child processes, real readers (the JSON events themselves, Perfetto's protos)."""
from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
import textwrap
from collections import Counter
from typing import Any

import pytest

from cltrace.capture.children import child_path
from cltrace.merge import merge
from cltrace.read import load

from otlp_collector import RotelCollector

DEVICE_PID_BASE = 1_000_000

FAMILY = '''
import multiprocessing as mp
import os
import subprocess
import sys

import pyopencl as cl

SRC = "__kernel void k(__global float *a) { a[get_global_id(0)] += 1.0f; }"


def work(n):
    ctx = cl.create_some_context(interactive=False)
    q = cl.CommandQueue(ctx)
    knl = cl.Kernel(cl.Program(ctx, SRC).build(), "k")
    a = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, 4096)
    for _ in range(n):
        knl(q, (1024,), None, a)
    q.finish()
    os.write(1, f"LAUNCHED {os.getpid()} {n}\\n".encode())  # one write: atomic on a pipe, lines never interleave


if __name__ == "__main__":
    kids = [(m, n) for m, n in [("fork", 2), ("fork", 3), ("spawn", 4), ("spawn", 5), ("forkserver", 6)]
            if m in mp.get_all_start_methods()]
    procs = [mp.get_context(m).Process(target=work, args=(n,)) for m, n in kids]
    for p in procs:  # the forks come before this process touches OpenCL (PoCL does not survive a fork)
        p.start()
    for p in procs:
        p.join()
        assert p.exitcode == 0
    subprocess.run([sys.executable, "-c", "import __main__, sys; sys.path.insert(0, sys.argv[1]);"
                    "from family import work; work(7)", os.path.dirname(os.path.abspath(__file__))], check=True)
    work(1)
'''


def _write(tmp_path: Any, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return str(path)


def _cltrace(*args: str, cwd: Any, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CLTRACE", "OTEL_"))}
    return subprocess.run([sys.executable, "-m", "cltrace", *args], cwd=str(cwd), env=env,
                          capture_output=True, text=True, timeout=timeout)


def _json_events(path: str) -> list[dict[str, Any]]:
    return [json.loads(line.rstrip().rstrip(",")) for line in open(path, encoding="utf-8") if line.startswith("{")]


def _pftrace_pids(path: str) -> dict[int, int]:
    """Track uuid -> pid of every thread track, from the file's own TrackDescriptors."""
    from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

    from cltrace.read.perfetto import iter_packets

    pids = {}
    for _, raw in iter_packets(open(path, "rb").read()):
        p = pb.TracePacket.FromString(raw)
        if p.HasField("track_descriptor") and p.track_descriptor.HasField("thread"):
            pids[p.track_descriptor.uuid] = p.track_descriptor.thread.pid
    return pids


def test_run_follows_fork_spawn_forkserver_and_subprocess_children_into_one_trace(tmp_path: Any) -> None:
    _write(tmp_path, "family.py", FAMILY)
    p = _cltrace("run", "--out", "traces/family.json", "--format", "json,pftrace", "family.py", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    launched = {int(pid): int(n) for _, pid, n in (line.split() for line in p.stdout.splitlines()
                                                    if line.startswith("LAUNCHED"))}
    forkserver = [6] if "forkserver" in multiprocessing.get_all_start_methods() else []
    assert sorted(launched.values()) == sorted([1, 2, 3, 4, 5, 7] + forkserver), p.stdout
    parent = [pid for pid, n in launched.items() if n == 1][0]
    kids = sorted(set(launched) - {parent})
    wrote = [line for line in p.stderr.splitlines() if line.startswith("cltrace: wrote")]
    assert wrote == ["cltrace: wrote traces/family.json, traces/family.pftrace"], p.stderr
    merged_line = [line for line in p.stderr.splitlines() if line.startswith("cltrace: merged children")]
    assert len(merged_line) == 1 and f"{len(launched)} processes on one timeline" in merged_line[0], p.stderr
    assert "traces/family.pid<PID>.json" in merged_line[0]

    merged = str(tmp_path / "traces" / "family.json")
    events = _json_events(merged)
    kernels = Counter(e["pid"] for e in events if e.get("ph") == "X" and e.get("name") == "k"
                      and e["pid"] < DEVICE_PID_BASE)
    assert dict(kernels) == launched  # each process's host launches under its own pid
    device_tracks = {e["args"]["name"] for e in events if e.get("ph") == "M" and e["name"] == "thread_name"
                     and e["pid"] > DEVICE_PID_BASE}
    assert all(any(t.endswith(f"· pid {pid}") for t in device_tracks) for pid in launched), device_tracks
    starts = Counter(e["id"] for e in events if e.get("ph") == "s")
    ends = Counter(e["id"] for e in events if e.get("ph") == "f")
    assert starts == ends and set(starts.values()) == {1}  # flow ids never collide between processes
    assert len(starts) == sum(launched.values())
    names = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e["name"] == "process_name"}
    assert set(launched) <= set(names) and any("[SpawnProcess" in names[k] for k in kids), names

    spans, meta = load(merged)
    assert "truncated" not in meta
    assert {p_["pid"]: p_["method"] for p_ in meta["merged"]["processes"]} == {k: "same host clock" for k in launched}
    by_id = {s.id: s for s in spans}
    assert len(by_id) == len(spans)
    for s in spans:  # parents stay inside their process
        if s.parent:
            assert meta["tracks"][str(by_id[s.parent].thread)]["process"] == meta["tracks"][str(s.thread)]["process"]

    pf = str(tmp_path / "traces" / "family.pftrace")
    pids = _pftrace_pids(pf)
    pspans, pmeta = load(pf)
    assert "truncated" not in pmeta
    assert dict(Counter(pids[s.thread] for s in pspans if s.name == "k")) == launched

    for kid in kids:  # each child's own files stay, complete
        for out in ("family.json", "family.pftrace"):
            own, own_meta = load(child_path(str(tmp_path / "traces" / out), kid))
            assert "truncated" not in own_meta and own_meta["pid"] == kid
            assert sum(s.name == "k" for s in own) == launched[kid]
            assert own_meta["process"]["root"] == parent


HOST_ONLY = '''
import multiprocessing as mp
import os
import signal
import sys
import time

import cltrace


def regions(n):
    for i in range(n):
        with cltrace.region(f"r{i}"):
            pass


def stays(ready):
    regions(3)
    cltrace.RECORDER.flush()
    ready.set()
    time.sleep(60)  # ended by SIGTERM (Process.terminate)


if __name__ == "__main__":
    ready = mp.get_context("fork").Event()
    p = mp.get_context("fork").Process(target=stays, args=(ready,))
    p.start()
    ready.wait(30)
    p.terminate()
    p.join()
    assert p.exitcode == -signal.SIGTERM
    print("TERMINATED", p.pid, flush=True)
    pid = os.fork()
    if pid == 0:  # a plain fork that ends the script normally: atexit closes its file
        regions(4)
        print("FORKED", os.getpid(), flush=True)
        sys.exit(0)
    os.waitpid(pid, 0)
    regions(2)
'''


def test_children_close_their_files_on_sigterm_and_on_a_normal_exit(tmp_path: Any) -> None:
    _write(tmp_path, "host_only.py", HOST_ONLY)
    p = _cltrace("run", "--out", "t.json", "host_only.py", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    got = dict(line.split()[:2] for line in p.stdout.splitlines() if line.startswith(("TERMINATED", "FORKED")))
    terminated, forked = int(got["TERMINATED"]), int(got["FORKED"])
    for kid, n in ((terminated, 3), (forked, 4)):
        spans, meta = load(str(tmp_path / f"t.pid{kid}.json"))
        assert "truncated" not in meta and len(spans) == n
    spans, meta = load(str(tmp_path / "t.json"))
    assert sorted(p_["spans"] for p_ in meta["merged"]["processes"]) == [2, 3, 4]
    assert p.stderr.count("cltrace: merged") == 1  # the forked script's end merges nothing


FORK_BUFFERED = '''
import os
import sys
import time

import cltrace

cltrace.RECORDER.configure(flush_interval_s=600)
with cltrace.trace("t.json", quiet=True):
    time.sleep(0.5)  # past the first flush: the next is 600 s away
    for i in range(50):
        with cltrace.region(f"parent {i}"):
            pass
    while cltrace.RECORDER.recorded < 50:  # resolved and written into the sink's buffer, not yet on disk
        time.sleep(0.01)
    pid = os.fork()
    if pid == 0:
        with cltrace.region("child"):
            pass
        sys.exit(0)  # normal exit: the child's interpreter flushes whatever buffers it holds
    os.waitpid(pid, 0)
print(pid)
'''


def test_a_forked_child_never_writes_the_parents_file(tmp_path: Any) -> None:
    script = _write(tmp_path, "fork_buffered.py", FORK_BUFFERED)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CLTRACE", "OTEL_"))}
    p = subprocess.run([sys.executable, script], cwd=str(tmp_path), env=env, capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0, p.stderr
    spans, meta = load(str(tmp_path / "t.json"))
    assert "truncated" not in meta
    assert sorted(s.name for s in spans) == sorted(f"parent {i}" for i in range(50))  # no child span
    slices = [e["name"] for e in _json_events(str(tmp_path / "t.json")) if e.get("ph") == "X"]
    assert len(slices) == 50  # and no second copy of the parent's buffered events
    child, _ = load(str(tmp_path / f"t.pid{int(p.stdout)}.json"))
    assert [s.name for s in child] == ["child"]


def _trace(path: str, queue: Any, kernels: Any, n: int) -> None:
    import cltrace

    with cltrace.trace(path, quiet=True):
        with cltrace.region("step", queue):
            for _ in range(n):
                kernels.launch_add(queue)


def _restamp(src: str, dst: str, **changes: Any) -> None:
    """A copy of a Chrome trace whose metadata says it comes from another machine."""
    with open(src, encoding="utf-8") as fh, open(dst, "w", encoding="utf-8") as out:
        for line in fh:
            if '"cltrace.metadata"' in line:
                comma = line.rstrip().endswith(",")
                ev = json.loads(line.rstrip().rstrip(","))
                ev["args"].update(changes)
                line = json.dumps(ev) + ("," if comma else "") + "\n"
            out.write(line)


@pytest.mark.parametrize("out", ["all.pftrace", "all.json"])
def test_merge_command_puts_two_files_on_one_timeline(tmp_path: Any, queue: Any, kernels: Any, out: str) -> None:
    a, b = str(tmp_path / "a.json"), str(tmp_path / "b.pftrace")
    _trace(a, queue, kernels, 3)
    _trace(b, queue, kernels, 5)
    p = _cltrace("merge", a, b, "-o", out, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines()[0] == f"cltrace: wrote {out}: 2 processes, 10 spans on one timeline"
    assert p.stdout.count("same host clock; exact") == 2
    spans, meta = load(str(tmp_path / out))
    sa, ma = load(a)
    sb, mb = load(b)
    procs = meta["merged"]["processes"]
    assert [x["spans"] for x in procs] == [4, 6]
    assert procs[1]["pid"] != procs[0]["pid"] and procs[1]["recorded_pid"] == procs[0]["pid"]  # one pid, kept apart
    base = meta["start_ns"] if out.endswith(".json") else 0
    got = sorted((s.name, s.host_begin + base, s.dev_end is not None and s.dev_end - s.dev_start) for s in spans)
    want = sorted([(s.name, s.host_begin + ma["start_ns"], s.dev_end is not None and s.dev_end - s.dev_start)
                   for s in sa] + [(s.name, s.host_begin, s.dev_end is not None and s.dev_end - s.dev_start)
                                   for s in sb])
    assert got == want  # times exactly as recorded: one host clock
    by_id = {s.id: s for s in spans}
    steps = {s.id for s in spans if s.name == "step"}
    assert len(steps) == 2 and all(by_id[s.parent].name == "step" for s in spans if s.name == "add")
    assert len({by_id[s.parent].id for s in spans if s.name == "add"}) == 2  # each file's launches under its step


def test_merge_aligns_another_machine_by_unix_time_and_says_how_sure(tmp_path: Any, queue: Any,
                                                                  kernels: Any) -> None:
    a, b = str(tmp_path / "a.json"), str(tmp_path / "b.json")
    _trace(a, queue, kernels, 2)
    _trace(b, queue, kernels, 2)
    _, mb = load(b)
    other = str(tmp_path / "b_other_host.json")
    # Another machine: its own boot, and a host clock 5 s behind while Unix time is the same.
    _restamp(b, other, host={"name": "gpu-node-7", "boot_id": "another-boot"},
             start_ns=mb["start_ns"] - 5_000_000_000, process={"name": "remote run"})
    p = _cltrace("merge", a, other, "-o", "all.json", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    line = [x for x in p.stdout.splitlines() if "gpu-node-7" in x or "b_other_host" in x][0]
    assert "unix time, moved +5000.000 ms" in line and "wall clocks of gpu-node-7" in line
    spans, meta = load(str(tmp_path / "all.json"))
    procs = meta["merged"]["processes"]
    assert procs[1]["method"] == "unix time" and procs[1]["uncertainty_ns"] is None
    assert procs[1]["shift_ns"] == 5_000_000_000 and "NTP" in procs[1]["uncertainty"]
    sb, _ = load(b)
    moved = sorted(s.host_begin + meta["start_ns"] for s in spans if s.thread in
                   {int(t) for t, v in meta["tracks"].items() if v["process"] == "remote run"})
    assert moved == sorted(s.host_begin + mb["start_ns"] for s in sb)  # back where Unix time puts them
    assert any("@ gpu-node-7" in v["process"] for v in meta["tracks"].values())  # its device is its own


@pytest.mark.parametrize("out", ["all.pftrace", "all.json"])
def test_merge_of_a_file_older_than_the_first_hosts_boot_moves_the_timeline_up(tmp_path: Any, queue: Any,
                                                                               kernels: Any, out: str) -> None:
    """A file from another machine that began (in Unix time) before the first file's host booted lands before its
    clock's zero: the whole timeline moves up by one amount (a .pftrace has no time before 0), each file exactly
    where it was against the others, and the merged trace reads back."""
    a, b = str(tmp_path / "a.json"), str(tmp_path / "b.json")
    _trace(a, queue, kernels, 2)
    _trace(b, queue, kernels, 2)
    sa, ma = load(a)
    sb, mb = load(b)
    early = ma["start_unix_ns"] - ma["start_ns"] - 10_000_000_000  # 10 s before a's host booted
    other = str(tmp_path / "old_other_host.json")
    _restamp(b, other, host={"name": "old-node", "boot_id": "another-boot"}, start_unix_ns=early,
             process={"name": "remote run"})
    p = _cltrace("merge", a, other, "-o", out, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    procs_lines = [x for x in p.stdout.splitlines() if x.startswith("  pid")]
    assert "same host clock, moved +11000.000 ms; exact" in procs_lines[0]  # 10 s back, and 1 s of room
    spans, meta = load(str(tmp_path / out))
    base = meta["start_ns"] if out.endswith(".json") else 0
    remote = {int(t) for t, v in meta["tracks"].items() if v["process"] == "remote run"}
    got_a = sorted(s.host_begin + base for s in spans if s.thread not in remote)
    got_b = sorted(s.host_begin + base for s in spans if s.thread in remote)
    assert min(got_a + got_b) > 0
    want_a = sorted(s.host_begin + ma["start_ns"] for s in sa)
    want_b = sorted(s.host_begin + mb["start_ns"] for s in sb)
    lift = got_a[0] - want_a[0]
    assert [g - lift for g in got_a] == want_a  # the first file: one shift, exact
    # the other: placed by Unix time (before a's host booted), then moved up by the same amount
    offset_b = early - mb["start_ns"]  # Unix time - host clock of the restamped file
    offset_a = ma["start_unix_ns"] - ma["start_ns"]
    assert [g - lift for g in got_b] == [w + offset_b - offset_a for w in want_b]
    assert meta["start_unix_ns"] - meta["start_ns"] == offset_a - lift  # Unix time of the merged clock still right


@pytest.mark.parametrize("args, message", [
    (["missing.json", "-o", "all.json"], "missing.json: cannot read it"),
    (["not_a_trace.json", "-o", "all.json"], "error: not_a_trace.json: "),  # the reader says why
    (["a.json", "-o", "all.txt"], "the merged trace is a .json or .pftrace file"),
    (["a.json"], "required: -o/--out"),
    (["merged.json", "-o", "again.json"], "merged.json: is already a merged trace"),
])
def test_merge_bad_input_exits_2_with_one_line(tmp_path: Any, queue: Any, kernels: Any, args: list[str],
                                               message: str) -> None:
    _trace(str(tmp_path / "a.json"), queue, kernels, 1)
    (tmp_path / "not_a_trace.json").write_text("{}")
    merge([str(tmp_path / "a.json")], str(tmp_path / "merged.json"))
    p = _cltrace("merge", *args, cwd=tmp_path)
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.count("\n") == 1 and p.stderr.startswith("cltrace: error: ") and message in p.stderr, p.stderr


OTLP_FAMILY = '''
import multiprocessing as mp

import cltrace


def child(name):
    with cltrace.region(name):
        pass


if __name__ == "__main__":
    for method in ("fork", "spawn"):
        p = mp.get_context(method).Process(target=child, args=(f"in {method} child",))
        p.start()
        p.join()
    child("in parent")
'''


def test_children_continue_the_parents_otlp_trace(tmp_path: Any) -> None:
    _write(tmp_path, "otlp_family.py", OTLP_FAMILY)
    with RotelCollector() as col:
        p = _cltrace("run", "--out", "t.json", "--otlp", col.grpc_endpoint, "otlp_family.py", cwd=tmp_path)
        assert p.returncode == 0, p.stderr
        spans = col.wait_for(lambda got: len(got) >= 6)
    assert len({s["trace_id"] for s in spans}) == 1  # one trace for the whole family
    roots = [s for s in spans if s["name"] == "cltrace.run"]
    top = [s for s in roots if not s.get("parent_id")]
    assert len(roots) == 3 and len(top) == 1
    kids = {s["span_id"] for s in roots if s.get("parent_id") == top[0]["span_id"]}
    assert len(kids) == 2  # each child's root hangs under the parent's
    parent_of = {s["name"]: s.get("parent_id") for s in spans}
    assert parent_of["in fork child"] in kids and parent_of["in spawn child"] in kids
    assert parent_of["in parent"] == top[0]["span_id"]


SUBPROCESSES = '''
import subprocess
import sys

for first in ("cltrace", "pyopencl"):  # either import starts tracing, once cltrace is complete
    code = f"import {first}, cltrace\\nwith cltrace.region('child importing {first}'):\\n    pass"
    subprocess.run([sys.executable, "-c", code], check=True)
subprocess.run([sys.executable, "-c", "print('a child without OpenCL')"], check=True)
'''


def test_subprocess_children_are_followed_and_an_existing_sitecustomize_still_runs(tmp_path: Any) -> None:
    _write(tmp_path, "subprocesses.py", SUBPROCESSES)
    mine = tmp_path / "site"
    mine.mkdir()
    (mine / "sitecustomize.py").write_text("print('the user sitecustomize ran')\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CLTRACE", "OTEL_"))}
    env["PYTHONPATH"] = str(mine)
    p = subprocess.run([sys.executable, "-m", "cltrace", "run", "--out", "t.json", "subprocesses.py"],
                       cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.count("the user sitecustomize ran") == 1 + 3  # cltrace run itself, and each child
    assert "a child without OpenCL" in p.stdout
    assert len(list(tmp_path.glob("t.pid*.json"))) == 2  # the child that traced nothing left no file
    spans, meta = load(str(tmp_path / "t.json"))
    assert sorted(s.name for s in spans) == ["child importing cltrace", "child importing pyopencl"]
    assert len(meta["merged"]["processes"]) == 3
