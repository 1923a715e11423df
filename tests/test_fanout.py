"""One batch into several sinks side by side (``record/fanout.py``): the files hold what they hold when the
sinks are written in turn, a sink that fails is one warning and costs the others nothing, and a forked
child writes with threads of its own. The side-by-side path is forced here (``MIN_CPUS``, ``MIN_ROWS``):
on a machine of fewer than four cores it is otherwise off."""
from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
from typing import Any

import pytest

import cltrace
from cltrace.read.load import load
from cltrace.record import fanout
from cltrace.record.recorder import RECORDER


def _run(queue: Any, kernels: Any, out: list[str]) -> None:
    cltrace.start(*out, quiet=True)
    for i in range(300):
        with cltrace.region(f"r{i % 3}", queue):
            kernels.launch_add(queue)
            kernels.launch_add(queue)
    queue.finish()
    cltrace.stop()


def _content(path: str) -> list[tuple[Any, ...]]:
    """Each span's identity and durations in ns (each file has its own time origin), in id order."""
    spans, _ = load(path)

    def dur(a: int | None, b: int | None) -> int | None:
        return None if a is None or b is None else b - a
    return sorted((s.id, s.name, s.cat, s.parent, dur(s.dev_start, s.dev_end), dur(s.host_begin, s.host_end))
                  for s in spans)


def _same(a: list[tuple[Any, ...]], b: list[tuple[Any, ...]]) -> bool:
    """The same spans, durations equal within the .json's microsecond."""
    def close(x: int | None, y: int | None) -> bool:
        return x == y or (x is not None and y is not None and abs(x - y) <= 1000)
    return len(a) == len(b) and all(p[:4] == q[:4] and close(p[4], q[4]) and close(p[5], q[5]) for p, q in zip(a, b))


@pytest.fixture()
def side_by_side(monkeypatch: Any) -> None:
    monkeypatch.setattr(fanout, "MIN_CPUS", 1)
    monkeypatch.setattr(fanout, "MIN_ROWS", 1)


def test_sinks_written_side_by_side_hold_every_span(queue: Any, kernels: Any, tmp_path: Any, side_by_side: None,
                                                  monkeypatch: Any) -> None:
    helped = []
    real = fanout._Helper.start
    monkeypatch.setattr(fanout._Helper, "start", lambda self, sink, job: (helped.append(sink), real(self, sink, job)))
    out = [str(tmp_path / n) for n in ("a.json", "a.pftrace", "a.speedscope.json")]
    _run(queue, kernels, out)
    assert helped, "no batch went to a helper thread"
    json_spans, pf_spans = _content(out[0]), _content(out[1])
    assert _same(json_spans, pf_spans)
    assert sum(s[2] == "kernel" for s in json_spans) == 600 and sum(s[2] == "region" for s in json_spans) == 300
    assert os.path.getsize(out[2]) > 0


def test_a_failing_sink_on_a_helper_is_one_warning_and_the_others_are_whole(
        queue: Any, kernels: Any, tmp_path: Any, side_by_side: None, caplog: Any) -> None:
    class Broken:
        def start(self, ctx: Any) -> None:
            pass

        def write(self, batch: Any) -> None:
            raise OSError("disk on fire")

        def flush(self, meta: Any) -> None:
            pass

        def close(self, meta: Any) -> None:
            pass

    out = str(tmp_path / "a.json")
    with caplog.at_level(logging.WARNING, logger="cltrace"):
        _run(queue, kernels, [out, Broken()])
    assert sum(s[2] in ("kernel", "region") for s in _content(out)) == 900
    assert any("disk on fire" in r.getMessage() for r in caplog.records)
    assert not RECORDER.sinks


def test_stop_closes_the_files_side_by_side_and_a_failing_close_costs_the_others_nothing(
        queue: Any, kernels: Any, tmp_path: Any, side_by_side: None, caplog: Any) -> None:
    import threading

    closed_on: list[str] = []

    class BrokenClose:
        def start(self, ctx: Any) -> None:
            pass

        def write(self, batch: Any) -> None:
            pass

        def flush(self, meta: Any) -> None:
            pass

        def close(self, meta: Any) -> None:
            closed_on.append(threading.current_thread().name)
            raise OSError("lid stuck")

    out = [str(tmp_path / "a.json"), str(tmp_path / "a.pftrace")]
    with caplog.at_level(logging.WARNING, logger="cltrace"):
        _run(queue, kernels, [*out, BrokenClose()])
    assert closed_on == ["cltrace-sink-writer"]  # not the first sink: closed on a helper, beside the others
    assert _same(_content(out[0]), _content(out[1]))
    assert sum(s[2] in ("kernel", "region") for s in _content(out[0])) == 900
    assert sum("lid stuck" in r.getMessage() for r in caplog.records) == 1
    assert not RECORDER.sinks


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_writes_side_by_side_with_its_own_threads(tmp_path: Any) -> None:
    code = textwrap.dedent("""
        import os, sys
        import cltrace
        from cltrace.record import fanout
        from cltrace.read.load import load
        fanout.MIN_CPUS = fanout.MIN_ROWS = 1
        def run(stem):
            cltrace.start(stem + ".json", stem + ".pftrace", quiet=True)
            for _ in range(2000):
                with cltrace.region("r"):
                    pass
            cltrace.stop()
        run("parent")
        pid = os.fork()
        if pid == 0:
            run("child")
            os._exit(0 if len(load("child.json")[0]) == len(load("child.pftrace")[0]) == 2000 else 3)
        _, status = os.waitpid(pid, 0)
        print(os.waitstatus_to_exitcode(status))
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "0", r.stderr
