"""The ``cltrace`` command: devices, demo, summary, run, tune; and ``instrument``, which hooks pyopencl
so that unmodified programs are traced. The top layer: may import every other package.
"""
from __future__ import annotations

from .commands import main

__all__ = ["main"]
