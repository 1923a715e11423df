"""What OpenCL C source says about itself: its kernels' names (spans are named after them)."""
from __future__ import annotations

import re

_KERNEL_RE = re.compile(r"\b(?:__)?kernel\b[^;{}()]*?\bvoid\s+(\w+)\s*\(")


def kernel_names(source: str) -> list[str]:
    """Names of the ``__kernel`` functions in OpenCL C source (for span names)."""
    return _KERNEL_RE.findall(source)
