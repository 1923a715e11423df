"""``CLTRACE=1 python train.py``: an unmodified pyopencl program traced from its environment, as
``cltrace run`` traces it, through the start-up hook installed with the package (``cltrace.pth`` and
``_cltrace_hook``); one line when nothing was recorded; a file named twice written once. Real
interpreters started as users start them, real PoCL, the files read back by cltrace's readers."""
from __future__ import annotations

import os
import site
import subprocess
import sys
import textwrap
from typing import Any

from cltrace.read import load

TRAIN = '''
import numpy as np
import pyopencl as cl

ctx = cl.create_some_context(interactive=False)
q = cl.CommandQueue(ctx)  # no profiling asked for: instrumentation adds it
knl = cl.Kernel(cl.Program(ctx, "__kernel void twice(__global float *a) { a[get_global_id(0)] *= 2.0f; }").build(),
                "twice")
a = cl.Buffer(ctx, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR, hostbuf=np.ones(1024, np.float32))
for _ in range(3):
    knl(q, (1024,), None, a)
q.finish()
'''


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CLTRACE", "OTEL_"))}
    env.update(extra)
    return env


def _python(tmp_path: Any, name: str, text: str, *args: str, **env: str) -> subprocess.CompletedProcess:
    (tmp_path / name).write_text(textwrap.dedent(text))
    return subprocess.run([sys.executable, name, *args], cwd=str(tmp_path), env=_env(**env), capture_output=True,
                          text=True, timeout=180)


def _lines(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if ln.startswith("cltrace")]


def test_the_hook_is_installed_beside_the_package() -> None:
    found = [d for d in site.getsitepackages() if os.path.isfile(os.path.join(d, "cltrace.pth"))]
    assert found, f"cltrace.pth is in none of {site.getsitepackages()}: reinstall cltrace"
    line = open(os.path.join(found[0], "cltrace.pth"), encoding="utf-8").read().strip()
    assert line.startswith("import os; os.environ.get(\"CLTRACE\", \"\")"), line  # the variable before any import


def test_an_unmodified_program_is_traced(tmp_path: Any) -> None:
    p = _python(tmp_path, "train.py", TRAIN, CLTRACE="1")
    assert p.returncode == 0, p.stderr
    assert _lines(p.stderr) == [f"cltrace: wrote {os.path.join('traces', 'train.json')}"], p.stderr
    spans, _ = load(str(tmp_path / "traces" / "train.json"))
    kernels = [s for s in spans if s.cat == "kernel"]
    assert [s.name for s in kernels] == ["twice"] * 3
    assert all(s.source == "device" for s in kernels)  # the queue was given profiling, as cltrace run gives it
    assert "build twice" in [s.name for s in spans]


def test_the_hook_costs_nothing_without_cltrace_and_loads_nothing_before_pyopencl(tmp_path: Any) -> None:
    probe = ("import sys; print(sorted(m for m in ('_cltrace_hook', 'cltrace', 'pyopencl', 'numpy') "
             "if m in sys.modules))")
    def run(**env: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", probe], cwd=str(tmp_path), env=_env(**env), capture_output=True,
                              text=True, timeout=60)

    off = run()
    assert off.stdout.strip() == "[]", off.stderr
    on = run(CLTRACE="1")
    assert on.stdout.strip() == "['_cltrace_hook']", on.stderr  # a program without OpenCL pays nothing more
    assert on.stderr == "" and not (tmp_path / "traces").exists()
    zero = run(CLTRACE="0")
    assert zero.stdout.strip() == "[]", zero.stderr


def test_a_run_that_records_nothing_says_so_in_one_line(tmp_path: Any) -> None:
    p = _python(tmp_path, "idle.py", """
        import cltrace
        import pyopencl as cl
        print(len(cl.get_platforms()) > 0)
    """, CLTRACE="1")
    assert p.returncode == 0 and p.stdout.strip() == "True", p.stderr
    lines = _lines(p.stderr)
    assert lines[0] == f"cltrace: wrote {os.path.join('traces', 'idle.json')}", p.stderr
    assert len(lines) == 2 and lines[1].startswith("cltrace: CLTRACE=1 recorded nothing: "), p.stderr
    assert "pyopencl" in lines[1] and "cltrace region" in lines[1]


def test_the_programs_own_trace_of_the_same_file_is_written_once(tmp_path: Any) -> None:
    p = _python(tmp_path, "own.py", f"""
        import cltrace
        with cltrace.trace("traces/own.json"):
            with cltrace.region("step"):
                exec({TRAIN!r})
    """, CLTRACE="1")
    assert p.returncode == 0, p.stderr
    assert _lines(p.stderr) == [f"cltrace: wrote {os.path.join('traces', 'own.json')}"], p.stderr
    spans, _ = load(str(tmp_path / "traces" / "own.json"))
    assert [s.name for s in spans if s.cat == "kernel"] == ["twice"] * 3
    assert [s.name for s in spans if s.cat == "region"] == ["step"]


def test_children_trace_into_the_parents_file_as_cltrace_run_does(tmp_path: Any) -> None:
    (tmp_path / "train.py").write_text(textwrap.dedent(TRAIN))
    p = _python(tmp_path, "parent.py", TRAIN + """
import subprocess, sys
subprocess.run([sys.executable, "train.py"], check=True)
""", CLTRACE="1")
    assert p.returncode == 0, p.stderr
    lines = _lines(p.stderr)
    assert lines[0] == f"cltrace: wrote {os.path.join('traces', 'parent.json')}", p.stderr
    assert len(lines) == 2 and lines[1].startswith("cltrace: merged children "), p.stderr
    spans, meta = load(str(tmp_path / "traces" / "parent.json"))
    assert [s.name for s in spans if s.cat == "kernel"] == ["twice"] * 6
    assert len(meta["merged"]["processes"]) == 2, meta["merged"]
    assert not (tmp_path / "traces" / "train.json").exists()  # the child wrote no trace of its own name
