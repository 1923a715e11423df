"""``cltrace run`` exits as ``python`` does for programs with process pools: multiprocessing
pools with fork, spawn and forkserver, closed, terminated or left open; ProcessPoolExecutor; a
data loader that owns a pool and never closes it; subprocess running Python; and a child that never
finishes its trace, which costs the parent a bounded wait and one line, never a hang.

Each script runs twice, under ``python`` and under ``cltrace run``, with a timeout: same exit
status, same output (pids aside), a wall time within ``MARGIN_S`` of python's, and the workers'
kernel launches in the merged trace, under their own pids, read back with cltrace's reader.
Real pools, real PoCL kernels in the workers, no mocks."""
from __future__ import annotations

import json
import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter
from typing import Any

import pytest

from cltrace.cli.run import CHILD_WAIT_S
from cltrace.read import load

MARGIN_S = 3.0  # cltrace run's wall time may exceed python's by this much
TIMEOUT_S = 120  # a hang fails the test instead of holding the suite

# Imported by every worker: launches the kernel ``k`` n times on its own context, returns (pid, n).
LAUNCH = '''
import os

import pyopencl as cl

SRC = "__kernel void k(__global float *a) { a[get_global_id(0)] += 1.0f; }"
_cl = {}


def launch(n):
    if not _cl:
        ctx = cl.create_some_context(interactive=False)
        _cl.update(q=cl.CommandQueue(ctx), k=cl.Kernel(cl.Program(ctx, SRC).build(), "k"),
                   a=cl.Buffer(ctx, cl.mem_flags.READ_WRITE, 4096))
    for _ in range(n):
        _cl["k"](_cl["q"], (1024,), None, _cl["a"])
    _cl["q"].finish()
    return os.getpid(), n


def report(results):
    """What the parent prints: the launches each worker pid made (checked against the trace)."""
    launches = {}
    for pid, n in results:
        launches[pid] = launches.get(pid, 0) + n
    print("LAUNCHES", sorted(launches.items()), flush=True)
'''

ISSUE_SCRIPT = '''
import multiprocessing as mp
def sq(x): return x * x
pool = mp.Pool(2)
print(sum(pool.map(sq, range(100))))
'''

POOL = '''
import multiprocessing as mp
import sys

from launch import launch, report

if __name__ == "__main__":
    method, end = sys.argv[1], sys.argv[2]
    if method == "spawn":  # the issue's spawn variant: the parent has an OpenCL context first
        import pyopencl as cl
        ctx = cl.create_some_context(interactive=False)
    if end == "with":
        with mp.get_context(method).Pool(2) as pool:
            report(pool.map(launch, [2] * 6, chunksize=1))
    else:
        pool = mp.get_context(method).Pool(2)
        report(pool.map(launch, [2] * 6, chunksize=1))
        if end == "close":
            pool.close()
            pool.join()
        elif end == "terminate":
            pool.terminate()
    print("END", end)
'''

EXECUTOR = '''
import concurrent.futures as cf
import sys

from launch import launch, report

if __name__ == "__main__":
    if sys.argv[1] == "with":
        with cf.ProcessPoolExecutor(2) as ex:
            report(ex.map(launch, [2] * 6))
    else:  # left open: Python's exit shuts it down
        ex = cf.ProcessPoolExecutor(2)
        report(ex.map(launch, [2] * 6))
    print("END")
'''

LOADER = '''
import multiprocessing as mp

from launch import launch, report


def batch(i):
    pid, n = launch(1)
    return pid, n, [float(i)] * 16


class Loader:
    """netcl-style: owns a pool, prefetches batches with apply_async and imap; never closed."""

    def __init__(self, n, workers=2, prefetch=3):
        self.pool = mp.Pool(workers)
        self.n, self.prefetch = n, prefetch

    def __iter__(self):
        ahead = [self.pool.apply_async(batch, (i,)) for i in range(min(self.prefetch, self.n))]
        nxt = len(ahead)
        while ahead:
            got = ahead.pop(0).get()
            if nxt < self.n:
                ahead.append(self.pool.apply_async(batch, (nxt,)))
                nxt += 1
            yield got

    def stream(self):
        return self.pool.imap(batch, range(self.n))


if __name__ == "__main__":
    loader = Loader(8)
    got = list(loader) + list(loader.stream())
    report([(pid, n) for pid, n, _ in got])
    print("SUM", sum(b[0] for _, _, b in got))
'''

SUBPROCESS = '''
import os
import subprocess
import sys

here = os.path.dirname(os.path.abspath(__file__))
out = subprocess.run([sys.executable, "-c", "import sys; sys.path.insert(0, sys.argv[1]); from launch import launch;"
                      "print(*launch(3))", here], check=True, capture_output=True, text=True).stdout
pid, n = map(int, out.split())
print("LAUNCHES", [(pid, n)])
'''

# A child that is still writing its trace when the program ends: it has written its first spans
# (the file exists) and sleeps; python does not wait for it, nor may cltrace run for longer than
# CHILD_WAIT_S.
STUCK = '''
import subprocess
import sys

CHILD = """
import os, sys, time
import cltrace
with cltrace.region("stuck child"):
    pass
cltrace.RECORDER.flush()
print("READY", os.getpid(), flush=True)
time.sleep(60)
"""
p = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True)
print(p.stdout.readline().strip(), flush=True)
'''


# SIGTERM caught by another thread while the main thread sleeps in a lock (as a pool worker is when
# its pool terminates it): python's default action ends the process at once; cltrace's handler must
# still run (the main thread is woken), close the trace and end it the same way.
ASLEEP = '''
import multiprocessing as mp
import signal
import threading
import time

import cltrace

with cltrace.region("before"):
    pass
lock = mp.get_context("fork").Lock()
lock.acquire()


def poke():
    time.sleep(0.5)
    signal.pthread_kill(threading.get_ident(), signal.SIGTERM)  # to this thread, not the main one


threading.Thread(target=poke, daemon=True).start()
print("ASLEEP", flush=True)
lock.acquire()  # for ever: only the signal ends the process
'''


def _run(cmd: list[str], cwd: Any) -> tuple[subprocess.CompletedProcess, float]:
    """Run ``cmd`` in its own process group with a timeout, timed to its exit (output through files:
    a child left running may hold a pipe); a hang kills the group and fails the test."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CLTRACE", "OTEL_"))}
    out, err = cwd / "stdout.txt", cwd / "stderr.txt"
    with open(out, "w") as o, open(err, "w") as e:
        t0 = time.monotonic()
        proc = subprocess.Popen(cmd, cwd=str(cwd), env=env, stdout=o, stderr=e, text=True, start_new_session=True)
        try:
            rc = proc.wait(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            pytest.fail(f"{' '.join(cmd)} did not exit in {TIMEOUT_S} s\n{out.read_text()}\n{err.read_text()}")
        took = time.monotonic() - t0
    return subprocess.CompletedProcess(cmd, rc, out.read_text(), err.read_text()), took


def _both(tmp_path: Any, script: str, text: str, *args: str) -> tuple[subprocess.CompletedProcess, Any, float]:
    """The script under python, then under cltrace run: checks that cltrace run exits as python did,
    as fast give or take MARGIN_S, with the same output; returns cltrace's run, its wall time and the
    limit python's gives."""
    (tmp_path / "launch.py").write_text(textwrap.dedent(LAUNCH))
    (tmp_path / script).write_text(textwrap.dedent(text))
    py, py_s = _run([sys.executable, script, *args], tmp_path)
    ct, ct_s = _run([sys.executable, "-m", "cltrace", "run", "--out", "traces/run.json", script, *args], tmp_path)
    assert ct.returncode == py.returncode == 0, (py.stderr, ct.stderr)
    assert _no_pids(ct.stdout) == _no_pids(py.stdout)
    assert "Traceback" not in ct.stderr, ct.stderr
    assert "cltrace: wrote traces/run.json" in ct.stderr.splitlines(), ct.stderr
    return ct, ct_s, py_s + MARGIN_S


def _no_pids(out: str) -> list[str]:
    """The lines a script printed, less what differs from run to run: pids, and which worker ran what."""
    return [f"LAUNCHES {sum(_launches(line).values())}" if line.startswith("LAUNCHES") else
            line.split()[0] if line.startswith("READY") else line for line in out.splitlines()]


def _launches(stdout: str) -> dict[int, int]:
    line = next(line for line in stdout.splitlines() if line.startswith("LAUNCHES"))
    return dict(json.loads(line.split(" ", 1)[1].replace("(", "[").replace(")", "]")))


def _kernels_by_pid(path: str) -> dict[int, int]:
    """The host spans of kernel ``k`` in a merged trace, by the pid of the process that launched them."""
    spans, meta = load(path)
    assert "truncated" not in meta
    pid_of = {p["name"]: p["pid"] for p in meta["merged"]["processes"]}
    assert len(pid_of) == len(meta["merged"]["processes"])  # one name per process
    tracks = meta["tracks"]
    return dict(Counter(pid_of[tracks[str(s.thread)]["process"]] for s in spans if s.name == "k"))


def _check_merged(tmp_path: Any, ct: subprocess.CompletedProcess) -> None:
    """Every worker's launches, under its own pid, in the merged trace; the merge line names them."""
    launches = _launches(ct.stdout)
    assert _kernels_by_pid(str(tmp_path / "traces" / "run.json")) == launches
    merged = [line for line in ct.stderr.splitlines() if line.startswith("cltrace: merged children")]
    assert len(merged) == 1 and all(str(pid) in merged[0] for pid in launches), ct.stderr
    assert "still writing" not in ct.stderr, ct.stderr


@pytest.mark.timing
def test_the_issue_script_a_fork_pool_left_open_exits_as_under_python(tmp_path: Any) -> None:
    ct, took, limit = _both(tmp_path, "pool.py", ISSUE_SCRIPT)
    assert ct.stdout == "328350\n"
    assert took < limit, (took, limit)


METHODS = [m for m in ("fork", "spawn", "forkserver") if m in multiprocessing.get_all_start_methods()]


@pytest.mark.timing
@pytest.mark.parametrize("end", ["open", "close", "terminate", "with"])
@pytest.mark.parametrize("method", METHODS)
def test_pools_of_kernel_launching_workers_exit_and_merge(tmp_path: Any, method: str, end: str) -> None:
    ct, took, limit = _both(tmp_path, "pool.py", POOL, method, end)
    assert took < limit, (took, limit)
    _check_merged(tmp_path, ct)


@pytest.mark.timing
@pytest.mark.parametrize("end", ["open", "with"])
def test_process_pool_executor_exits_and_merges(tmp_path: Any, end: str) -> None:
    ct, took, limit = _both(tmp_path, "executor.py", EXECUTOR, end)
    assert took < limit, (took, limit)
    _check_merged(tmp_path, ct)


@pytest.mark.timing
def test_a_data_loader_that_never_closes_its_pool_exits_and_merges(tmp_path: Any) -> None:
    ct, took, limit = _both(tmp_path, "loader.py", LOADER)
    assert took < limit, (took, limit)
    assert "SUM 56.0" in ct.stdout.splitlines()
    _check_merged(tmp_path, ct)


@pytest.mark.timing
def test_a_python_subprocess_exits_and_merges(tmp_path: Any) -> None:
    ct, took, limit = _both(tmp_path, "sub.py", SUBPROCESS)
    assert took < limit, (took, limit)
    _check_merged(tmp_path, ct)


@pytest.mark.timing
def test_a_child_still_writing_costs_a_bounded_wait_and_one_line(tmp_path: Any) -> None:
    (tmp_path / "stuck.py").write_text(textwrap.dedent(STUCK))
    kids = []
    try:
        py, py_s = _run([sys.executable, "stuck.py"], tmp_path)
        kids.append(int(py.stdout.split()[1]))
        ct, ct_s = _run([sys.executable, "-m", "cltrace", "run", "--out", "traces/run.json", "stuck.py"], tmp_path)
        kid = int(ct.stdout.split()[1])
        kids.append(kid)
        assert ct.returncode == py.returncode == 0, (py.stderr, ct.stderr)
        assert _no_pids(ct.stdout) == _no_pids(py.stdout)
        assert ct_s < py_s + CHILD_WAIT_S + MARGIN_S, (ct_s, py_s)  # the child sleeps 60 s
        assert os.path.exists(tmp_path / "traces" / f"run.pid{kid}.json")  # it had begun its trace
        missing = [line for line in ct.stderr.splitlines() if "still writing" in line]
        assert missing == [f"cltrace: children {kid} still writing their traces {CHILD_WAIT_S:g} s after the program "
                           f"ended: left out of traces/run.json (their own files, traces/run.pid<PID>.json, can be "
                           f"merged later with cltrace merge)"], ct.stderr
        assert "Traceback" not in ct.stderr and "cltrace: wrote traces/run.json" in ct.stderr.splitlines()
        spans, meta = load(str(tmp_path / "traces" / "run.json"))  # the parent's own trace, whole
        assert "truncated" not in meta and "merged" not in meta
    finally:
        for pid in kids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_a_sigterm_another_thread_catches_still_ends_the_program_with_its_trace(tmp_path: Any) -> None:
    (tmp_path / "asleep.py").write_text(textwrap.dedent(ASLEEP))
    py, py_s = _run([sys.executable, "asleep.py"], tmp_path)
    ct, ct_s = _run([sys.executable, "-m", "cltrace", "run", "--out", "traces/run.json", "asleep.py"], tmp_path)
    assert ct.returncode == py.returncode == -signal.SIGTERM, (py.stderr, ct.stderr)
    assert ct.stdout == py.stdout == "ASLEEP\n"
    assert ct_s < py_s + MARGIN_S, (ct_s, py_s)
    assert "cltrace: wrote traces/run.json" in ct.stderr.splitlines() and "Traceback" not in ct.stderr, ct.stderr
    spans, meta = load(str(tmp_path / "traces" / "run.json"))
    assert "truncated" not in meta and [s.name for s in spans] == ["before"]
