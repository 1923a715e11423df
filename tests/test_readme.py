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
    assert proc.stdout.count("infer under request, same trace: True") == 2
    assert proc.stdout.count("decode under infer, same trace: True") == 2
    assert proc.stdout.count("scale under infer, same trace: True") == 2
    assert (tmp_path / "traces" / "example.json").exists()
    assert "('cltrace.run', 1)" in proc.stdout  # the store example: the file's spans in ClickHouse, its root once
    assert (tmp_path / "traces" / "store").is_dir()
    assert (tmp_path / "traces" / "instrumented.json").exists()
