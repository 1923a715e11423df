"""Which compressor packs the .pftrace writer's packets into ``TracePacket.compressed_packets``: the C
extension ``_deflate`` or Python's ``zlib`` at level 1.

Perfetto's tracing service writes the same field with ``compression_type: COMPRESSION_TYPE_DEFLATE``;
trace processor and ui.perfetto.dev inflate it in place, and cltrace's readers do (``read.inflate``).
Both compressors give a zlib stream of the same packets, and both run without the GIL, so a program's
threads go on while the sink's worker compresses. ``_deflate`` is a greedy one-probe LZ77 with fixed
Huffman codes: ~21 B a launch's spans against zlib's ~17 B, at a third to a quarter of zlib's CPU
time (``benchmarks/bench_perfetto.py`` prints both). ``PATH`` says which runs ("native" or "python").
"""
from __future__ import annotations

import zlib
from typing import Callable

from ..._native import choose, extension
from .wire import P_COMPRESSED, frame, uv


Compress = Callable[[bytes], bytes]  # the native one also takes a list of pieces
SMALLEST = 256  # fewer raw bytes than this are written as they are: a compressed packet would not be smaller


def python_zlib(data: bytes) -> bytes:
    return zlib.compress(data, 1)


def _load_native() -> Compress:
    _deflate = extension(__package__, "_deflate")
    return _deflate.zlib  # type: ignore[no-any-return]


_CHOICE = choose("the .pftrace compressor", _load_native)
NATIVE: Compress | None = _CHOICE.native
PATH: str = _CHOICE.path
DETAIL: str = _CHOICE.detail
zlib_stream: Compress = NATIVE or python_zlib


def packed(raw: bytes | list[bytes]) -> bytes:
    """Whole ``Trace.packet`` entries as one packet that holds them compressed (``raw`` itself where it is
    too small to gain). ``raw`` may be a list of pieces: the native compressor joins them without the GIL."""
    if isinstance(raw, list) and (zlib_stream is not NATIVE or sum(map(len, raw)) < SMALLEST):
        raw = b"".join(raw)
    if isinstance(raw, bytes) and len(raw) < SMALLEST:
        return raw
    z = zlib_stream(raw)
    return frame(P_COMPRESSED + uv(len(z)) + z)


__all__ = ["PATH", "DETAIL", "NATIVE", "zlib_stream", "python_zlib", "packed", "SMALLEST"]
