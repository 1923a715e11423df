"""``cltrace run`` (runner.run_script): an unmodified pyopencl script runs as ``python script.py``
would, instrumented and traced; exit statuses, tracebacks and the trace file survive every ending."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from typing import Any

import pyopencl as cl
import pytest

import cltrace
from cltrace import read as tracefile
from cltrace.capture.instrument import instrumented
from cltrace.cli.run import run_script

HELPER = '''
SRC = "__kernel void twice(__global float *a) { a[get_global_id(0)] *= 2.0f; }"
'''

SCRIPT = '''
import sys
import numpy as np
import pyopencl as cl
import pyopencl.array as cla
import helper  # found next to the script: sys.path[0] is its directory

assert __name__ == "__main__"
N = 4096
ctx = cl.create_some_context(interactive=False)
queue = cl.CommandQueue(ctx)  # no profiling asked for: instrumentation adds it
x = cla.to_device(queue, np.arange(N, dtype=np.float32))
y = x * 3
prg = cl.Program(ctx, helper.SRC).build()
knl = prg.twice
knl(queue, (N,), None, y.data)
out = y.get()
assert out[5] == 30.0, out[:8]
print("ARGV", sys.argv[1:])
print("FILE", __file__)
sys.exit(int(sys.argv[1]))
'''


def write(tmp_path: Any, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return str(path)


def test_pyopencl_script_in_a_subprocess(tmp_path: Any) -> None:
    write(tmp_path, "helper.py", HELPER)
    script = write(tmp_path, "prog.py", SCRIPT)
    out = str(tmp_path / "traces" / "prog.json")
    code = ("import sys; from cltrace.cli.run import run_script; "
            "sys.exit(run_script(sys.argv[1], sys.argv[3:], [sys.argv[2]]))")
    env = {**os.environ, "CLTRACE_CACHE_DIR": str(tmp_path / "cache")}
    env.pop("CLTRACE", None)
    proc = subprocess.run([sys.executable, "-c", code, script, out, "7", "--flag"], cwd=str(tmp_path / ".."),
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 7, proc.stderr
    assert "ARGV ['7', '--flag']" in proc.stdout
    assert f"FILE {script}" in proc.stdout

    spans, meta = tracefile.load(out)
    kernels = [s for s in spans if s.cat == "kernel"]
    assert "twice" in [s.name for s in kernels]
    assert len(kernels) >= 2  # twice + the pyopencl.array kernel of x * 3
    assert all(s.source == "device" and s.device_ns >= 0 for s in kernels)
    assert meta["recorded_spans"] == len(spans)

    events = json.load(open(out))
    args = {(e["cat"], e["name"]): e["args"] for e in events if e.get("ph") == "X" and "args" in e}
    assert args[("transfer", "copy HtoD")]["bytes"] == 4 * 4096
    assert args[("transfer", "copy DtoH")]["bytes"] == 4 * 4096
    assert args[("transfer", "copy HtoD")]["source"] == "device"
    assert ("build", "build twice") in args
    threads = {e["tid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e["name"] == "thread_name"}
    build = next(e for e in events if e.get("ph") == "X" and e["name"] == "build twice")
    assert threads[build["tid"]] == "OpenCL compile"


def run_here(tmp_path: Any, body: str, argv: list[str] | None = None) -> tuple[int, str]:
    script = write(tmp_path, "s.py", body)
    out = str(tmp_path / "s.json")
    saved = (sys.argv[:], sys.path[0])
    rc = run_script(script, argv or [], [out])
    assert (sys.argv, sys.path[0]) == saved, "argv and sys.path are restored"
    assert not cltrace.enabled() and not instrumented()
    assert cl.CommandQueue is cl._cl.CommandQueue
    return rc, out


def test_exception_prints_python_traceback_and_keeps_the_trace(tmp_path: Any, capfd: Any) -> None:
    rc, out = run_here(tmp_path, '''
        import cltrace
        def inner():
            raise ValueError("boom")
        with cltrace.region("before"):
            pass
        inner()
        ''')
    assert rc == 1
    err = capfd.readouterr().err
    assert err.startswith("Traceback (most recent call last):")
    assert f'File "{tmp_path / "s.py"}", line 7, in <module>' in err
    assert 'line 4, in inner' in err and err.rstrip().endswith("ValueError: boom")
    assert "runpy" not in err and "runner.py" not in err
    spans, _ = tracefile.load(out)
    assert [s.name for s in spans] == ["before"]


@pytest.mark.parametrize("body, status, stderr", [
    ("x = 1\n", 0, ""),
    ("import sys\nsys.exit()\n", 0, ""),
    ("import sys\nsys.exit(None)\n", 0, ""),
    ("import sys\nsys.exit(4)\n", 4, ""),
    ("raise SystemExit(3)\n", 3, ""),
    ("import sys\nsys.exit('bad input file')\n", 1, "bad input file\n"),
    ("raise KeyboardInterrupt\n", 130, "KeyboardInterrupt"),
    ("def f(:\n", 1, "SyntaxError"),
])
def test_exit_status_is_pythons(tmp_path: Any, capfd: Any, body: str, status: int, stderr: str) -> None:
    rc, out = run_here(tmp_path, body)
    assert rc == status
    err = capfd.readouterr().err
    assert stderr in err if stderr else err == ""
    assert os.path.exists(out)
    tracefile.load(out)


def test_argv_main_and_path(tmp_path: Any, capfd: Any) -> None:
    (tmp_path / "sibling.py").write_text("VALUE = 42\n")
    rc, _ = run_here(tmp_path, '''
        import sys, sibling
        assert __name__ == "__main__", __name__
        assert sys.argv[1:] == ["a", "--b"], sys.argv
        assert sys.path[0] == __import__("os").path.dirname(__file__)
        print("ok", sibling.VALUE)
        ''', ["a", "--b"])
    assert rc == 0
    assert capfd.readouterr().out == "ok 42\n"


def test_missing_script(tmp_path: Any, capfd: Any) -> None:
    assert run_script(str(tmp_path / "nope.py"), [], []) == 2
    assert "nope.py" in capfd.readouterr().err


MODULE = '''
import os
import sys

import pyopencl as cl

assert __name__ == "__main__", __name__
print("ARGV", sys.argv[1:], "FILE", os.path.relpath(__file__), "PATH0", sys.path[0] == os.getcwd())
ctx = cl.create_some_context(interactive=False)
q = cl.CommandQueue(ctx)
knl = cl.Kernel(cl.Program(ctx, "__kernel void twice(__global float *a) { a[get_global_id(0)] *= 2.0f; }").build(),
                "twice")
knl(q, (256,), None, cl.Buffer(ctx, cl.mem_flags.READ_WRITE, 1024))
q.finish()
if "--fail" in sys.argv:
    raise ValueError("boom")
'''


def _cli(tmp_path: Any, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CLTRACE", "OTEL_"))}
    return subprocess.run([sys.executable, "-m", "cltrace", "run", *args], cwd=str(tmp_path), env=env,
                          capture_output=True, text=True, timeout=180)


def test_run_dash_m_behaves_as_python_dash_m(tmp_path: Any) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "train.py").write_text(MODULE)
    (tmp_path / "pkg" / "__main__.py").write_text(MODULE)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CLTRACE", "OTEL_"))}
    plain = subprocess.run([sys.executable, "-m", "pkg.train", "a", "--b"], cwd=str(tmp_path), env=env,
                           capture_output=True, text=True, timeout=180)
    traced = _cli(tmp_path, "-m", "pkg.train", "a", "--b")  # the module's options are its own
    assert plain.returncode == traced.returncode == 0, traced.stderr
    assert traced.stdout == plain.stdout == f"ARGV ['a', '--b'] FILE {os.path.join('pkg', 'train.py')} PATH0 True\n"
    assert traced.stderr.splitlines()[-1] == "cltrace: wrote traces/train.json, traces/train.pftrace", traced.stderr
    spans, _ = tracefile.load(str(tmp_path / "traces" / "train.json"))
    assert [s.name for s in spans if s.cat == "kernel"] == ["twice"]

    failed = _cli(tmp_path, "--out", "f.json", "-m", "pkg.train", "--fail")
    assert failed.returncode == 1
    assert failed.stderr.startswith("Traceback (most recent call last):\n  File "
                                    f"\"{tmp_path / 'pkg' / 'train.py'}\""), failed.stderr  # no runpy frames
    assert "ValueError: boom\ncltrace: wrote f.json\n" in failed.stderr

    package = _cli(tmp_path, "--format", "json", "-m", "pkg")  # a package runs its __main__
    assert package.returncode == 0, package.stderr
    assert package.stdout.startswith("ARGV [] FILE " + os.path.join("pkg", "__main__.py"))
    assert os.path.isfile(tmp_path / "traces" / "pkg.json")


@pytest.mark.parametrize("args, says", [
    (["-m", "no_such_module"], "cltrace: error: -m no_such_module: No module named no_such_module"),
    (["-m"], "cltrace: error: -m needs the module to run"),
    (["-m", "broken.train"], "cltrace: error: -m broken.train: finding the module failed: RuntimeError: init broke"),
])
def test_run_dash_m_without_a_module_is_one_line(tmp_path: Any, args: list[str], says: str) -> None:
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "__init__.py").write_text("raise RuntimeError('init broke')\n")
    proc = _cli(tmp_path, *args)
    assert proc.returncode == 2 and proc.stderr.startswith(says) and proc.stderr.count("\n") == 1, proc.stderr
