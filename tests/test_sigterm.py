"""SIGTERM (``timeout``, ``docker stop``, job schedulers) leaves a complete
trace, then the process ends as it would have without cltrace. Real subprocesses, real signals."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from typing import Any

import pytest

BODY = '''
import sys, time
import numpy as np
import pyopencl as cl
import cltrace
{setup}
q = cltrace.profiling_queue()
prg = cltrace.compile("__kernel void inc(__global float *a) {{ a[get_global_id(0)] += 1.0f; }}", context=q.context)
buf = cl.Buffer(q.context, cl.mem_flags.READ_WRITE, 4 * 1024)
with cltrace.region("work", q):
    for _ in range(5):
        prg.inc[1024, None, q](buf)
q.finish()
with cltrace.region("waiting"):  # open when the signal comes: "ready" is printed inside it
    print("ready", flush=True)
    time.sleep(60)
'''


def start(tmp_path: Any, argv: list[str], setup: str = "", env: dict[str, str] | None = None) -> subprocess.Popen:
    script = tmp_path / "prog.py"
    script.write_text(textwrap.dedent(BODY.format(setup=setup)))
    full_env = {**os.environ, "CLTRACE_CACHE_DIR": str(tmp_path / "cache"), "PYTHONFAULTHANDLER": "1", **(env or {})}
    full_env.pop("CLTRACE", None)
    p = subprocess.Popen([sys.executable, *argv], cwd=tmp_path, env=full_env, text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    line = p.stdout.readline()
    assert line == "ready\n", (line, p.stderr.read() if p.poll() is not None else "")
    return p


def finish(p: subprocess.Popen) -> tuple[int, str]:
    p.send_signal(signal.SIGTERM)
    try:
        _, err = p.communicate(timeout=60)
    except subprocess.TimeoutExpired:  # hung: SIGABRT makes faulthandler print every thread's stack
        p.send_signal(signal.SIGABRT)
        _, err = p.communicate(timeout=30)
        pytest.fail(f"the program did not end within 60 s of SIGTERM; its threads:\n{err}")
    return p.returncode, err


def complete_trace(path: Any) -> list[dict[str, Any]]:
    """The file is whole: closing bracket and final metadata present, every kernel in it."""
    text = path.read_text()
    assert text.rstrip().endswith("]"), "trace cut off"
    events = json.loads(text)
    assert any(e.get("name") == "cltrace.metadata" for e in events)
    names = [e["name"] for e in events if e.get("ph") == "X"]
    assert names.count("inc") >= 5 and "work" in names
    return events


@pytest.mark.parametrize("how", ["start", "run"])
def test_sigterm_closes_the_trace_and_dies_of_the_signal(tmp_path: Any, how: str) -> None:
    out = tmp_path / "t.json"
    if how == "start":
        p = start(tmp_path, ["prog.py"], setup=f"cltrace.start({str(out)!r})")
    else:
        p = start(tmp_path, ["-m", "cltrace", "run", "--out", str(out), "prog.py"])
    rc, err = finish(p)
    assert rc == -signal.SIGTERM, err  # as without cltrace: killed by SIGTERM
    complete_trace(out)
    assert "cltrace: wrote" in err


def test_sigterm_goes_to_the_programs_own_handler_and_the_trace_is_complete(tmp_path: Any) -> None:
    out = tmp_path / "t.json"
    setup = f'''
import signal
def on_term(signum, frame):
    print("handler ran", file=sys.stderr, flush=True)
    sys.exit(3)
signal.signal(signal.SIGTERM, on_term)
cltrace.start({str(out)!r})
'''
    p = start(tmp_path, ["prog.py"], setup=setup)
    rc, err = finish(p)
    assert rc == 3 and "handler ran" in err, err
    events = complete_trace(out)
    waiting = [e for e in events if e.get("name") == "waiting"]
    assert waiting and waiting[0]["args"].get("status") == "error"  # closed by the SystemExit


def test_an_ignored_sigterm_stays_ignored(tmp_path: Any) -> None:
    out = tmp_path / "t.json"
    setup = f"import signal\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\ncltrace.start({str(out)!r})\n"
    p = start(tmp_path, ["prog.py"], setup=setup)
    p.send_signal(signal.SIGTERM)
    with pytest.raises(subprocess.TimeoutExpired):
        p.wait(timeout=1.5)
    p.kill()
    p.communicate(timeout=30)
