"""What a device (and a built kernel) allows, and the candidate values generated from it."""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, replace
from typing import Any, Iterator, Sequence

import pyopencl as cl

from ..programs.compiler import device_key
from .config import fmt_dims


@dataclass(frozen=True)
class DeviceLimits:
    """The limits candidate generation and the fit checks use, queried once per device.

    ``preferred_multiple`` and ``kernel_work_group_size`` come from a built kernel
    (``CL_KERNEL_PREFERRED_WORK_GROUP_SIZE_MULTIPLE`` / ``CL_KERNEL_WORK_GROUP_SIZE``)
    when one is known, else from the device.
    """

    device_key: str
    device_name: str
    max_work_group_size: int
    max_work_item_sizes: tuple[int, ...]
    local_mem_size: int
    preferred_vector_width: int
    preferred_multiple: int = 1
    kernel_work_group_size: int | None = None

    @classmethod
    def query(cls, device: Any, kernel: Any = None) -> "DeviceLimits":
        try:
            multiple = int(device.preferred_work_group_size_multiple)
        except (cl.Error, AttributeError):
            multiple = 1
        limits = cls(
            device_key=device_key(device),
            device_name=device.name.strip(),
            max_work_group_size=int(device.max_work_group_size),
            max_work_item_sizes=tuple(int(v) for v in device.max_work_item_sizes),
            local_mem_size=int(device.local_mem_size),
            preferred_vector_width=max(1, int(device.preferred_vector_width_float)),
            preferred_multiple=max(1, multiple),
        )
        return limits.with_kernel(kernel, device) if kernel is not None else limits

    def with_kernel(self, kernel: Any, device: Any) -> "DeviceLimits":
        info = cl.kernel_work_group_info
        return replace(
            self,
            preferred_multiple=max(1, int(kernel.get_work_group_info(info.PREFERRED_WORK_GROUP_SIZE_MULTIPLE, device))),
            kernel_work_group_size=int(kernel.get_work_group_info(info.WORK_GROUP_SIZE, device)),
        )

    def workgroup_candidates(self, dims: int = 2, count: int = 3) -> list[tuple[int, ...] | None]:
        """``None`` (driver's choice), then ``count`` shapes of m, 4m, 16m... work-items.

        m is the preferred multiple; each size gets its most square shape that
        fits ``max_work_item_sizes``; sizes over the (kernel's) maximum are left out.
        """
        cap = self.max_work_group_size
        if self.kernel_work_group_size:
            cap = min(cap, self.kernel_work_group_size)
        out: list[tuple[int, ...] | None] = [None]
        size = self.preferred_multiple
        while len(out) <= count and size <= cap:
            shape = _squarest(size, dims, self.max_work_item_sizes)
            if shape is not None and shape not in out:
                out.append(shape)
            size *= 4
        return out

    def tile_candidates(self, dims: int = 2) -> list[tuple[int, ...]]:
        """Powers of two per axis: up to the preferred vector width (at least 4) along X, up to 4 along the rest."""
        xs = _pow2_upto(max(4, self.preferred_vector_width))
        rest = _pow2_upto(4)
        axes = [xs] + [rest] * (dims - 1)
        return list(itertools.product(*axes))

    @staticmethod
    def unroll_candidates() -> list[int]:
        return [1, 2, 4, 8]


def fit_workgroup(workgroup: tuple[int, ...] | None, limits: DeviceLimits, dims: int | None) -> str | None:
    """Why ``workgroup`` cannot run on this device (or a kernel of ``dims`` dimensions), or None."""
    if workgroup is None:
        return None
    label = fmt_dims(workgroup, "")
    if any(w < 1 for w in workgroup):
        return f"work-group {label} has a dimension < 1"
    if dims is not None and len(workgroup) != dims:
        return f"work-group {label} has {len(workgroup)} dimensions, the kernel has {dims}"
    if len(workgroup) > len(limits.max_work_item_sizes):
        return f"work-group {label} has more dimensions than the device ({len(limits.max_work_item_sizes)})"
    total = math.prod(workgroup)
    if total > limits.max_work_group_size:
        return f"work-group {label} = {total} work-items exceeds max_work_group_size {limits.max_work_group_size}"
    for axis, (w, m) in enumerate(zip(workgroup, limits.max_work_item_sizes)):
        if w > m:
            return f"work-group {label}: {w} exceeds max_work_item_sizes[{axis}] = {m}"
    return None


def _pow2_upto(n: int) -> list[int]:
    out, v = [], 1
    while v <= n:
        out.append(v)
        v *= 2
    return out


def _squarest(size: int, dims: int, max_items: Sequence[int]) -> tuple[int, ...] | None:
    """The shape of ``size`` work-items closest to a square (ties: larger X first) within ``max_items``."""
    fits = [s for s in _factorizations(size, dims) if all(v <= m for v, m in zip(s, max_items))]
    if not fits:
        return None
    return min(fits, key=lambda s: (max(s) / min(s), tuple(-v for v in s)))


def _factorizations(size: int, dims: int) -> Iterator[tuple[int, ...]]:
    if dims == 1:
        yield (size,)
        return
    for d in range(1, size + 1):
        if size % d == 0:
            for rest in _factorizations(size // d, dims - 1):
                yield (d,) + rest
