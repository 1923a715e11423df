"""The worked example: a tunable tiled matrix multiply, ``C = A @ B`` in float32.

Knobs (compile-time defines, see ``SOURCE``): ``TILE_X`` columns per work-item
loaded as one vector, ``TILE_Y`` rows per work-item, ``UNROLL`` k-loop unroll,
and the work-group shape: given, each work-group stages ``TILE_K``-deep slices
of its A and B blocks in local memory; left to the driver (``None``), work-items
read global memory directly. The untuned default is the naive kernel a user
writes first: one output per work-item, no unrolling, driver-chosen local size.

    problem = MatmulProblem(queue, 512, 512, 512)
    result = cltrace.autotune(MATMUL, problem.args, queue=queue,
                              output=problem.c, reference=problem.reference)
    # later, in any process on the same device and driver: the winner for these sizes is applied
    prg = MATMUL.compile(context=queue.context, args=problem.args)
    MATMUL.launch(prg, queue, problem.args)
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np
import pyopencl as cl

from ...record.allocations import Buffer
from .. import Config, DeviceLimits, KernelTemplate

TILE_K = 16  # depth of the k-slices staged in local memory (must match SOURCE)

SOURCE = r"""/* C[M][N] = A[M][K] * B[K][N], row-major float32. Tunables (-D defines):
 *   TILE_X  columns of C per work-item, loaded as one vector (1, 2, 4, 8 or 16)
 *   TILE_Y  rows of C per work-item
 *   UNROLL  k-loop unroll factor
 *   WG_X, WG_Y  work-group shape; when set, each work-group stages a TILE_K-deep
 *           slice of its A and B blocks in local memory (the classic tiled GEMM);
 *           when unset, work-items read global memory and the driver picks the
 *           work-group size.
 * Any M, N, K: edges are clamped on load and guarded on store. */
#ifndef TILE_X
#define TILE_X 1
#endif
#ifndef TILE_Y
#define TILE_Y 1
#endif
#ifndef UNROLL
#define UNROLL 1
#endif
#ifndef TILE_K
#define TILE_K 16
#endif
#if TILE_X != 1 && TILE_X != 2 && TILE_X != 4 && TILE_X != 8 && TILE_X != 16
#error "TILE_X must be 1, 2, 4, 8 or 16 (an OpenCL vector width)"
#endif
#if TILE_Y < 1 || UNROLL < 1
#error "TILE_Y and UNROLL must be >= 1"
#endif

#define XCAT(a, b) a##b
#define CAT(a, b) XCAT(a, b)
#if TILE_X == 1
typedef float vecx;
#define VLOAD(p) (*(p))
#define VSTORE(v, p) (*(p) = (v))
#else
typedef CAT(float, TILE_X) vecx;
#define VLOAD(p) CAT(vload, TILE_X)(0, p)
#define VSTORE(v, p) CAT(vstore, TILE_X)(v, 0, p)
#endif

/* Store TILE_Y rows of TILE_X columns at (r0, c0), skipping what lies outside C. */
#define STORE_TILE(acc, r0, c0)                                                  \
    for (int y = 0; y < TILE_Y; ++y) {                                           \
        const int r = (r0) + y;                                                  \
        if (r >= M) break;                                                       \
        if ((c0) + TILE_X <= N) {                                                \
            VSTORE(acc[y], C + r * N + (c0));                                    \
        } else {                                                                 \
            float t[TILE_X];                                                     \
            VSTORE(acc[y], t);                                                   \
            for (int x = 0; x < TILE_X && (c0) + x < N; ++x) C[r * N + (c0) + x] = t[x]; \
        }                                                                        \
    }

#ifdef WG_X

#if TILE_K % UNROLL != 0
#error "UNROLL must divide TILE_K"
#endif
#define BM (WG_Y * TILE_Y)
#define BN (WG_X * TILE_X)
#define NT (WG_X * WG_Y)

__attribute__((reqd_work_group_size(WG_X, WG_Y, 1)))
__kernel void matmul(const int M, const int N, const int K,
                     __global const float* restrict A,
                     __global const float* restrict B,
                     __global float* restrict C)
{
    __local float As[BM][TILE_K];
    __local float Bs[TILE_K][BN];
    const int lx = get_local_id(0), ly = get_local_id(1);
    const int lid = ly * WG_X + lx;
    const int row0 = get_group_id(1) * BM, col0 = get_group_id(0) * BN;
    vecx acc[TILE_Y];
    for (int y = 0; y < TILE_Y; ++y) acc[y] = (vecx)(0.0f);
    for (int k0 = 0; k0 < K; k0 += TILE_K) {
        for (int i = lid; i < BM * TILE_K; i += NT) {
            const int r = row0 + i / TILE_K, c = k0 + i % TILE_K;
            As[i / TILE_K][i % TILE_K] = (r < M && c < K) ? A[r * K + c] : 0.0f;
        }
        for (int i = lid; i < TILE_K * BN; i += NT) {
            const int r = k0 + i / BN, c = col0 + i % BN;
            Bs[i / BN][i % BN] = (r < K && c < N) ? B[r * N + c] : 0.0f;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int k = 0; k < TILE_K; k += UNROLL) {
            for (int u = 0; u < UNROLL; ++u) {
                const vecx b = VLOAD(&Bs[k + u][lx * TILE_X]);
                for (int y = 0; y < TILE_Y; ++y)
                    acc[y] = mad((vecx)(As[ly * TILE_Y + y][k + u]), b, acc[y]);
            }
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    STORE_TILE(acc, row0 + ly * TILE_Y, col0 + lx * TILE_X)
}

#else

__kernel void matmul(const int M, const int N, const int K,
                     __global const float* restrict A,
                     __global const float* restrict B,
                     __global float* restrict C)
{
    const int col0 = get_global_id(0) * TILE_X, row0 = get_global_id(1) * TILE_Y;
    if (col0 >= N || row0 >= M) return;
    const int full = col0 + TILE_X <= N;
    int ra[TILE_Y];
    for (int y = 0; y < TILE_Y; ++y) ra[y] = min(row0 + y, M - 1) * K;
    vecx acc[TILE_Y];
    for (int y = 0; y < TILE_Y; ++y) acc[y] = (vecx)(0.0f);
    int k = 0;
    if (full) {
        for (; k + UNROLL <= K; k += UNROLL)
            for (int u = 0; u < UNROLL; ++u) {
                const vecx b = VLOAD(B + (k + u) * N + col0);
                for (int y = 0; y < TILE_Y; ++y) acc[y] = mad((vecx)(A[ra[y] + k + u]), b, acc[y]);
            }
        for (; k < K; ++k) {
            const vecx b = VLOAD(B + k * N + col0);
            for (int y = 0; y < TILE_Y; ++y) acc[y] = mad((vecx)(A[ra[y] + k]), b, acc[y]);
        }
    } else {
        for (; k < K; ++k) {
            float t[TILE_X];
            for (int x = 0; x < TILE_X; ++x) t[x] = B[k * N + min(col0 + x, N - 1)];
            const vecx b = VLOAD(t);
            for (int y = 0; y < TILE_Y; ++y) acc[y] = mad((vecx)(A[ra[y] + k]), b, acc[y]);
        }
    }
    STORE_TILE(acc, row0, col0)
}

#endif
"""


def _mnk(args: Sequence[Any]) -> tuple[int, int, int]:
    return int(args[0]), int(args[1]), int(args[2])


def global_size(args: Sequence[Any], config: Config) -> tuple[int, int]:
    """NDRange for ``args = (M, N, K, A, B, C)``: one work-item per TILE_X x TILE_Y block of C,
    rounded up to whole work-groups when the work-group is fixed."""
    m, n, _ = _mnk(args)
    tx, ty = config.tile or (1, 1)
    if config.workgroup is None:
        return (math.ceil(n / tx), math.ceil(m / ty))
    wx, wy = config.workgroup
    return (math.ceil(n / (wx * tx)) * wx, math.ceil(m / (wy * ty)) * wy)


def local_mem_bytes(config: Config) -> int:
    """Local memory of the staged variant: a BM x TILE_K slice of A and TILE_K x BN of B."""
    if config.workgroup is None:
        return 0
    wx, wy = config.workgroup
    tx, ty = config.tile or (1, 1)
    return 4 * TILE_K * (wy * ty + wx * tx)


def constraint(args: Sequence[Any], config: Config) -> str | None:
    if config.workgroup is not None and config.unroll and TILE_K % config.unroll:
        return f"UNROLL={config.unroll} does not divide TILE_K={TILE_K} (staged variant)"
    return None


def tiles(limits: DeviceLimits) -> list[tuple[int, int]]:
    """TILE_X: OpenCL vector widths up to the device's preferred float width (at least 4);
    TILE_Y: 1 to 8 rows. Largest tiles first: a fast trial early lets the tuner's cutoff
    cut the slow small-tile trials short."""
    widths = [w for w in (1, 2, 4, 8, 16) if w <= max(4, limits.preferred_vector_width)]
    return sorted(((x, y) for x in widths for y in (1, 2, 4, 8)), key=lambda t: (-t[0] * t[1], -t[0]))


def unrolls(limits: DeviceLimits) -> list[int]:
    return [u for u in (1, 2, 4, 8) if TILE_K % u == 0]


def flops(args: Sequence[Any]) -> float:
    m, n, k = _mnk(args)
    return 2.0 * m * n * k


MATMUL = KernelTemplate(
    name="matmul",
    source=SOURCE,
    global_size=global_size,
    dims=2,
    default=Config(workgroup=None, tile=(1, 1), unroll=1),
    local_mem_bytes=local_mem_bytes,
    constraint=constraint,
    tiles=tiles,
    unrolls=unrolls,
    flops=flops,
    key=(0, 1, 2),  # winners are stored per (M, N, K)
)


class MatmulProblem:
    """Inputs, output buffer and numpy reference for one ``M x K @ K x N`` product.

    Inputs are small integers, so every summation order gives the exact same
    float32 result and a wrong index shows up as a mismatch, not as rounding.
    """

    def __init__(self, queue: Any, m: int, n: int, k: int, seed: int = 0) -> None:
        if min(m, n, k) < 1:
            raise ValueError(f"matmul sizes must be >= 1, got {m}x{n}x{k}")
        self.queue = queue
        self.m, self.n, self.k = m, n, k
        rng = np.random.default_rng(seed)
        self.a = rng.integers(-4, 5, size=(m, k)).astype(np.float32)
        self.b = rng.integers(-4, 5, size=(k, n)).astype(np.float32)
        mf = cl.mem_flags
        ctx = queue.context
        self.a_buf = Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=self.a)
        self.b_buf = Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=self.b)
        self.c = Buffer(ctx, mf.READ_WRITE, 4 * m * n)
        self._reference: np.ndarray | None = None

    @property
    def args(self) -> tuple[Any, ...]:
        return (np.int32(self.m), np.int32(self.n), np.int32(self.k), self.a_buf, self.b_buf, self.c)

    @property
    def reference(self) -> np.ndarray:
        if self._reference is None:
            self._reference = (self.a.astype(np.float64) @ self.b.astype(np.float64)).astype(np.float32)
        return self._reference

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.n * self.k

    def result(self) -> np.ndarray:
        """C read back from the device."""
        out = np.empty((self.m, self.n), np.float32)
        cl.enqueue_copy(self.queue, out, self.c)
        return out
