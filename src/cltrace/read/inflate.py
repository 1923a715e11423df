"""A .pftrace's compressed packets (``TracePacket.compressed_packets``, a zlib stream of whole packets)
expanded in place, as trace processor expands them, before either reader walks the file.

cltrace's writer packs its spans this way (``export.perfetto.compress``), as Perfetto's own tracing
service does with ``compression_type: COMPRESSION_TYPE_DEFLATE``. A file cut off inside a compressed
packet reads up to the packet before it, as a cut-off plain packet does. Byte offsets in the readers'
errors count in the expanded data.
"""
from __future__ import annotations

import zlib

import numpy as np

from ..errors import TraceFileError
from ..export.perfetto.wire import PACKET, P_COMPRESSED
from .scan import NATIVE


def varint_at(data: bytes, pos: int) -> tuple[int, int] | None:
    """(value, next position), or None where the data ends inside the varint."""
    result = shift = 0
    while pos < len(data):
        b = data[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise TraceFileError(f"not a Perfetto trace: bad packet length before byte {pos}")
    return None


def compressed_packets(data: bytes) -> list[tuple[int, int, int]]:
    """(packet offset, zlib start, zlib end) of each packet whose one field is ``compressed_packets``."""
    native = getattr(NATIVE, "compressed", None)
    if native is not None:
        return [(a, b, c) for a, b, c in np.frombuffer(native(data), np.int64).reshape(-1, 3).tolist()]
    out = []
    pos, n = 0, len(data)
    while pos < n and data[pos] == PACKET:
        got = varint_at(data, pos + 1)
        if got is None or got[1] + got[0] > n:
            break
        size, start = got
        end = start + size
        if data.startswith(P_COMPRESSED, start):
            inner = varint_at(data, start + len(P_COMPRESSED))
            if inner is not None and inner[1] + inner[0] == end:
                out.append((pos, inner[1], end))
        pos = end
    return out


def expand(data: bytes) -> bytes:
    """``data`` with each compressed packet replaced by the packets it holds (``data`` itself where none)."""
    if P_COMPRESSED not in data:
        return data
    found = compressed_packets(data)
    if not found:
        return data
    parts: list[bytes] = []
    pos = 0
    view = memoryview(data)
    for at, start, end in found:
        parts.append(view[pos:at])
        try:
            parts.append(zlib.decompress(view[start:end]))
        except zlib.error as exc:
            raise TraceFileError(f"corrupt Perfetto trace: the compressed packets at byte {at} do not inflate "
                                 f"({exc}); the file was damaged after it was written") from None
        pos = end
    parts.append(view[pos:])
    return b"".join(parts)
