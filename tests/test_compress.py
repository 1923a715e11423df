"""The .pftrace writer's compressed packets: ISA-L's zlib (``isal``) against zlib's inflate, and whole
files written packed or plain reading the same."""
from __future__ import annotations

import random
import zlib
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import cltrace
from cltrace.export.perfetto import PerfettoTraceSink, compress
from cltrace.read import load, load_columns
from cltrace.read.inflate import compressed_packets, expand
from conftest import file_packets  # noqa: E402  (tests/ is on sys.path under pytest)

needs_native = pytest.mark.skipif(compress.NATIVE is None, reason=f"native compressor not active ({compress.DETAIL})")


@pytest.fixture(scope="module")
def plain_trace(tmp_path_factory: Any, queue: Any, kernels: Any) -> bytes:
    """A real run's packets, written plain."""
    path = tmp_path_factory.mktemp("plain") / "run.pftrace"
    sink = PerfettoTraceSink(path, compress=False)
    with cltrace.trace(sink):
        for _ in range(3000):
            kernels.launch_add(queue)
        queue.finish()
    return path.read_bytes()


@needs_native
def test_native_streams_inflate_to_their_input(plain_trace: bytes) -> None:
    """zlib (trace processor's inflate) gives back every byte: real packets whole and in odd pieces, runs longer
    than a match, repeats farther than the window, random bytes, and the edges of the sizes."""
    rng = random.Random(3)
    cases = [b"", b"a", b"abc", b"abcd", b"\0" * 5, b"\0" * 300, b"xy" * 40000, plain_trace,
             plain_trace[:4097], plain_trace[7:70001], rng.randbytes(5000),
             rng.randbytes(40000) + rng.randbytes(100) * 3, plain_trace[:1000] + rng.randbytes(33000) + plain_trace[:1000]]
    for data in cases:
        z = compress.NATIVE(data)
        assert zlib.decompress(z) == data, len(data)
        assert len(z) <= len(data) + len(data) // 8 + 64


@needs_native
@given(st.lists(st.sampled_from([b"\x0a\x09\x40", b"\x50\x02", b"\x5a\x02\x48\x02", b"\xa0\x02"]) | st.binary(max_size=7),
                max_size=400).map(b"".join))
@settings(max_examples=200, deadline=None)
def test_native_streams_inflate_for_any_bytes(data: bytes) -> None:
    assert zlib.decompress(compress.NATIVE(data)) == data


@needs_native
def test_native_compresses_packets_several_times_over(plain_trace: bytes) -> None:
    """The packets' repeats are found: at least 3x smaller than plain, about zlib's level 1 (at most 1.1x)."""
    z = compress.NATIVE(plain_trace)
    assert len(z) * 3 < len(plain_trace)
    assert len(z) < 1.1 * len(zlib.compress(plain_trace, 1))


def test_packed_frames_one_compressed_packet(plain_trace: bytes) -> None:
    raw = plain_trace[:200]
    assert compress.packed(raw) == raw  # too small to gain
    out = compress.packed(plain_trace)
    (at, start, end), = compressed_packets(out)
    assert (at, end) == (0, len(out))
    assert zlib.decompress(out[start:end]) == plain_trace == expand(out).data


def test_a_list_of_pieces_packs_as_their_concatenation(plain_trace: bytes) -> None:
    """The sink hands its packets over as a list: the same packet as the joined bytes, on either compressor;
    a small list is returned joined."""
    cuts = [0, 1, 17, 4096, len(plain_trace) // 2, len(plain_trace)]
    pieces = [plain_trace[a:b] for a, b in zip(cuts, cuts[1:])] + [b""]
    assert compress.packed(pieces) == compress.packed(plain_trace)
    assert compress.packed([plain_trace[:100], plain_trace[100:200]]) == plain_trace[:200]


def test_packed_and_plain_files_read_the_same(plain_trace: bytes, tmp_path: Path, queue: Any, kernels: Any) -> None:
    """One run written twice, packed and plain: both readers give the same spans and metadata, from a file
    several times smaller, whose first packets (clocks, tracks) stay plain."""
    packed, plain = tmp_path / "packed.pftrace", tmp_path / "plain.pftrace"
    with cltrace.trace(PerfettoTraceSink(packed), PerfettoTraceSink(plain, compress=False)):
        with cltrace.region("step", queue):
            for _ in range(2000):
                kernels.launch_add(queue)
    data = packed.read_bytes()
    assert len(data) * 2.5 < plain.stat().st_size
    held = file_packets(data)
    assert len(held[0][1]) == 1 and any(len(inner) > 100 for _, inner in held)
    for read in (load, load_columns):
        a, ma = read(packed)
        b, mb = read(plain)
        spans_a = a.spans() if hasattr(a, "spans") else a
        spans_b = b.spans() if hasattr(b, "spans") else b
        fields = [[getattr(s, f) for f in s.__slots__] for s in spans_a]
        assert fields == [[getattr(s, f) for f in s.__slots__] for s in spans_b] and len(spans_a) >= 2001
        assert ma == mb


def test_the_python_compressor_writes_files_the_readers_read(tmp_path: Path, queue: Any, kernels: Any,
                                                              monkeypatch: Any) -> None:
    """Where the C extension is missing, zlib at level 1 packs the same packets."""
    monkeypatch.setattr(compress, "zlib_stream", compress.python_zlib)
    path = tmp_path / "py.pftrace"
    with cltrace.trace(path):
        for _ in range(500):
            kernels.launch_add(queue)
    spans, meta = load(path)
    assert sum(s.dev_start is not None for s in spans) >= 500 and "truncated" not in meta
    assert any(len(inner) > 100 for _, inner in file_packets(path.read_bytes()))


def test_a_damaged_compressed_packet_is_named(plain_trace: bytes, tmp_path: Path) -> None:
    """Bytes changed inside a packed chunk (not a cut): one line that says so, from either reader."""
    data = compress.packed(plain_trace)
    (at, start, end), = compressed_packets(data)
    bad = bytearray(data)
    bad[start + 40:start + 60] = bytes(20)
    path = tmp_path / "bad.pftrace"
    path.write_bytes(bytes(bad))
    from cltrace.errors import TraceFileError

    for read in (load, load_columns):
        with pytest.raises(TraceFileError, match="compressed packets at byte 0 do not inflate") as err:
            read(path)
        assert "\n" not in str(err.value)


# ---- the packer thread -------------------------------------------------------------------------
def test_the_packer_writes_chunks_in_order_and_wait_means_written() -> None:
    import io
    import time

    from cltrace.export.perfetto.packer import Packer

    rng = random.Random(5)
    fh, sizes = io.BytesIO(), []

    def slow(raw: bytes) -> bytes:
        time.sleep(rng.random() / 500)
        return raw[::-1]

    p = Packer(fh, slow, sizes.append)
    chunks = [bytes([i]) * rng.randint(1, 50) for i in range(60)]
    for c in chunks[:30]:
        p.submit(c)
    p.wait()
    assert fh.getvalue() == b"".join(c[::-1] for c in chunks[:30])
    for c in chunks[30:]:
        p.submit(c)
    p.close()
    assert fh.getvalue() == b"".join(c[::-1] for c in chunks) and sum(sizes) == len(fh.getvalue())


def test_the_packer_holds_at_most_depth_chunks_and_hands_errors_over() -> None:
    import io
    import threading

    from cltrace.export.perfetto import packer as packer_mod

    gate = threading.Event()

    def gated(raw: bytes) -> bytes:
        gate.wait(10)
        if raw == b"bad":
            raise OSError(28, "No space left on device")
        return raw

    fh = io.BytesIO()
    p = packer_mod.Packer(fh, gated, lambda n: None)
    for i in range(packer_mod.DEPTH + 1):  # one being packed, DEPTH waiting
        p.submit(b"%d" % i)
    late = threading.Thread(target=p.submit, args=(b"late",))
    late.start()
    late.join(0.3)
    assert late.is_alive(), "a full packer makes the sink's thread wait"
    gate.set()
    late.join(5)
    p.wait()
    assert fh.getvalue() == b"".join(b"%d" % i for i in range(packer_mod.DEPTH + 1)) + b"late"
    p.submit(b"bad")
    with pytest.raises(OSError, match="No space"):
        p.wait()
    p.submit(b"next")  # the error was handed over once; the packer goes on
    p.close()
    assert fh.getvalue().endswith(b"latenext")
