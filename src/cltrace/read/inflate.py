"""A .pftrace's compressed packets (``TracePacket.compressed_packets``, a zlib stream of whole packets)
expanded in place, as trace processor expands them, before either reader walks the file.

cltrace's writer packs its spans this way (``export.perfetto.compress``), as Perfetto's own tracing
service does with ``compression_type: COMPRESSION_TYPE_DEFLATE``. A file cut off inside a compressed
packet reads up to the packet before it, as a cut-off plain packet does. Byte offsets in the readers'
errors count in the expanded data.

What one file may inflate to is bounded (a file from someone else may be a decompression bomb): at most
``MAX_RATIO`` times the file's size and never more than ``MAX_INFLATED`` bytes in all. Each stream is
inflated no further than what is left of that budget (zlib's output bounded), so a bomb costs no more
memory than the budget;
the stream that would pass it, and every compressed packet after it, are skipped and said in one line
(``Expanded.skipped``, ``describe_skipped``). cltrace's own files inflate about 2.5 to 4 times.
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import TraceFileError
from ..export.perfetto.wire import PACKET, P_COMPRESSED
from .scan import NATIVE

MAX_RATIO = 16  # inflated bytes per byte of the file, at most
MAX_INFLATED = 512 << 20  # inflated bytes of one file, at most (512 MiB)


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


@dataclass
class Expanded:
    """A file's bytes with its compressed packets expanded in place, and what was skipped."""

    data: bytes
    file_bytes: int
    # (offset in data, offset in the file, length in data, length in the file) of each expanded stream
    blocks: list[tuple[int, int, int, int]] = field(default_factory=list)
    skipped: dict[str, Any] | None = None  # streams left out past the budget: see ``describe_skipped``

    def file_offset(self, pos: int) -> int:
        """Where in the file the data up to ``pos`` ends: a position inside an expanded stream counts as
        the start of its packet, since the packets read from it are only part of it."""
        shift = 0
        for at, file_at, n, file_n in self.blocks:
            if pos < at:
                break
            if pos < at + n:
                return file_at
            shift += n - file_n
        return max(0, min(pos - shift, self.file_bytes))

    def note(self, meta: dict[str, Any]) -> None:
        """Put the skipped note in ``meta["inflate_skipped"]`` (where a stream was skipped)."""
        if self.skipped:
            meta["inflate_skipped"] = dict(self.skipped)


def budget(file_bytes: int) -> int:
    """How many bytes a file of ``file_bytes`` may inflate to in all."""
    return min(MAX_INFLATED, MAX_RATIO * file_bytes)


def _inflate(stream: memoryview, limit: int, at: int) -> bytes | None:
    """The stream inflated, or None where it inflates to more than ``limit`` bytes (never holding more)."""
    d = zlib.decompressobj()
    try:
        out = d.decompress(stream, limit + 1)
    except zlib.error as exc:
        raise TraceFileError(f"corrupt Perfetto trace: the compressed packets at byte {at} do not inflate "
                             f"({exc}); the file was damaged after it was written") from None
    if len(out) > limit:
        return None
    if not d.eof:
        raise TraceFileError(f"corrupt Perfetto trace: the compressed packets at byte {at} do not inflate "
                             "(the stream ends early); the file was damaged after it was written")
    return out


def expand(data: bytes) -> Expanded:
    """``data`` with each compressed packet replaced by the packets it holds, within the file's budget."""
    got = Expanded(data, len(data))
    if P_COMPRESSED not in data:
        return got
    found = compressed_packets(data)
    if not found:
        return got
    left = budget(len(data))
    parts: list[bytes | memoryview] = []
    pos = size = 0
    view = memoryview(data)
    for k, (at, start, end) in enumerate(found):
        parts.append(view[pos:at])
        size += at - pos
        out = _inflate(view[start:end], left, at)
        if out is None:
            rest = found[k:]
            got.skipped = {"streams": len(rest), "file_bytes": sum(e - a for a, _, e in rest),
                           "first_at": at, "limit": budget(len(data))}
            for (a, _, e), nxt in zip(rest, [*(a for a, _, _ in rest[1:]), len(data)]):
                got.blocks.append((size, a, 0, e - a))
                parts.append(view[e:nxt])  # the plain packets between the skipped streams are kept
                size += nxt - e
            pos = len(data)
            break
        left -= len(out)
        got.blocks.append((size, at, len(out), end - at))
        parts.append(out)
        size += len(out)
        pos = end
    parts.append(view[pos:])
    got.data = b"".join(parts)
    return got


def describe_skipped(info: dict[str, Any]) -> str:
    """One line for a ``meta["inflate_skipped"]`` note: what was left out, and why."""
    n = info["streams"]
    return (f"{n:,} compressed packet stream{'s' if n != 1 else ''} ({info['file_bytes']:,} bytes of the file, "
            f"from byte {info['first_at']:,}) skipped: the file would inflate past {info['limit']:,} bytes "
            f"(cltrace reads at most {MAX_RATIO} times a file's size, and at most {MAX_INFLATED >> 20:,} MiB)")
