"""``cltrace analyze`` of a merged trace: each process's queues are judged by that process's own host.

A real ``cltrace run`` of a script whose spawned child blocks in ``finish`` on a long kernel while the
parent's queue sits idle: the child's blocking is not the parent's, so the parent's queue shows it as
host-bound (the parent enqueued nothing), never as host-blocked. Both formats, both readers."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from typing import Any

import numpy as np
import pytest

import cltrace
from cltrace.analyzers.model import TraceData
from cltrace.read import load_columns

FAMILY = '''
import multiprocessing as mp

import numpy as np
import pyopencl as cl

SRC = """
__kernel void spin(__global float *a, const int iters) {
    int i = get_global_id(0);
    float x = a[i];
    for (int k = 0; k < iters; ++k) x = x * 0.999f + 0.5f;
    a[i] = x;
}
"""


def run(iters):
    ctx = cl.create_some_context(interactive=False)
    q = cl.CommandQueue(ctx)
    spin = cl.Kernel(cl.Program(ctx, SRC).build(), "spin")
    a = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, 4 * 1024)
    spin(q, (1024,), None, a, np.int32(iters))
    q.finish()
    return q, spin, a


def child():
    q, spin, a = run(10)
    for _ in range(3):                  # the child blocks in finish on long kernels
        spin(q, (1024,), None, a, np.int32(300000))
        q.finish()


if __name__ == "__main__":
    q, spin, a = run(10)                # the parent's queue, then idle while the child works
    p = mp.get_context("spawn").Process(target=child)
    p.start()
    p.join()
    assert p.exitcode == 0
    spin(q, (1024,), None, a, np.int32(10))
    q.finish()
'''


@pytest.fixture(scope="module")
def merged(tmp_path_factory: Any) -> dict[str, str]:
    d = tmp_path_factory.mktemp("family")
    (d / "family.py").write_text(textwrap.dedent(FAMILY))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CLTRACE", "OTEL_"))}
    r = subprocess.run([sys.executable, "-m", "cltrace", "run", "--out", "family.json", "--format", "json,pftrace",
                        "family.py"], cwd=str(d), env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "merged children" in r.stderr, r.stderr
    return {"json": str(d / "family.json"), "pftrace": str(d / "family.pftrace")}


def _blocking_by_pid(path: str) -> dict[int, int]:
    """Host time inside blocking calls per process, summed from the file's own spans and track pids."""
    spans, meta = load_columns(path)
    td = TraceData(spans, meta)
    pids = {int(t): info["pid"] for t, info in meta["tracks"].items() if info.get("pid")}
    out: dict[int, int] = {}
    for i in np.flatnonzero(td.blocking()).tolist():
        pid = pids[int(td.thread[i])]
        out[pid] = out.get(pid, 0) + int(td.host_end[i] - td.host_begin[i])
    return out


@pytest.mark.parametrize("fmt", ["json", "pftrace"])
def test_a_queue_is_host_blocked_only_by_its_own_process(merged: dict[str, str], fmt: str) -> None:
    path = merged[fmt]
    meta = load_columns(path)[1]
    parent, kid = (p["pid"] for p in meta["merged"]["processes"])
    blocking = _blocking_by_pid(path)
    assert blocking[kid] > 200e6, blocking  # the child sat in finish on its long kernels
    a = cltrace.analyze(path, window=None)
    queues = {q["name"].rsplit(" · pid ", 1)[1]: q for q in a.queues}
    mine, theirs = queues[str(parent)], queues[str(kid)]
    # the parent's queue: idle while the child ran, never blocked by the child's finish
    assert mine["idle"]["host_blocked_ns"] <= blocking.get(parent, 0)
    assert mine["idle"]["host_bound_ns"] > 0.9 * blocking[kid]
    assert theirs["idle"]["host_blocked_ns"] <= blocking[kid]
    for u in a.queues:
        assert u["busy_ns"] + sum(u["idle"].values()) == u["wall_ns"]
