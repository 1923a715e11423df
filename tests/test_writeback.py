"""The file sinks start the kernel's writeback of what they flush (``export.base.start_writeback``), so
``close()``'s fsync waits only for the last flush's bytes; the bytes in the file stay the same."""
from __future__ import annotations

import json
import os
import sys
from typing import Any

import pytest

import cltrace
from cltrace.export import base, chrome
from cltrace.export.perfetto import sink as perfetto_sink


def test_start_writeback_returns_the_end_and_leaves_the_bytes(tmp_path: Any) -> None:
    path = tmp_path / "f.bin"
    with open(path, "wb") as fh:
        fh.write(b"x" * 100_000)
        fh.flush()
        end = base.start_writeback(fh, 0)
        assert end == 100_000
        assert base.start_writeback(fh, end) == end  # nothing new: nothing to start
        fh.write(b"y" * 10)
        fh.flush()
        assert base.start_writeback(fh, end) == 100_010
    assert path.read_bytes() == b"x" * 100_000 + b"y" * 10
    if sys.platform.startswith("linux"):
        assert callable(base._sync_file_range)  # the call was found and used


@pytest.mark.parametrize("ext, module", [(".json", chrome), (".pftrace", perfetto_sink)])
def test_each_flush_starts_writeback_of_the_bytes_since_the_last(tmp_path: Any, queue: Any, kernels: Any, ext: str,
                                                                 module: Any, monkeypatch: Any) -> None:
    ranges: list[tuple[int, int]] = []
    real = base.start_writeback

    def spy(fh: Any, since: int) -> int:
        end = real(fh, since)
        ranges.append((since, end))
        return end

    monkeypatch.setattr(module, "start_writeback", spy)
    path = tmp_path / f"t{ext}"
    with cltrace.trace(path):
        for _ in range(3):
            kernels.launch_add(queue)
            queue.finish()
            cltrace.RECORDER.flush()
    assert ranges, "no writeback started"
    assert ranges[0][0] == 0
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))  # contiguous: each byte once
    assert 0 < ranges[-1][1] <= os.path.getsize(path)
    assert cltrace.analyze(str(path)) is not None  # the file reads back


def test_a_file_that_cannot_seek_is_left_alone(tmp_path: Any) -> None:
    r, w = os.pipe()
    with os.fdopen(w, "wb") as fh, os.fdopen(r, "rb") as back:
        fh.write(b"abc")
        fh.flush()
        assert base.start_writeback(fh, 0) == 0
        assert back.read(3) == b"abc"


def test_disk_is_reserved_ahead_and_released_at_close(tmp_path: Any, monkeypatch: Any) -> None:
    """The .json sink reserves disk past what it wrote (``base.reserve_space``) without growing the file:
    flushed, it ends at its last byte (a killed run leaves no zeros after it); closed, the blocks past its
    end are freed."""
    from test_chrome_bytes import batch, recorder

    monkeypatch.setattr(base, "RESERVE", 4 << 20)
    monkeypatch.setattr(base, "RESERVE_FROM", 0)
    path = tmp_path / "r.json"
    rec = recorder()
    sink = chrome.ChromeTraceSink(path, flush_every=1000)
    sink.start(rec)
    sink.write(batch(rec.tables, 3000, 1))
    if sink._reserved < 0:
        pytest.skip("this file system cannot reserve space (fallocate)")
    assert sys.platform.startswith("linux") and sink._reserved > 0
    st = os.stat(path)
    assert st.st_size == sink._offset and path.read_bytes().endswith(b",\n")
    assert st.st_blocks * 512 >= sink._reserved  # allocated past the end
    sink.close({})
    st = os.stat(path)
    assert st.st_size == sink.bytes_written
    assert st.st_blocks * 512 < st.st_size + (1 << 20)  # the rest given back
    json.loads(path.read_bytes())


def test_a_file_below_reserve_from_reserves_nothing(tmp_path: Any, monkeypatch: Any) -> None:
    """A trace smaller than ``RESERVE_FROM`` never reserves, so its close has no blocks to give back; one
    that outgrows it reserves from then on."""
    from test_chrome_bytes import batch, recorder

    monkeypatch.setattr(base, "RESERVE", 4 << 20)
    monkeypatch.setattr(base, "RESERVE_FROM", 1 << 20)
    path = tmp_path / "r.json"
    rec = recorder()
    sink = chrome.ChromeTraceSink(path, flush_every=1000)
    sink.start(rec)
    sink.write(batch(rec.tables, 200, 1))
    assert sink._offset + sink._used < base.RESERVE_FROM and sink._reserved == 0
    while sink._offset + sink._used < base.RESERVE_FROM:
        sink.write(batch(rec.tables, 1000, 1))
    sink.write(batch(rec.tables, 1000, 1))
    if sink._reserved < 0:
        pytest.skip("this file system cannot reserve space (fallocate)")
    assert sink._reserved > base.RESERVE_FROM
    sink.close({})
    json.loads(path.read_bytes())


def test_reserve_space_says_when_it_cannot(tmp_path: Any) -> None:
    r, w = os.pipe()
    try:
        assert base.reserve_space(w, base.RESERVE_FROM, 0) == -1  # a pipe has no blocks
    finally:
        os.close(r)
        os.close(w)
    if not sys.platform.startswith("linux"):
        return
    with open(tmp_path / "f", "wb") as fh:
        assert base.reserve_space(fh.fileno(), 100, 0) == 0  # below RESERVE_FROM: nothing yet
        first = base.RESERVE_FROM + 100
        end = base.reserve_space(fh.fileno(), first, 0)
        if end < 0:
            pytest.skip("this file system cannot reserve space (fallocate)")
        assert end == first + base.RESERVE
        assert base.reserve_space(fh.fileno(), first + 100, end) == end  # enough ahead: nothing to do
        assert base.reserve_space(fh.fileno(), end - 10, end) == end - 10 + base.RESERVE
        assert os.fstat(fh.fileno()).st_size == 0
