"""One rank of a small data-parallel job, for the store's tests: ``python rank_program.py OUT[,OUT...] STEPS WORK
[OTLP]``. Each step runs a forward kernel WORK times over a buffer (the straggler gets a larger WORK),
reads the result back and waits for the queue, inside a ``step`` region; the rank and run id come
from the environment (``RANK``, ``CLTRACE_RUN_ID``) as a launcher sets them. With OTLP (a gRPC
endpoint) the spans also go there."""
from __future__ import annotations

import sys

import numpy as np
import pyopencl as cl

import cltrace

out, steps, work = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
outputs: list = out.split(",")
if len(sys.argv) > 4:
    from cltrace.export.otlp import OtlpSink

    outputs.append(OtlpSink(sys.argv[4], protocol="grpc", close_timeout_s=20))
cltrace.instrument()
queue = cltrace.profiling_queue()
ctx = queue.context
prg = cl.Program(ctx, """
__kernel void forward(__global float* x, const float a) {
    float v = x[get_global_id(0)];
    for (int i = 0; i < 64; i++) v = v * a + 0.5f;
    x[get_global_id(0)] = v;
}""").build()
forward = prg.forward
n = 1 << 16
host = np.ones(n, np.float32)
x = cl.Buffer(ctx, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR, hostbuf=host)
forward(queue, (n,), None, x, np.float32(0.999))  # the driver compiles the kernel at its first launch:
queue.finish()  # before tracing, so that every traced step is a steady-state one
with cltrace.trace(*outputs, quiet=True):
    for step in range(steps):
        with cltrace.region("step", queue):
            for _ in range(work):
                forward(queue, (n,), None, x, np.float32(0.999))
            cl.enqueue_copy(queue, host, x, is_blocking=False)
            queue.finish()
