"""File work off the program's path (``export.offpath``): a closed trace file's fsync and the freeing of
a file its rename replaced run on a background thread, finish by interpreter exit, and change no byte."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from typing import Any

import pytest

from cltrace.export import base, offpath
from cltrace.read.load import load


def _holding(dev: int, ino: int) -> list[str]:
    """This process's descriptors open on the file (dev, ino)."""
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            st = os.stat(f"/proc/self/fd/{fd}")
        except OSError:  # closed meanwhile by another thread
            continue
        if (st.st_dev, st.st_ino) == (dev, ino):
            out.append(fd)
    return out


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc")
def test_a_rename_over_an_earlier_file_frees_it_off_path_and_leaves_no_descriptor(tmp_path: Any) -> None:
    path = str(tmp_path / "t.json")
    with open(path, "wb") as fh:
        fh.write(b"old" * 100_000)
    old = os.stat(path)
    with open(base.partial_path(path), "wb") as fh:
        fh.write(b"new")
    with open(path, "rb") as reader:  # a reader of the earlier file keeps it whole
        base.put_in_place(path)
        assert open(path, "rb").read() == b"new"
        assert not os.path.exists(base.partial_path(path))
        assert reader.read() == b"old" * 100_000
    assert offpath.wait(10)
    assert _holding(old.st_dev, old.st_ino) == []


def test_a_fifo_in_the_way_is_replaced_without_blocking(tmp_path: Any) -> None:
    path = str(tmp_path / "t.json")
    os.mkfifo(path)  # no writer: a blocking open would wait forever
    with open(base.partial_path(path), "wb") as fh:
        fh.write(b"new")
    base.put_in_place(path)
    assert offpath.wait(10)
    assert open(path, "rb").read() == b"new"


def test_a_closed_file_is_synced_after_close_on_its_own_inode(tmp_path: Any, monkeypatch: Any) -> None:
    synced: list[tuple[int, int]] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        st = os.fstat(fd)
        synced.append((st.st_dev, st.st_ino))
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    path = tmp_path / "f.bin"
    fh = open(path, "wb", buffering=1 << 20)
    fh.write(b"x" * 1000)  # still in Python's buffer: the close writes it
    base.close_synced(fh)
    assert fh.closed
    assert path.read_bytes() == b"x" * 1000
    assert offpath.wait(10)
    st = os.stat(path)
    assert synced == [(st.st_dev, st.st_ino)]


def _run(code: str, tmp: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, cwd=tmp,
                          timeout=120, env={**os.environ, "CLTRACE_DEVICE": os.environ.get("CLTRACE_DEVICE", "")})


SLOW_SYNC = """
    import os, threading, time
    real = os.fsync
    GATE = threading.Event()  # the syncs wait for it: none can finish before the program sets it
    def fsync(fd):
        GATE.wait(30)
        time.sleep(0.2)
        real(fd)
        with open("synced", "a") as f:
            f.write("1")
    os.fsync = fsync
    import cltrace
"""


def test_the_syncs_finish_before_the_interpreter_exits(tmp_path: Any) -> None:
    r = _run(SLOW_SYNC + """
    cltrace.start("a.json", "a.pftrace", quiet=True)
    with cltrace.region("r"):
        pass
    cltrace.stop()
    assert not os.path.exists("synced"), "stop() waited for the syncs"
    GATE.set()
    """, tmp_path)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "synced").read_text() == "11"
    for name in ("a.json", "a.pftrace"):
        spans, meta = load(str(tmp_path / name))
        assert [s.name for s in spans] == ["r"] and meta.get("recorded_spans") == 1


def test_files_closed_by_the_exit_handler_are_synced_before_exit(tmp_path: Any) -> None:
    r = _run(SLOW_SYNC + """
    cltrace.start("a.json", "a.pftrace", quiet=True)
    with cltrace.region("r"):
        pass
    GATE.set()
    """, tmp_path)  # never stopped: the recorder's exit handler closes the sinks
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "synced").read_text() == "11"


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_forgets_the_parents_jobs(tmp_path: Any) -> None:
    r = _run("""
    import os, threading
    from cltrace.export import offpath
    gate = threading.Event()
    real = os.fsync
    def fsync(fd):
        gate.wait(5)
        real(fd)
    os.fsync = fsync
    fds = [os.open("f%d" % i, os.O_CREAT | os.O_WRONLY) for i in range(3)]
    for fd in fds:
        offpath.sync_and_close(fd)
    pid = os.fork()
    if pid == 0:
        ok = offpath.wait(1)  # the parent's jobs are not the child's to wait for
        offpath.close(os.open("g", os.O_CREAT | os.O_WRONLY))
        os._exit(0 if ok and offpath.wait(5) else 1)
    _, status = os.waitpid(pid, 0)
    gate.set()
    assert offpath.wait(10)
    assert os.waitstatus_to_exitcode(status) == 0
    print("ok")
    """, tmp_path)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


def test_a_file_written_afresh_in_place_while_jobs_wait_keeps_its_bytes(tmp_path: Any) -> None:
    """A sink writing its path directly, twice at once, the second file shorter: whatever the background
    thread does to the first file afterwards (its fsync) leaves the second as written."""
    import json
    import threading

    from test_chrome_bytes import batch, recorder

    from cltrace.export import chrome

    gate = threading.Event()
    offpath.later(gate.wait, 10)  # the thread busy: the first file's jobs run after the second is written
    path = tmp_path / "r.json"
    rec = recorder()
    for n in (3000, 10):
        sink = chrome.ChromeTraceSink(path, flush_every=1000)
        sink.start(rec)
        sink.write(batch(rec.tables, n, 1))
        sink.close({})
    second = path.read_bytes()
    gate.set()
    assert offpath.wait(10)
    assert path.read_bytes() == second
    json.loads(second)
