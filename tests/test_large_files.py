"""``summary``, ``analyze`` and ``diff`` of a file over ``CLTRACE_LARGE_FILE_MB`` go through a temporary
embedded store (``cli/large.py``): real chDB, real trace files (a run recorded here on PoCL, and
``big_trace.write_big_trace``'s steps written by the real sinks), the store path forced by
``--via-store`` or a threshold of 0. The answers name the file's kernels and regions with the counts of
the in-memory reading; ``diff`` is the gate of ``diff --store``; bad settings and what the store cannot
honour are one line, exit 2; the temporary folder is gone afterwards, also after an error or Ctrl-C.
"""
from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

import cltrace
from cltrace.analyzers.analysis import analyze
from cltrace.analyzers.summary import summarize
from cltrace.cli import main
from cltrace.store.questions.regions import REGION_CATS
from big_trace import write_big_trace

STEPS = 4


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: Any, queue: Any, kernels: Any) -> dict[str, Path]:
    """A real run on PoCL, nested regions and two kernels, as .pftrace and .json."""
    d = tmp_path_factory.mktemp("recorded")
    out = {"pftrace": d / "run.pftrace", "json": d / "run.json"}
    with cltrace.trace(str(out["pftrace"]), str(out["json"]), quiet=True):
        for _ in range(STEPS):
            with cltrace.region("step", queue):
                with cltrace.region("forward", queue):
                    kernels.launch_add(queue)
                    kernels.launch_spin(queue)
                with cltrace.region("backward", queue):
                    kernels.launch_spin(queue, iters=400)
            queue.finish()
    return out


@pytest.fixture(scope="module")
def steps(tmp_path_factory: Any) -> dict[str, Path]:
    """Synthetic steps written by the real sink: a baseline, the same bytes under another name, and a
    variant whose kernels take 1.5 times as long."""
    d = tmp_path_factory.mktemp("steps")
    out = {"base": d / "base.pftrace", "copy": d / "copy.pftrace", "slow": d / "slow.pftrace"}
    write_big_trace(1200, str(out["base"]))
    shutil.copyfile(out["base"], out["copy"])
    write_big_trace(1200, str(out["slow"]), slow=True)
    return out


@pytest.fixture()
def tmpdir_env(tmp_path: Path, monkeypatch: Any) -> Path:
    """TMPDIR of its own, to see what the store path leaves there; no threshold from outside."""
    d = tmp_path / "tmp"
    d.mkdir()
    monkeypatch.setenv("TMPDIR", str(d))
    monkeypatch.delenv("CLTRACE_LARGE_FILE_MB", raising=False)
    return d


def one_line(err: str) -> str:
    assert err.count("\n") == 1, err
    return err.strip()


def test_analyze_through_the_store_gives_the_files_kernels_and_regions(recorded: dict[str, Path], tmpdir_env: Path,
                                                                          capsys: Any) -> None:
    path = str(recorded["pftrace"])
    assert main(["analyze", path, "--via-store", "--json"]) == 0
    out, err = capsys.readouterr()
    note = one_line(err)
    assert note.startswith(f"cltrace: analysed {path} through a temporary embedded ClickHouse store")
    assert "loaded in" in note and note.endswith("--via-store")
    doc = json.loads(out)
    assert doc["schema"] == "cltrace.store-analysis/1" and len(doc["ranks"]) == 1
    whole = analyze(path, window=None)  # the store answers over the whole run
    assert {(k["name"], k["count"], k["total_ns"]) for k in doc["kernels"]} == \
        {(k["name"], k["count"], k["total_ns"]) for k in whole.kernels}
    assert {k["name"] for k in doc["kernels"]} == {"add", "spin"}
    regions = {r["path"]: r["count"] for r in doc["regions"]}
    assert regions == {"step": STEPS, "step/forward": STEPS, "step/backward": STEPS}

    assert main(["analyze", path, "--via-store"]) == 0
    text = capsys.readouterr().out
    assert text.startswith(f"cltrace analyze: {path} (the whole run): 1 rank(s)")
    assert all(name in text for name in ("spin", "add", "step/forward", "step/backward"))
    assert list(tmpdir_env.iterdir()) == []


@pytest.mark.parametrize("fmt", ["json", "pftrace"])
def test_summary_over_the_threshold_counts_as_the_file_summary(recorded: dict[str, Path], tmpdir_env: Path,
                                                               monkeypatch: Any, capsys: Any, fmt: str) -> None:
    path = str(recorded[fmt])
    monkeypatch.setenv("CLTRACE_LARGE_FILE_MB", "0")
    assert main(["summary", path, "--json"]) == 0
    out, err = capsys.readouterr()
    note = one_line(err)
    assert "over the 0 MB of CLTRACE_LARGE_FILE_MB" in note and "--in-memory" in note
    doc = json.loads(out)
    mem = summarize(path)[0].as_dict()
    assert {r["path"]: (r["count"], r["total_ns"]) for r in doc["regions"]} == \
        {p: (r["host"]["count"], r["host"]["total_ns"]) for p, r in mem.items() if r["cat"] in REGION_CATS}
    launches: dict[str, list[int]] = {}
    for r in mem.values():
        if r["cat"] == "kernel":
            c = launches.setdefault(r["name"], [0, 0])
            c[0] += r["device"]["count"]
            c[1] += r["device"]["total_ns"]
    assert {k["name"]: [k["count"], k["total_ns"]] for k in doc["kernels"]} == launches

    assert main(["summary", path, "--top", "1", "--sort", "count"]) == 0
    text = capsys.readouterr().out.splitlines()
    assert text[0] == f"cltrace summary: {path} (the whole run: host time per region, device time per kernel)"
    rows = [line.split()[0] for line in text if line.startswith("  ")]
    assert len(rows) == 2 and rows[1] == "spin"  # one region, one kernel: spin launches twice a step
    assert list(tmpdir_env.iterdir()) == []


def test_the_threshold_and_in_memory(recorded: dict[str, Path], tmpdir_env: Path, monkeypatch: Any,
                                     capsys: Any) -> None:
    path = recorded["pftrace"]
    mb = path.stat().st_size / (1 << 20)
    monkeypatch.setenv("CLTRACE_LARGE_FILE_MB", f"{mb * 1.01}")  # the file is under it: read whole
    assert main(["summary", str(path)]) == 0
    out, err = capsys.readouterr()
    assert err == "" and "region / kernel" in out
    monkeypatch.setenv("CLTRACE_LARGE_FILE_MB", f"{mb * 0.99}")
    assert main(["summary", str(path)]) == 0
    assert "through a temporary embedded ClickHouse store" in capsys.readouterr().err
    assert main(["summary", str(path), "--in-memory"]) == 0
    out, err = capsys.readouterr()
    assert err == "" and "region / kernel" in out
    with pytest.raises(SystemExit) as e:
        main(["analyze", str(path), "--via-store", "--in-memory"])
    assert e.value.code == 2
    assert "not allowed with" in one_line(capsys.readouterr().err)


def test_diff_through_the_store_is_the_stores_gate(steps: dict[str, Path], tmpdir_env: Path, tmp_path: Path,
                                                   capsys: Any) -> None:
    base, copy, slow = (str(steps[k]) for k in ("base", "copy", "slow"))
    for b in (base, copy):  # against itself: the same path, or the same bytes under another name
        assert main(["diff", base, b, "--via-store", "--fail-above", "10"]) == 0
        out, err = capsys.readouterr()
        assert "0 regression(s) above 10%" in out and f"B = {b}" in out
        assert one_line(err).startswith(f"cltrace: compared {base} and {b} through a temporary embedded")
    assert main(["diff", base, slow, "--via-store", "--fail-above", "10", "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert (doc["a"], doc["b"]) == (base, slow) and "saxpy" in doc["regressions"]
    assert main(["diff", base, slow, "--via-store"]) == 0  # without --fail-above nothing fails
    capsys.readouterr()

    # what diff --store gives on the same two files loaded as runs a and b, labels aside
    folder = str(tmp_path / "store")
    assert main(["load", base, "--store", folder, "--run-id", "a"]) == 0
    assert main(["load", slow, "--store", folder, "--run-id", "b"]) == 0
    capsys.readouterr()
    assert main(["diff", "a", "b", "--store", folder, "--fail-above", "10", "--json"]) == 1
    stored = json.loads(capsys.readouterr().out)
    assert stored["rows"] == doc["rows"] and stored["regressions"] == doc["regressions"]
    assert list(tmpdir_env.iterdir()) == []


@pytest.mark.parametrize("value", ["abc", "-1", "nan", "inf", "1e999"])
@pytest.mark.parametrize("command", ["summary", "analyze", "diff"])
def test_a_bad_threshold_is_one_line(steps: dict[str, Path], tmpdir_env: Path, monkeypatch: Any, capsys: Any,
                                     value: str, command: str) -> None:
    monkeypatch.setenv("CLTRACE_LARGE_FILE_MB", value)
    files = [str(steps["base"])] * (2 if command == "diff" else 1)
    assert main([command, *files]) == 2
    out, err = capsys.readouterr()
    assert out == "" and one_line(err).startswith(f"cltrace: error: CLTRACE_LARGE_FILE_MB={value!r} is not a number")
    assert main([command, *files, "--in-memory"]) == 0  # not read where the flag decides
    capsys.readouterr()


@pytest.mark.parametrize("argv, named", [
    (["analyze", "--plot", "x.png"], "--plot"), (["analyze", "--steps", "2:3"], "--steps"),
    (["analyze", "--by-shape"], "--by-shape"), (["analyze", "--by", "callsite"], "--by"),
    (["analyze", "--sort", "count"], "--sort count"), (["analyze", "--steady"], "--steady"),
    (["summary", "--region", "step"], "--region"), (["summary", "--sort", "p99"], "--sort p99"),
    (["diff", "--from", "1"], "--from"),
])
def test_what_the_store_cannot_honour_is_one_line(steps: dict[str, Path], tmpdir_env: Path, capsys: Any,
                                                  argv: list[str], named: str) -> None:
    files = [str(steps["base"])] * (2 if argv[0] == "diff" else 1)
    assert main([argv[0], *files, *argv[1:], "--via-store"]) == 2
    err = one_line(capsys.readouterr().err)
    assert err.startswith(f"cltrace: error: {named}: not available for a file read through the embedded store")
    assert err.endswith("pass --in-memory to read the file whole")
    assert list(tmpdir_env.iterdir()) == []


def test_the_temporary_store_goes_after_an_error_or_ctrl_c(steps: dict[str, Path], tmpdir_env: Path,
                                                           monkeypatch: Any, capsys: Any) -> None:
    bad = tmpdir_env.parent / "bad.pftrace"
    bad.write_bytes(b"\x00\x01garbage\xff" * 10)
    assert main(["analyze", str(bad), "--via-store"]) == 2
    assert one_line(capsys.readouterr().err).startswith("cltrace: error: ")
    assert list(tmpdir_env.iterdir()) == []

    from cltrace.store import Store

    seen: list[list[str]] = []

    def interrupted(self: Store, *a: Any, **k: Any) -> Any:
        seen.append([p.name for p in tmpdir_env.iterdir()])  # the store is there while it answers
        raise KeyboardInterrupt

    monkeypatch.setattr(Store, "analyze", interrupted)
    assert main(["analyze", str(steps["base"]), "--via-store"]) == 130
    assert len(seen) == 1 and len(seen[0]) == 1 and seen[0][0].startswith("cltrace-store-")
    assert list(tmpdir_env.iterdir()) == []


def test_without_the_clickhouse_extra_a_large_file_says_how(steps: dict[str, Path], tmpdir_env: Path,
                                                            monkeypatch: Any, capsys: Any) -> None:
    monkeypatch.setitem(sys.modules, "chdb", None)  # import chdb fails, as where it is not installed
    monkeypatch.setenv("CLTRACE_LARGE_FILE_MB", "0")
    assert main(["summary", str(steps["base"])]) == 2
    out, err = capsys.readouterr()
    err = one_line(err)
    assert out == "" and "pip install 'cltrace[clickhouse]'" in err and "--in-memory" in err
    assert list(tmpdir_env.iterdir()) == []
    assert main(["summary", str(steps["base"]), "--in-memory"]) == 0
