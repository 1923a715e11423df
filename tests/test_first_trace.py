"""The first trace of a process: nothing in the writers imports numpy.ma (numpy >= 2.3 does on the first
plain ``np.unique``: ~15 ms and enough new objects for a full cyclic collection, inside the trace)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np

SCRIPT = r"""
import json, os, sys
import numpy as np
import pyopencl as cl
import cltrace
q = cltrace.profiling_queue()
k = cl.Kernel(cl.Program(q.context, "__kernel void k(__global float *x) { x[get_global_id(0)] += 1.0f; }").build(), "k")
buf = cl.Buffer(q.context, cl.mem_flags.READ_WRITE, 4 * 1024)
host = np.zeros(1024, np.float32)
cltrace.launch(k, q, (1024,), None, buf)
q.finish()
before = set(sys.modules)
with cltrace.trace(os.path.join(sys.argv[1], "t.json"), os.path.join(sys.argv[1], "t.pftrace"), quiet=True):
    for i in range(300):
        with cltrace.region("step", q if i % 2 else None):
            cltrace.launch(k, q, (1024,), None, buf)
            cltrace.copy(q, host, buf)
print(json.dumps(sorted(set(sys.modules) - before)))
"""


def test_a_first_trace_imports_no_numpy_ma(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "CLTRACE"}
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path)], capture_output=True, text=True, env=env,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    imported = json.loads(out.stdout.strip().splitlines()[-1])
    assert "numpy.ma" not in imported, imported
    assert "cltrace.export.perfetto.sink" in imported  # the check sees imports made during the trace


def test_distinct_is_np_unique_without_the_import():
    from cltrace.timeline.arrays import sorted_distinct as distinct

    rng = np.random.default_rng(0)
    for a in (np.zeros(0, np.int64), np.array([5]), rng.integers(-3, 4, 1000), rng.integers(0, 1 << 60, 50)):
        got = distinct(a)
        assert got.dtype == a.dtype and np.array_equal(got, np.unique(a))
