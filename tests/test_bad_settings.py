"""As a user meets them: bad settings at ``import cltrace`` cost
one output and one warning line, never the program; CLI mistakes are one ``cltrace: error:``
line with exit 2; every run says where its files are; ``devices --json`` is JSON alone."""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import textwrap
from typing import Any

import pytest

from cltrace.cli.commands import build_parser, run_outputs

PROGRAM = """
import cltrace
with cltrace.region("r"):
    pass
print("still running", cltrace.enabled())
"""


def env_of(**kw: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OTEL_", "CLTRACE")) or k == "CLTRACE_CACHE_DIR"}
    env.update(kw)
    return env


def python(tmp_path: Any, code: str, **env: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "prog.py"
    script.write_text(textwrap.dedent(code))
    return subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env_of(**env),
                          capture_output=True, text=True, timeout=120)


def cltrace(tmp_path: Any, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cltrace", *args], cwd=tmp_path, env=env_of(**env),
                          capture_output=True, text=True, timeout=300)


# ---- import-time settings -------------------------------------------------------------

@pytest.mark.parametrize("setting, says", [
    ({"CLTRACE_OUT": "trace.txt"}, ["CLTRACE_OUT", "trace.txt", ".json"]),
    ({"CLTRACE_OUT": "afile/t.json"}, ["CLTRACE_OUT", "'afile' is a file, not a folder"]),
    ({"CLTRACE_OUT": "/proc/cltrace/t.json"}, ["CLTRACE_OUT", "/proc/cltrace/t.json", "choose"]),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "localhost:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "bogus"},
     ["OTEL_EXPORTER_OTLP_PROTOCOL='bogus'", "grpc or http/protobuf"]),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "localhost:4317", "OTEL_EXPORTER_OTLP_TIMEOUT": "abc"},
     ["OTEL_EXPORTER_OTLP_TIMEOUT='abc'", "seconds"]),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://localhost:port"}, ["OTEL_EXPORTER_OTLP_ENDPOINT", "host:port"]),
    ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://[::1"}, ["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "host:port"]),
])
def test_a_bad_setting_at_import_is_one_warning_and_the_program_runs(tmp_path: Any, setting: dict[str, str],
                                                                     says: list[str]) -> None:
    (tmp_path / "afile").write_text("")
    p = python(tmp_path, PROGRAM, CLTRACE="1", **setting)
    assert p.returncode == 0, p.stderr
    assert p.stdout == "still running True\n"
    lines = p.stderr.splitlines()
    assert len(lines) == 1, p.stderr  # one line, no traceback
    assert lines[0].startswith("cltrace: ") and all(s in lines[0] for s in says), lines[0]


def test_a_bad_output_beside_a_good_one_costs_only_itself(tmp_path: Any) -> None:
    p = python(tmp_path, PROGRAM, CLTRACE="1", CLTRACE_OUT=os.pathsep.join(["bad.txt", "good.json"]))
    assert p.returncode == 0 and "CLTRACE_OUT" in p.stderr
    assert "r" in [e["name"] for e in json.loads((tmp_path / "good.json").read_text()) if e.get("ph") == "X"]


# ---- where the files are ------------------------------------------------------------

def test_cltrace_1_without_out_writes_a_default_file_and_says_where(tmp_path: Any) -> None:
    p = python(tmp_path, PROGRAM, CLTRACE="1")
    assert p.returncode == 0, p.stderr
    path = os.path.join("traces", "prog.json")
    assert p.stderr.splitlines() == [f"cltrace: wrote {path}"]
    assert any(e.get("name") == "r" for e in json.loads((tmp_path / path).read_text()))
    quiet = python(tmp_path, PROGRAM, CLTRACE="1", CLTRACE_QUIET="1")
    assert quiet.returncode == 0 and quiet.stderr == ""


def test_trace_says_where_it_wrote_in_one_line_unless_quiet(tmp_path: Any) -> None:
    p = python(tmp_path, """
        import cltrace
        with cltrace.trace("out/a.json", "out/a.pftrace"):
            pass
        with cltrace.trace("out/b.json", quiet=True):
            pass
    """)
    assert p.returncode == 0, p.stderr
    shown = ", ".join(os.path.join("out", n) for n in ("a.json", "a.pftrace"))
    assert p.stderr.splitlines() == [f"cltrace: wrote {shown}"]


def test_run_says_where_honours_out_with_format_and_gives_absolute_file(tmp_path: Any) -> None:
    (tmp_path / "prog.py").write_text("print(__file__)\nraise SystemExit(4)\n")
    p = cltrace(tmp_path, "run", "--out", "o/X.json", "--format", "json,pftrace", "prog.py")
    assert p.returncode == 4, p.stderr
    assert p.stdout == f"{tmp_path / 'prog.py'}\n"  # as `python prog.py` gives it
    shown = ", ".join(os.path.join("o", n) for n in ("X.json", "X.pftrace"))
    assert p.stderr.splitlines() == [f"cltrace: wrote {shown}"]
    assert (tmp_path / "o" / "X.json").stat().st_size and (tmp_path / "o" / "X.pftrace").stat().st_size
    q = cltrace(tmp_path, "run", "--quiet", "prog.py")
    assert q.returncode == 4 and q.stderr == ""
    assert (tmp_path / "traces" / "prog.json").exists() and (tmp_path / "traces" / "prog.pftrace").exists()


def test_run_traceback_paths_are_absolute(tmp_path: Any) -> None:
    (tmp_path / "prog.py").write_text("def f():\n    raise ValueError('boom')\nf()\n")
    p = cltrace(tmp_path, "run", "--quiet", "prog.py")
    direct = subprocess.run([sys.executable, "prog.py"], cwd=tmp_path, capture_output=True, text=True)
    assert p.returncode == direct.returncode == 1
    assert p.stderr == direct.stderr
    assert f'File "{tmp_path / "prog.py"}"' in p.stderr


@pytest.mark.parametrize("outs, formats, expected", [
    (None, None, ["traces/s.json", "traces/s.pftrace"]),
    (None, ("json",), ["traces/s.json"]),
    (["X.json"], None, ["X.json"]),
    (["X.json"], ("json", "pftrace"), ["X.json", "X.pftrace"]),
    (["d/X"], ("pftrace",), ["d/X.pftrace"]),
    (["a.json", "a.pftrace"], ("json", "pftrace"), ["a.json", "a.pftrace"]),
])
def test_run_outputs(outs: Any, formats: Any, expected: list[str]) -> None:
    assert run_outputs("dir/s.py", outs, formats) == [os.path.normpath(e) for e in expected]


# ---- items 9 and 14: the command line ----------------------------------------------------------

@pytest.mark.parametrize("args, env, says", [
    (["run"], {}, "run needs the script to trace"),
    (["run", "--out", "x.txt", "s.py"], {}, "x.txt"),
    (["run", "--out", "afile/x.json", "s.py"], {}, "is a file, not a folder"),
    (["run", "--otlp", "localhost:1", "--otlp-protocol", "bogus", "s.py"], {}, "--otlp-protocol"),
    (["run", "--otlp", "localhost:1", "s.py"], {"OTEL_EXPORTER_OTLP_PROTOCOL": "bogus"}, "OTEL_EXPORTER_OTLP_PROTOCOL"),
    (["run", "s.py"], {"CLTRACE_DEVICE": "no-such-device"}, "CLTRACE_DEVICE='no-such-device'"),
    (["demo"], {"CLTRACE_DEVICE": "no-such-device"}, "CLTRACE_DEVICE='no-such-device'"),
    (["tune", "--size", "16"], {"CLTRACE_DEVICE": "no-such-device"}, "CLTRACE_DEVICE='no-such-device'"),
    (["demo", "--steps", "0"], {}, "--steps"),
    (["demo", "--out", "afile/d"], {}, "afile"),
    (["run", "missing.py"], {}, "missing.py"),
    (["tune", "--size", "16", "--plot", "afile/x.png"], {}, "is a file, not a folder"),
    (["tune", "--size", "16", "--plot", "chart.xyz"], {}, ".png"),
])
def test_cli_mistakes_are_one_error_line_and_exit_2(tmp_path: Any, args: list[str], env: dict[str, str],
                                                    says: str) -> None:
    (tmp_path / "afile").write_text("")
    (tmp_path / "s.py").write_text("print('script ran')\n")
    p = cltrace(tmp_path, *args, **env)
    assert p.returncode == 2, (p.stdout, p.stderr)
    assert "script ran" not in p.stdout
    lines = p.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("cltrace: error: ") and says in lines[0], p.stderr


def test_tune_plot_makes_its_folder_before_the_sweep(tmp_path: Any) -> None:
    p = cltrace(tmp_path, "tune", "--size", "16", "--workgroups", "auto", "--tiles", "1x1", "--unroll", "1",
                "-n", "1", "--no-persist", "--plot", "new/dir/x.png", CLTRACE_CACHE_DIR=str(tmp_path / "cache"))
    assert p.returncode == 0, p.stderr
    assert (tmp_path / "new" / "dir" / "x.png").stat().st_size > 0


def test_devices_json_prints_only_json(tmp_path: Any) -> None:
    p = cltrace(tmp_path, "devices", "--json", "--samples", "8")
    assert p.returncode == 0, p.stderr
    rows = json.loads(p.stdout)
    assert rows and all("name" in r and "profiling" in r for r in rows)


def _actions(parser: argparse.ArgumentParser, prog: str) -> list[tuple[str, argparse.Action]]:
    out = []
    for a in parser._actions:
        out.append((prog, a))
        if isinstance(a, argparse._SubParsersAction):
            for name, sub in a.choices.items():
                out += _actions(sub, f"{prog} {name}")
    return out


def test_every_cli_argument_has_help() -> None:
    missing = [f"{prog}: {a.option_strings or a.dest}" for prog, a in _actions(build_parser(), "cltrace")
               if not a.help or a.help == argparse.SUPPRESS]
    assert not missing, missing
