"""Trace files never destroy earlier output: each is written as ``<name>.partial`` and renamed to its
name only once closed; a traced block that raises, a failed or interrupted demo and a killed process
leave the earlier file byte for byte, and the ``.partial`` file readable."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import cltrace
from cltrace import read as tracefile

ROOT = Path(__file__).resolve().parents[1]


def test_a_closed_trace_replaces_the_earlier_file_and_leaves_no_partial(tmp_path: Path, queue: Any,
                                                                         kernels: Any) -> None:
    out = tmp_path / "t.json"
    out.write_text("earlier")
    with cltrace.trace(out, tmp_path / "t.pftrace", quiet=True):
        kernels.launch_add(queue)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.json", "t.pftrace"]
    assert [s.name for s in tracefile.load(out)[0]] == ["add"]


@pytest.mark.parametrize("suffix", [".json", ".pftrace"])
def test_a_traced_block_that_raises_leaves_the_earlier_file_untouched(tmp_path: Path, queue: Any, kernels: Any,
                                                                      capfd: Any, suffix: str) -> None:
    out = tmp_path / f"t{suffix}"
    with cltrace.trace(out, quiet=True):
        with cltrace.region("first"):
            kernels.launch_add(queue)
    earlier = out.read_bytes()
    capfd.readouterr()
    with pytest.raises(RuntimeError):
        with cltrace.trace(out):
            with cltrace.region("second"):
                kernels.launch_add(queue)
                raise RuntimeError("fails mid-way")
    assert out.read_bytes() == earlier
    spans, meta = tracefile.load(f"{out}.partial")  # closed: complete, under the name that says so
    assert "second" in {s.name for s in spans} and "recorded_spans" in meta
    err = capfd.readouterr().err.splitlines()
    assert err == [f"cltrace: the traced work failed: kept {out}.partial; {out} left as before"]


def test_a_relative_path_is_put_in_place_where_it_was_opened(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             queue: Any, kernels: Any) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    monkeypatch.chdir(tmp_path / "a")
    cltrace.start("t.json", quiet=True)
    kernels.launch_add(queue)
    os.chdir(tmp_path / "b")  # the program moves on before the trace is closed
    cltrace.stop()
    assert os.listdir(tmp_path / "a") == ["t.json"] and os.listdir(tmp_path / "b") == []


def test_stop_failed_keeps_partial_files(tmp_path: Path, queue: Any, kernels: Any) -> None:
    out = tmp_path / "t.json"
    cltrace.start(out, quiet=True)
    kernels.launch_add(queue)
    cltrace.stop(failed=True)
    assert not out.exists() and [s.name for s in tracefile.load(f"{out}.partial")[0]] == ["add"]


def test_an_interrupted_demo_leaves_the_committed_traces_byte_identical(tmp_path: Path) -> None:
    traces = tmp_path / "traces"
    traces.mkdir()
    for name in ("demo.json", "demo.pftrace"):
        shutil.copy(ROOT / "traces" / name, traces / name)
    before = {p.name: p.read_bytes() for p in traces.iterdir()}
    env = {k: v for k, v in os.environ.items() if k not in ("CLTRACE", "CLTRACE_OUT")}
    env["CLTRACE_CACHE_DIR"] = str(tmp_path / "cache")
    p = subprocess.Popen([sys.executable, "-m", "cltrace", "demo", "--steps", "100000"], cwd=tmp_path, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    partial = traces / "demo.json.partial"
    deadline = time.monotonic() + 120
    while (not partial.exists() or partial.stat().st_size < 50_000) and time.monotonic() < deadline \
            and p.poll() is None:
        time.sleep(0.05)
    p.send_signal(signal.SIGINT)  # Ctrl-C, mid-way through the training loop
    _, err = p.communicate(timeout=120)
    assert p.returncode == 130, err
    assert {q.name: q.read_bytes() for q in traces.iterdir() if not q.name.endswith(".partial")} == before
    spans, _ = tracefile.load(partial)
    assert any(s.name == "forward" for s in spans)


def test_demo_outputs_of_a_run_are_ignored_by_git() -> None:
    """After a demo, ``git status`` shows no new file: the per-cycle files and ``.partial`` files are ignored,
    the committed traces are not."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    paths = ["traces/demo.cycle1.json", "traces/demo.cycle2.pftrace", "traces/demo.json.partial", "traces/demo.json"]
    p = subprocess.run(["git", "check-ignore", "--no-index", *paths], cwd=ROOT, capture_output=True, text=True)
    assert p.stdout.split() == paths[:3]


WRITER = """
import os, sys, time
import cltrace
me, ready = sys.argv[1], sys.argv[2]
open(os.path.join(ready, me), "w").close()
deadline = time.monotonic() + 120
while len(os.listdir(ready)) < int(sys.argv[3]) and time.monotonic() < deadline:  # all have opened their files
    time.sleep(0.01)
for _ in range(2000):
    with cltrace.region("writer " + me):
        pass
"""


def test_concurrent_runs_given_one_path_each_write_whole_files_of_their_own(tmp_path: Path) -> None:
    """Four ``cltrace run --out s.json --format json,pftrace`` at once: one writes s.json and s.pftrace, each
    other takes a numbered pair (s.1.json, s.1.pftrace, ...) and says so in one line; every file is whole and
    holds one process's spans, the .json and the .pftrace of one name the same process's."""
    (tmp_path / "w.py").write_text(WRITER)
    (tmp_path / "ready").mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CLTRACE", "OTEL_"))}
    n = 4
    procs = [subprocess.Popen([sys.executable, "-m", "cltrace", "run", "--out", "s.json", "--format", "json,pftrace",
                               "w.py", str(i), "ready", str(n)], cwd=tmp_path, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(n)]
    errs = [p.communicate(timeout=300)[1] for p in procs]
    assert [p.returncode for p in procs] == [0] * n, errs
    names = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("s."))
    assert names == sorted(f"s{x}.{fmt}" for x in ["", ".1", ".2", ".3"] for fmt in ("json", "pftrace")), names
    writers = {}
    for stem in ("s", "s.1", "s.2", "s.3"):
        got = []
        for fmt in ("json", "pftrace"):
            spans, _ = tracefile.load(tmp_path / f"{stem}.{fmt}")
            regions = [s.name for s in spans if s.name.startswith("writer ")]
            assert len(regions) == 2000 and len(set(regions)) == 1, (stem, fmt, set(regions))
            got.append(regions[0])
        assert got[0] == got[1], stem
        writers[stem] = got[0]
    assert sorted(writers.values()) == [f"writer {i}" for i in range(n)]
    moved = [ln for e in errs for ln in e.splitlines() if "another process" in ln]
    assert len(moved) == n - 1, errs
    for stem, who in writers.items():
        err = errs[int(who.split()[1])]
        if stem == "s":
            assert "another process" not in err
        else:
            assert f"cltrace: another process is writing s.json, s.pftrace: this one writes {stem}.json, " \
                   f"{stem}.pftrace" in err, err


def test_a_path_held_in_this_process_is_not_shared_and_a_leftover_partial_is_taken_over(tmp_path: Path,
                                                                                       capfd: Any) -> None:
    """A ``.partial`` no live process holds (one a killed run left) is written over as before; one this
    process still writes sends a second session output to a numbered name."""
    out = tmp_path / "t.json"
    Path(f"{out}.partial").write_text("left by a killed run")
    cltrace.start(out, quiet=True)
    cltrace.start(out, quiet=True)
    with cltrace.region("r"):
        pass
    cltrace.stop()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.1.json", "t.json"]
    for name in ("t.json", "t.1.json"):
        assert [s.name for s in tracefile.load(tmp_path / name)[0]] == ["r"]
    assert capfd.readouterr().err.splitlines() == [f"cltrace: another process is writing {out}: this one writes "
                                                   f"{tmp_path / 't.1.json'}"]


def test_a_group_with_one_path_held_moves_whole_and_leaves_no_partial_behind(tmp_path: Path, capfd: Any) -> None:
    """One of a start's paths held (s.pftrace), the other free (s.json): both go to s.1.*, and the s.json.partial
    tried on the way is removed."""
    cltrace.start(tmp_path / "s.pftrace", quiet=True)
    cltrace.start(tmp_path / "s.json", tmp_path / "s.pftrace", quiet=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.1.json.partial", "s.1.pftrace.partial",
                                                          "s.pftrace.partial"]
    cltrace.stop()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.1.json", "s.1.pftrace", "s.pftrace"]
    assert "this one writes" in capfd.readouterr().err


def test_a_forked_child_running_on_does_not_keep_the_parents_path_held(tmp_path: Path, capfd: Any) -> None:
    """The child's copy of the parent's hold is let go at the fork: once the parent has let go (here of a
    file left .partial), the path is free again while the child still runs."""
    out = tmp_path / "t.json"
    cltrace.start(out, quiet=True)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child, its fork hooks done: say so, outlive the parent's session, leave without cleaning up
        os.write(w, b"x")
        time.sleep(3)
        os._exit(0)
    os.close(w)
    try:
        assert os.read(r, 1) == b"x"
        os.close(r)
        cltrace.stop(failed=True)
        cltrace.start(out, quiet=True)
        cltrace.stop()
        assert os.waitpid(pid, os.WNOHANG) == (0, 0), "the child should still be running"
    finally:
        os.waitpid(pid, 0)
    assert "t.json" in os.listdir(tmp_path) and "t.1.json" not in os.listdir(tmp_path)
    assert "another process" not in capfd.readouterr().err
