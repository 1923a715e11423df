"""``CLTRACE=1``: a program traced from its environment, as ``cltrace run`` traces a script.

Importing ``cltrace`` calls ``start()``: with ``CLTRACE`` on, tracing starts into the outputs the
environment names (``capture.session.start_from_env``: ``CLTRACE_OUT``, OTEL_EXPORTER_OTLP_*, else
``traces/<script>.json``), pyopencl is instrumented, and the Python children follow into files of
their own. For an unmodified program the import comes from ``cltrace.pth`` once the program has
imported pyopencl (``_cltrace_hook``, beside the package). At exit the trace is closed, the children's
files are merged into it, and a process that recorded nothing says so in one line.

Not started in the ``cltrace`` command itself (``cltrace run`` traces the script its own way) nor in
a child of a traced run (``CLTRACE_FAMILY``: the run's bootstrap starts that one). Whatever goes wrong
costs the trace, with one warning line, never the program.
"""
from __future__ import annotations

import atexit
import logging
import os
import sys
from typing import Any, Sequence

from ..capture import children, session
from ..record.recorder import RECORDER
from ..capture.instrument import instrument
from .run import BOOT_DIR, merge_children_at_exit

log = logging.getLogger("cltrace")


def _in_cltrace_command() -> bool:
    """Whether this process is the ``cltrace`` command (its console script or ``python -m cltrace``)."""
    argv = getattr(sys, "orig_argv", sys.argv)
    if any(os.path.basename(a) in ("cltrace", "cltrace.exe") for a in argv[:2]):
        return True
    return any(a == "-m" and b == "cltrace" for a, b in zip(argv, argv[1:]))


def start() -> None:
    """Trace this process as ``CLTRACE`` asks (nothing without it)."""
    if not session.wanted_from_env() or os.environ.get(children.ENV) or _in_cltrace_command():
        return
    started = session.start_from_env()
    if started is None:
        return
    paths, sinks, announce = started
    try:
        instrument()
        family = children.follow(paths, sinks, BOOT_DIR)
    except Exception as exc:  # the program goes on: its own trace() and regions still record
        log.warning("cltrace: CLTRACE=1: pyopencl is not instrumented: %s", exc)
        return
    atexit.register(_finish, paths, sinks, family, not announce)  # runs before the session's own exit handler


def _finish(paths: Sequence[str], sinks: Sequence[Any], family: children.Family, quiet: bool) -> None:
    """At exit: close the trace, merge the children's files into it, say so if nothing was recorded."""
    if family.root != os.getpid():  # a forked child leaving through atexit: its files are its own
        return
    if session.active():
        session.stop()
    children.unfollow()
    merged = merge_children_at_exit(paths, family, quiet)
    if (paths or sinks) and not RECORDER.recorded and not merged:  # (no output at all: its warning said so)
        print("cltrace: CLTRACE=1 recorded nothing: the program ran no OpenCL command through pyopencl and "
              "no cltrace region while tracing was on", file=sys.stderr, flush=True)
