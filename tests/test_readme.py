"""The README's Python examples run as written (in a scratch directory and cache)."""
from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

README = pathlib.Path(__file__).resolve().parent.parent / "README.md"


def test_readme_python_examples_run(tmp_path):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    assert len(blocks) >= 6
    # An OTLP example that names an endpoint needs a collector (tests/test_otlp.py covers it with a real one).
    code = "\n".join(b for b in blocks if 'OtlpSink("' not in b)
    env = dict(os.environ, CLTRACE_CACHE_DIR=str(tmp_path / "cache"))
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "cltrace report" in proc.stdout
    assert "each level by self;" in proc.stdout  # report(sort_by="self", row_limit=2)
    assert proc.stdout.count("infer under request, same trace: True") == 2
    assert proc.stdout.count("decode under infer, same trace: True") == 2
    assert proc.stdout.count("scale under infer, same trace: True") == 2
    assert (tmp_path / "traces" / "example.json").exists()
    assert "('cltrace.run', 1)" in proc.stdout  # the store example: the file's spans in ClickHouse, its root once
    assert (tmp_path / "traces" / "store").is_dir()
    assert (tmp_path / "traces" / "instrumented.json").exists()
    assert "kernel totals: ['scale']" in proc.stdout  # a sink of one's own: start(ctx), write(batch), close


def _setup_blocks() -> list[str]:
    """The README's set-up and test commands, read as ``.ci/run`` reads them."""
    ci = (README.parent / ".ci" / "run").read_text()
    reader = re.search(r"<<'PY'\n(.*?)\nPY\n", ci, re.S).group(1)
    out = []
    for i in (0, 1):
        proc = subprocess.run([sys.executable, "-", str(i)], input=reader, cwd=README.parent, capture_output=True,
                              text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        out.append(proc.stdout.strip())
    return out


def test_ci_runs_the_readmes_setup_then_its_test_command():
    setup, tests = _setup_blocks()
    assert setup.startswith("sh .ci/install-pocl.sh && python3 -m venv .venv && . .venv/bin/activate && ")
    assert setup.endswith("pip install -e '.[test]' && cltrace demo")
    # every test on both paths: the feature tests, then the timing ones (each path once more for what failed)
    assert tests == ('python -m pytest -q -m "not timing" && CLTRACE_NATIVE=0 python -m pytest -q -m "not timing" && '
                     '(python -m pytest -q -m timing || python -m pytest -q -m timing --lf) && '
                     '(CLTRACE_NATIVE=0 python -m pytest -q -m timing || CLTRACE_NATIVE=0 python -m pytest -q -m timing --lf)')
    script = README.parent / ".ci" / "install-pocl.sh"
    assert subprocess.run(["sh", "-n", str(script)]).returncode == 0


def test_install_pocl_changes_nothing_where_pocl_is_registered():
    if not os.path.exists("/etc/OpenCL/vendors/pocl.icd"):
        import pytest

        pytest.skip("no system PoCL registered here: the script would install it")
    proc = subprocess.run(["sh", str(README.parent / ".ci" / "install-pocl.sh")], capture_output=True, text=True,
                          timeout=60)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "", "")
