"""What the command line says about input it cannot use: nonsense numbers, an unwritable ``--plot``
path, a file that is not cltrace's. Each is one line on stderr naming the argument or the file
(exit 2 for a mistake), never a traceback or a silent empty report."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import cltrace


def cli(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cltrace", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120, env=dict(os.environ, COLUMNS="200"))


def one_error(p: subprocess.CompletedProcess[str], says: str) -> None:
    assert p.returncode == 2, (p.stdout, p.stderr)
    lines = p.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("cltrace: error: ") and says in lines[0], p.stderr


@pytest.fixture(scope="module")
def host_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A trace of two host regions (no device needed)."""
    path = tmp_path_factory.mktemp("host") / "host.json"
    with cltrace.trace(path, quiet=True):
        for _ in range(3):
            with cltrace.region("outer"):
                with cltrace.region("inner"):
                    pass
    return path


@pytest.mark.parametrize("args, says", [
    (["analyze", "{trace}", "--top", "-1"], "--top"),
    (["analyze", "{trace}", "--top", "many"], "--top"),
    (["diff", "{trace}", "{trace}", "--top", "-3"], "--top"),
    (["diff", "{trace}", "{trace}", "--fail-above", "-5"], "--fail-above"),
    (["diff", "{trace}", "{trace}", "--fail-above", "nan"], "--fail-above"),
    (["summary", "{trace}", "--top", "-1"], "--top"),
    (["tune", "--top", "-1"], "--top"),
    (["tune", "-n", "0"], "--runs"),
    (["tune", "--warmup", "-1"], "--warmup"),
    (["load", "{trace}", "--store", "s", "--jobs", "0"], "--jobs"),
    (["analyze", "--store", "s", "--threshold", "-1"], "--threshold"),
])
def test_nonsense_numbers_are_one_usage_line(tmp_path: Path, host_trace: Path, args: list[str], says: str) -> None:
    p = cli(tmp_path, *(a.format(trace=host_trace) for a in args))
    one_error(p, says)
    assert "expected" in p.stderr and p.stdout == ""


@pytest.mark.parametrize("where", ["/proc/x.png", "afile/x.png"])
def test_analyze_checks_its_plot_path_before_the_report(tmp_path: Path, host_trace: Path, where: str) -> None:
    (tmp_path / "afile").write_text("")
    p = cli(tmp_path, "analyze", str(host_trace), "--plot", where)
    one_error(p, f"--plot {where}")
    assert p.stdout == ""  # no report printed before the error


def test_analyze_plot_into_a_new_folder_is_written(tmp_path: Path, host_trace: Path) -> None:
    p = cli(tmp_path, "analyze", str(host_trace), "--plot", "new/u.png")
    assert p.returncode == 0, p.stderr
    assert (tmp_path / "new" / "u.png").read_bytes()[:4] == b"\x89PNG"


def test_a_chrome_trace_of_another_tool_is_read_with_one_warning(tmp_path: Path) -> None:
    foreign = tmp_path / "other.json"
    foreign.write_text(json.dumps({"traceEvents": [
        {"name": "step", "ph": "X", "ts": 1, "dur": 5, "pid": 1, "tid": 1},
        {"name": "thread_name", "ph": "M", "pid": 1, "tid": 1, "args": {"name": "main"}}]}))
    for args in (["summary", str(foreign)], ["analyze", str(foreign)], ["diff", str(foreign), str(foreign)]):
        p = cli(tmp_path, *args)
        assert p.returncode == 0, p.stderr
        warnings = [line for line in p.stderr.splitlines() if line.strip()]
        assert len(warnings) == 1 + (args[0] == "diff"), p.stderr  # once per file read
        assert warnings[0].startswith(f"cltrace: warning: {foreign}: not written by cltrace"), p.stderr
        assert ".json/.pftrace" in warnings[0]


def test_an_empty_trace_of_cltrace_reads_without_a_warning(tmp_path: Path) -> None:
    path = tmp_path / "quiet.json"
    with cltrace.trace(path, quiet=True):
        pass
    p = cli(tmp_path, "summary", str(path))
    assert p.returncode == 0 and p.stderr == "", p.stderr


def test_a_speedscope_profile_is_named_for_what_it_is(tmp_path: Path) -> None:
    path = tmp_path / "run.speedscope.json"
    with cltrace.trace(path, quiet=True):
        with cltrace.region("r"):
            pass
    for args in (["summary", str(path)], ["diff", str(path), str(path)], ["analyze", str(path)]):
        p = cli(tmp_path, *args)
        one_error(p, f"{path}: a speedscope profile")
        assert "speedscope.app" in p.stderr and ".json/.pftrace" in p.stderr
