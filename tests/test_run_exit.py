"""``cltrace run`` ends as ``python`` does: a KeyboardInterrupt ends the process by SIGINT (status -2 to
its parent, not ``exit(130)``) after the trace is written, with a traceback that ends at the program's
line, never inside cltrace's hooks; ``os._exit`` in the script closes the trace first (strict JSON)."""
from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import textwrap
from contextlib import redirect_stderr
from pathlib import Path

from cltrace.cli import run as run_mod

PROGRAM = """
import os, signal, pyopencl as cl, cltrace
ctx = cl.Context([cltrace.default_device()])
q = cl.CommandQueue(ctx)
prg = cl.Program(ctx, "__kernel void a(__global float *x) { x[get_global_id(0)] += 1; }").build()
knl = cl.Kernel(prg, "a")
buf = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, 4096)
for _ in range(50):
    knl(q, (1024,), None, buf)
q.finish()
{end}
"""


def _script(tmp_path: Path, end: str) -> Path:
    p = tmp_path / "prog.py"
    p.write_text(textwrap.dedent(PROGRAM).replace("{end}", end))
    return p


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=120, cwd=cwd)


def test_keyboard_interrupt_ends_by_sigint_as_python_does(tmp_path: Path) -> None:
    script = _script(tmp_path, "os.kill(os.getpid(), signal.SIGINT)\nimport time; time.sleep(5)")
    plain = _run(str(script), cwd=tmp_path)
    traced = _run("-m", "cltrace", "run", "--out", "t.json", str(script), cwd=tmp_path)
    assert plain.returncode == traced.returncode == -signal.SIGINT, traced.stderr
    assert traced.stderr.count("KeyboardInterrupt") == 1
    frames = [ln for ln in traced.stderr.splitlines() if ln.strip().startswith("File ")]
    assert frames and all(str(script) in ln for ln in frames)  # the program's frames only
    spans = json.loads((tmp_path / "t.json").read_text())  # written whole before the process ended
    assert sum(e.get("name") == "a" and e.get("ph") == "X" for e in spans) >= 50


def test_os_exit_in_the_script_closes_the_trace_first(tmp_path: Path) -> None:
    script = _script(tmp_path, "os._exit(7)")
    traced = _run("-m", "cltrace", "run", "--out", "t.json", str(script), cwd=tmp_path)
    assert traced.returncode == 7, traced.stderr
    spans = json.loads((tmp_path / "t.json").read_text())  # strict JSON: the file was closed
    assert sum(e.get("name") == "a" and e.get("ph") == "X" for e in spans) >= 50


def test_a_traceback_ends_at_the_programs_line_not_in_cltrace(tmp_path: Path) -> None:
    """An exception raised in a frame of cltrace's (a hook) below the program's call: the printed
    traceback stops at the program's line, as it would without the hook in between."""
    hook_file = os.path.join(run_mod._PACKAGE, "capture", "instrument.py")
    hook_ns: dict = {}
    exec(compile("def finish():\n    raise KeyboardInterrupt\n", hook_file, "exec"), hook_ns)
    script = str(tmp_path / "prog.py")
    ns = {"finish": hook_ns["finish"]}
    try:
        exec(compile("def main():\n    finish()\nmain()\n", script, "exec"), ns)
    except KeyboardInterrupt as exc:
        err = io.StringIO()
        with redirect_stderr(err):
            run_mod._print_exception(exc, script)
    files = [ln.strip() for ln in err.getvalue().splitlines() if ln.strip().startswith("File ")]
    assert len(files) == 2 and all(script in f for f in files), err.getvalue()
    assert "instrument.py" not in err.getvalue()
