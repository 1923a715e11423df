"""Which compressor packs the .pftrace writer's packets into ``TracePacket.compressed_packets``: ISA-L's
zlib (the ``isal`` package, a core dependency) or Python's ``zlib``, both at level 1.

Perfetto's tracing service writes the same field with ``compression_type: COMPRESSION_TYPE_DEFLATE``;
trace processor and ui.perfetto.dev inflate it in place, and cltrace's readers do (``read.inflate``).
Both give a zlib stream of the same packets, and both run without the GIL, so a program's threads go
on while the sink's packer compresses. On a launch's packets in 1 MiB chunks (``benchmarks/
bench_perfetto.py`` prints the table): ~17 B a launch either way (~74 B plain), ISA-L at ~160 ns a
launch, zlib at ~610 ns. zlib runs where ``isal`` is not installed, or with ``CLTRACE_NATIVE=0``;
``PATH`` says which ("native" or "python").
"""
from __future__ import annotations

import zlib
from typing import Callable

from ..._native import choose
from .wire import P_COMPRESSED, frame, uv


Compress = Callable[[bytes], bytes]
SMALLEST = 256  # fewer raw bytes than this are written as they are: a compressed packet would not be smaller


def python_zlib(data: bytes) -> bytes:
    return zlib.compress(data, 1)


def _load_native() -> Compress:
    from isal import isal_zlib  # ImportError where the package is missing: zlib then

    def isal_level_1(data: bytes) -> bytes:
        return isal_zlib.compress(data, 1)

    return isal_level_1


_CHOICE = choose("the .pftrace compressor", _load_native)
NATIVE: Compress | None = _CHOICE.native
PATH: str = _CHOICE.path
DETAIL: str = "native (isal: ISA-L's zlib)" if NATIVE is not None else _CHOICE.detail
zlib_stream: Compress = NATIVE or python_zlib


def packed(raw: bytes | list[bytes]) -> bytes:
    """Whole ``Trace.packet`` entries as one packet that holds them compressed (``raw`` itself where it is
    too small to gain). ``raw`` may be a list of pieces, joined first."""
    if isinstance(raw, list):
        raw = b"".join(raw)
    if len(raw) < SMALLEST:
        return raw
    z = zlib_stream(raw)
    return frame(P_COMPRESSED + uv(len(z)) + z)


__all__ = ["PATH", "DETAIL", "NATIVE", "zlib_stream", "python_zlib", "packed", "SMALLEST"]
