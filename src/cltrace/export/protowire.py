"""Protobuf wire-format pieces shared by the exporters that write protobuf by hand (OTLP, Perfetto)."""
from __future__ import annotations

SMALL = tuple(bytes((i,)) for i in range(128))
VARINT, FIXED64, LEN = 0, 1, 2  # wire types


def varint(n: int) -> bytes:
    """Varint of ``n``; a negative ``n`` is written as its 64-bit two's complement (int64)."""
    if n < 0:
        n &= 0xFFFFFFFFFFFFFFFF
    if n < 128:
        return SMALL[n]
    if n < 16384:
        return bytes(((n & 127) | 128, n >> 7))
    if n < 2097152:
        return bytes(((n & 127) | 128, ((n >> 7) & 127) | 128, n >> 14))
    out = bytearray()
    while n > 127:
        out.append((n & 127) | 128)
        n >>= 7
    out.append(n)
    return bytes(out)


def tag(number: int, wire: int) -> bytes:
    """The key of field ``number`` with wire type ``wire``."""
    return varint((number << 3) | wire)


def nested(key: bytes, body: bytes) -> bytes:
    """A length-delimited field: an embedded message or raw bytes."""
    return key + varint(len(body)) + body


def text(key: bytes, s: str) -> bytes:
    """A string field, UTF-8 (a lone surrogate becomes "?" rather than failing the write)."""
    return nested(key, s.encode("utf-8", "replace"))
