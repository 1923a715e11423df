"""The interpreter's thread switch interval while tracing.

CPython hands the GIL to a waiting thread only after the switch interval (5 ms by default) has
passed without a switch. A launch loop takes and drops the GIL around every driver call, so the
resolver thread (and the program's other threads) can wait far longer than that: on an H200, two
launching threads paused up to 250-400 ms and a launch loop ran 1.72x its untraced time; with
0.5 ms, 27 ms and 1.59x (benchmarks/README.md). With the worker as a third thread taking the GIL,
two launching threads' longest pause was 6.4-7.3 ms at 0.5 ms and 5.0-5.3 ms at 0.25 ms, the end to end
of one launching thread the same at both (H200, twelfth session). While tracing is on, cltrace lowers
the interval to ``DEFAULT_S`` unless it is already lower, and puts the old one back when tracing stops (unless
the program changed it meanwhile). ``CLTRACE_SWITCH_MS=0`` (or ``RECORDER.configure(switch_interval_s=0)``)
leaves it alone; any other value sets the target in milliseconds.
"""
from __future__ import annotations

import logging
import os
import sys

log = logging.getLogger("cltrace")

DEFAULT_S = 0.00025

_saved: float | None = None  # the program's interval, while ours is set
_ours: float | None = None


def from_env() -> float:
    """The target interval in seconds (0: leave the interpreter's alone) from ``CLTRACE_SWITCH_MS``."""
    raw = os.environ.get("CLTRACE_SWITCH_MS", "").strip().lower()
    if not raw:
        return DEFAULT_S
    if raw in ("off", "no", "false"):
        return 0.0
    try:
        ms = float(raw)
        if ms < 0 or ms != ms:
            raise ValueError
    except ValueError:
        log.warning("cltrace: CLTRACE_SWITCH_MS=%r is not a number of milliseconds; using %g ms "
                    "(set 0 to leave the switch interval alone)", raw, DEFAULT_S * 1e3)
        return DEFAULT_S
    return ms / 1e3


def lower(target_s: float) -> None:
    """Set the interval to ``target_s`` while tracing, if that is lower than the current one."""
    global _saved, _ours
    if target_s <= 0 or _ours is not None:
        return
    current = sys.getswitchinterval()
    if current <= target_s:
        return
    sys.setswitchinterval(target_s)
    _saved, _ours = current, sys.getswitchinterval()


def restore() -> None:
    """Put the program's interval back, unless it set one of its own while we traced."""
    global _saved, _ours
    if _ours is None:
        return
    if sys.getswitchinterval() == _ours and _saved is not None:
        sys.setswitchinterval(_saved)
    _saved = _ours = None


def active() -> float | None:
    """The interval cltrace set and has not restored yet, or None."""
    return _ours
