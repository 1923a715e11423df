"""The switch interval while tracing (record/switch.py): lowered at start, the program's put back at
stop, never raised, left alone on request; a bad CLTRACE_SWITCH_MS is one warning line."""
from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import cltrace
from cltrace.record import switch
from cltrace.record.recorder import RECORDER


def test_lowered_while_tracing_and_restored_at_stop(tmp_path: Any) -> None:
    before = sys.getswitchinterval()
    assert before > switch.DEFAULT_S
    with cltrace.trace(str(tmp_path / "t.json"), quiet=True):
        assert abs(sys.getswitchinterval() - switch.DEFAULT_S) < 1e-9
        assert switch.active() is not None
    assert sys.getswitchinterval() == before and switch.active() is None


def test_a_lower_interval_is_kept_and_the_programs_own_change_wins(tmp_path: Any) -> None:
    before = sys.getswitchinterval()
    try:
        sys.setswitchinterval(0.0001)
        low = sys.getswitchinterval()
        with cltrace.trace(str(tmp_path / "a.json"), quiet=True):
            assert sys.getswitchinterval() == low  # never raised
        assert sys.getswitchinterval() == low
        sys.setswitchinterval(before)
        with cltrace.trace(str(tmp_path / "b.json"), quiet=True):
            sys.setswitchinterval(0.002)  # the program sets its own while traced
            own = sys.getswitchinterval()
        assert sys.getswitchinterval() == own
    finally:
        sys.setswitchinterval(before)


def test_zero_leaves_it_alone(tmp_path: Any) -> None:
    before = sys.getswitchinterval()
    old = RECORDER.switch_interval_s
    RECORDER.configure(switch_interval_s=0)
    try:
        with cltrace.trace(str(tmp_path / "t.json"), quiet=True):
            assert sys.getswitchinterval() == before
    finally:
        RECORDER.configure(switch_interval_s=old)


def test_environment_sets_the_target_and_a_bad_value_warns_once() -> None:
    code = ("import sys, cltrace\n"
            "cltrace.start(quiet=True)\n"
            "print(round(sys.getswitchinterval() * 1e6))\n"
            "cltrace.stop()\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("CLTRACE")}
    got = {}
    for value in ("2", "0", "fast"):
        p = subprocess.run([sys.executable, "-c", code], env={**env, "CLTRACE_SWITCH_MS": value},
                           capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, p.stderr
        got[value] = (int(p.stdout.split()[-1]), p.stderr)
    assert got["2"][0] == 2000 and got["0"][0] == 5000
    assert got["fast"][0] == round(switch.DEFAULT_S * 1e6) and "CLTRACE_SWITCH_MS='fast'" in got["fast"][1]
    assert got["fast"][1].count("\n") == 1
