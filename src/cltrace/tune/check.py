"""Checking a trial's result: the output buffer is poisoned before the trial, read back after it, compared."""
from __future__ import annotations

from typing import Any

import numpy as np
import pyopencl as cl


class OutputCheck:
    """The buffer a kernel writes, poisoned before each trial and read back after it."""

    def __init__(self, output: Any, reference: Any) -> None:
        import pyopencl.array as cla

        if isinstance(output, cla.Array):
            self.buffer, self.shape, self.dtype = output.base_data, output.shape, output.dtype
            self.offset = output.offset
        elif isinstance(output, cl.MemoryObjectHolder):
            if reference is None:
                raise ValueError("autotune: output= is a plain cl.Buffer, so reference= is needed "
                                 "(its shape and dtype say how to read the buffer); or pass a pyopencl Array")
            ref = np.asarray(reference)
            self.buffer, self.shape, self.dtype, self.offset = output, ref.shape, ref.dtype, 0
        else:
            raise TypeError(f"autotune: output= must be a cl.Buffer or pyopencl Array, not {type(output).__name__}")
        self.nbytes = int(np.prod(self.shape)) * np.dtype(self.dtype).itemsize
        self.reference = None if reference is None else np.asarray(reference)

    def poison(self, queue: Any) -> None:
        cl.enqueue_fill_buffer(queue, self.buffer, np.uint8(0xFF), self.offset, self.nbytes)

    def read(self, queue: Any) -> np.ndarray:
        host = np.empty(self.shape, self.dtype)
        cl.enqueue_copy(queue, host, self.buffer, src_offset=self.offset)
        return host


def compare(got: np.ndarray, want: np.ndarray, rtol: float, atol: float) -> str | None:
    """None when ``got`` matches ``want`` within tolerance, else what is wrong."""
    got = np.asarray(got).reshape(np.shape(want))
    bad = ~np.isclose(got, want, rtol=rtol, atol=atol)
    if not bad.any():
        return None
    idx = tuple(int(i) for i in np.unravel_index(int(np.argmax(bad)), bad.shape))
    return (f"wrong result: {int(bad.sum())} of {bad.size} elements differ "
            f"(first at {idx}: {got[idx].item()!r}, expected {want[idx].item()!r})")

