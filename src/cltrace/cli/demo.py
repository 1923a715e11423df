"""The demo: a tiny MLP trained with OpenCL kernels, traced under a schedule.

Each training step (``cltrace.steps``) is a root ``step N`` span with ``forward``,
``backward`` and ``optimizer`` regions inside; kernels land on the device-queue track,
joined to their host launches by flows. The default schedule makes two cycles of the run,
each one warm-up step (first-launch JIT and cache fills, not written) and then active steps:
``demo.<fmt>`` holds the set-up and every active step, ``demo.cycleN.<fmt>`` one cycle each.
Sized to finish in seconds on a 2-core CPU.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyopencl as cl

from ..export.base import FOLDER_MODE
from ..record import regions
from ..record.files import make_dirs
from ..record.allocations import Buffer
from ..capture import session, stepper
from ..capture.schedule import Schedule
from ..programs.compiler import compile as compile_program
from ..record.queues import default_device, profiling_queue
from ..record.recorder import RECORDER
from ..analyzers.report import PerfCounter

SOURCE = r"""
// C[i,j] = sum_k A(i,k) B(k,j); A(i,k) = A[i*sa0 + k*sa1] (strides express transposes)
__kernel void gemm(const int M, const int N, const int K,
                   __global const float* A, const int sa0, const int sa1,
                   __global const float* B, const int sb0, const int sb1,
                   __global float* C) {
    const int i = get_global_id(0), j = get_global_id(1);
    if (i >= M || j >= N) return;
    float acc = 0.0f;
    for (int k = 0; k < K; ++k) acc += A[i*sa0 + k*sa1] * B[k*sb0 + j*sb1];
    C[i*N + j] = acc;
}

__kernel void bias_act(__global float* Z, __global const float* b, const int cols, const int relu) {
    const int g = get_global_id(0);
    float v = Z[g] + b[g % cols];
    Z[g] = relu ? fmax(v, 0.0f) : v;
}

// Row-wise softmax cross-entropy: loss per row and dZ = (softmax - onehot) / rows.
__kernel void softmax_xent(__global const float* Z, __global const int* y, const int rows,
                           const int cols, __global float* dZ, __global float* loss) {
    const int i = get_global_id(0);
    if (i >= rows) return;
    __global const float* z = Z + i*cols;
    float m = z[0];
    for (int j = 1; j < cols; ++j) m = fmax(m, z[j]);
    float s = 0.0f;
    for (int j = 0; j < cols; ++j) s += exp(z[j] - m);
    const int t = y[i];
    loss[i] = -(z[t] - m - log(s));
    for (int j = 0; j < cols; ++j)
        dZ[i*cols + j] = (exp(z[j] - m) / s - (j == t ? 1.0f : 0.0f)) / (float)rows;
}

__kernel void relu_backward(__global float* dH, __global const float* H) {
    const int g = get_global_id(0);
    if (H[g] <= 0.0f) dH[g] = 0.0f;
}

__kernel void colsum(__global const float* X, const int rows, const int cols, __global float* out) {
    const int j = get_global_id(0);
    if (j >= cols) return;
    float s = 0.0f;
    for (int i = 0; i < rows; ++i) s += X[i*cols + j];
    out[j] = s;
}

__kernel void sgd(__global float* W, __global const float* dW, const float lr) {
    const int g = get_global_id(0);
    W[g] -= lr * dW[g];
}
"""


@dataclass
class DemoResult:
    losses: list[float]
    paths: list[str]
    report: str
    seconds: float
    cycle_paths: list[str]  # demo.cycleN.<fmt>, one per active cycle and format
    schedule: str  # what the schedule did with the steps (one line)


def default_schedule(steps: int) -> Schedule:
    """Two cycles over ``steps`` steps: one warm-up step each, then active steps."""
    return Schedule(skip_first=0, wait=0, warmup=1, active=max(1, steps // 2 - 1), repeat=2)


class _MLP:
    def __init__(self, queue: Any, n: int, d: int, h: int, c: int, seed: int = 0) -> None:
        self.q = q = queue
        ctx = q.context
        self.n, self.d, self.h, self.c = n, d, h, c
        rng = np.random.default_rng(seed)
        centers = rng.normal(0, 2.0, size=(c, d)).astype(np.float32)
        y = rng.integers(0, c, size=n).astype(np.int32)
        x = (centers[y] + rng.normal(0, 1.0, size=(n, d))).astype(np.float32)
        self.x_host, self.y_host = x, y
        mf = cl.mem_flags

        def buf(arr: np.ndarray) -> Any:
            return Buffer(ctx, mf.READ_WRITE | mf.COPY_HOST_PTR, hostbuf=arr)

        def empty(*shape: int) -> Any:
            return Buffer(ctx, mf.READ_WRITE, 4 * int(np.prod(shape)))

        self.X, self.Y = empty(n, d), empty(n)
        self.W1 = buf((rng.normal(0, 1, (d, h)) / np.sqrt(d)).astype(np.float32))
        self.b1 = buf(np.zeros(h, np.float32))
        self.W2 = buf((rng.normal(0, 1, (h, c)) / np.sqrt(h)).astype(np.float32))
        self.b2 = buf(np.zeros(c, np.float32))
        self.H1, self.Z2 = empty(n, h), empty(n, c)
        self.dZ2, self.dH1 = empty(n, c), empty(n, h)
        self.dW1, self.dW2 = empty(d, h), empty(h, c)
        self.db1, self.db2 = empty(h), empty(c)
        self.loss = empty(n)
        self.loss_host = np.empty(n, np.float32)
        prg = compile_program(SOURCE, context=ctx)  # through the program cache: compile spans
        self.k = {name: prg.kernel(name) for name in
                  ("gemm", "bias_act", "softmax_xent", "relu_backward", "colsum", "sgd")}

    def _gemm(self, m: int, n: int, k: int, a: Any, sa: tuple[int, int], b: Any, sb: tuple[int, int], c: Any) -> None:
        i32 = np.int32
        self.k["gemm"][(m, n), None, self.q](i32(m), i32(n), i32(k), a, i32(sa[0]), i32(sa[1]),
                                             b, i32(sb[0]), i32(sb[1]), c)

    def upload(self) -> None:
        with regions.timing_region("upload", self.q):
            regions.copy(self.q, self.X, self.x_host, "copy X h2d")
            regions.copy(self.q, self.Y, self.y_host, "copy Y h2d")

    def step(self, lr: float) -> None:
        n, d, h, c, i32, q, k = self.n, self.d, self.h, self.c, np.int32, self.q, self.k
        with regions.timing_region("forward", q):
            self._gemm(n, h, d, self.X, (d, 1), self.W1, (h, 1), self.H1)
            k["bias_act"][(n * h,), None, q](self.H1, self.b1, i32(h), i32(1))
            self._gemm(n, c, h, self.H1, (h, 1), self.W2, (c, 1), self.Z2)
            k["bias_act"][(n * c,), None, q](self.Z2, self.b2, i32(c), i32(0))
            k["softmax_xent"][(n,), None, q](self.Z2, self.Y, i32(n), i32(c), self.dZ2, self.loss)
        with regions.timing_region("backward", q):
            self._gemm(h, c, n, self.H1, (1, h), self.dZ2, (c, 1), self.dW2)
            k["colsum"][(c,), None, q](self.dZ2, i32(n), i32(c), self.db2)
            self._gemm(n, h, c, self.dZ2, (c, 1), self.W2, (1, c), self.dH1)
            k["relu_backward"][(n * h,), None, q](self.dH1, self.H1)
            self._gemm(d, h, n, self.X, (1, d), self.dH1, (h, 1), self.dW1)
            k["colsum"][(h,), None, q](self.dH1, i32(n), i32(h), self.db1)
        with regions.timing_region("optimizer", q):
            lr32 = np.float32(lr)
            for w, g, size in ((self.W1, self.dW1, d * h), (self.b1, self.db1, h),
                               (self.W2, self.dW2, h * c), (self.b2, self.db2, c)):
                k["sgd"][(size,), None, q](w, g, lr32)

    def read_loss(self) -> float:
        with regions.timing_region("read_loss", self.q):
            ev = regions.copy(self.q, self.loss_host, self.loss, "copy loss d2h")
        ev.wait()
        return float(self.loss_host.mean())


def run_demo(out_dir: str = "traces", steps: int = 40, formats: tuple[str, ...] = ("json",),
             extra_sinks: tuple[Any, ...] = (), device: Any = None, batch: int = 512,
             lr: float = 0.5, schedule: Schedule | None = None) -> DemoResult:
    """Train the MLP for ``steps`` steps traced under ``schedule`` (default: ``default_schedule``);
    write ``demo.<fmt>`` and ``demo.cycleN.<fmt>`` files into ``out_dir``."""
    try:
        make_dirs(out_dir, FOLDER_MODE)
    except OSError as exc:
        raise session.OutputError(f"cannot write the demo traces into {out_dir!r}: {exc.strerror or exc}; "
                                  "choose another --out folder") from None
    paths = [os.path.join(out_dir, f"demo.{fmt}") for fmt in formats]
    dev = device or default_device()
    queue = profiling_queue(device=dev)
    RECORDER.clear()
    t0 = time.perf_counter()
    losses: list[float] = []
    cycle_paths: list[str] = []
    # quiet: the caller says where the files are
    session.start(*paths, *extra_sinks, quiet=True, schedule=schedule or default_schedule(steps),
                  on_trace_ready=lambda cycle: cycle_paths.extend(cycle.write()))
    paths = [session.written_as(p) for p in paths]  # another process writing one: the names taken instead
    failed = True  # a demo that fails leaves its files .partial: earlier traces stay as they were
    try:
        with regions.timing_region("setup"):
            model = _MLP(queue, n=batch, d=32, h=64, c=8)
        model.upload()
        for i in stepper.steps(range(steps), queue):  # a step: root span, host and device
            model.step(lr)
            if i % 10 == 0 or i == steps - 1:
                losses.append(model.read_loss())
        queue.finish()
        report = PerfCounter().report()
        done = stepper.current()
        summary = done.summary() if done is not None else ""
        failed = False
    finally:
        session.stop(failed=failed)
    return DemoResult(losses, paths, report, time.perf_counter() - t0, cycle_paths, summary)
