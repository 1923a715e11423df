"""``cltrace run``: run an unmodified Python script as ``python script.py args`` would, traced.

Tracing and pyopencl instrumentation start before the script's first line and
stop after it ends, however it ends; the trace is written in every case. The
return value is the exit status ``python`` would have given.
"""
from __future__ import annotations

import os
import runpy
import sys
import traceback
from typing import Any, Sequence

from ..capture import session
from ..capture.schedule import Schedule
from . import steps_from as steps_from_region
from .instrument import instrument, instrumented, uninstrument


def _exit_status(code: Any) -> int:
    """What ``python`` exits with for ``SystemExit(code)`` (printing a non-int code, as it does)."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def _print_exception(exc: BaseException, script: str) -> None:
    """The traceback ``python script.py`` would print: frames from the script's own code on."""
    tb = exc.__traceback__
    target = os.path.abspath(script)
    t = tb
    while t is not None and os.path.abspath(t.tb_frame.f_code.co_filename) != target:
        t = t.tb_next
    # t is None for e.g. a SyntaxError in the script: Python then prints no traceback lines either.
    traceback.print_exception(type(exc), exc, t, file=sys.stderr)
    sys.stderr.flush()


def run_script(script: str, argv: Sequence[str] = (), outputs: Sequence[str] = (), *,
               extra_sinks: Sequence[Any] = (), capacity: int | None = None,
               overflow: str | None = None, quiet: bool = True, schedule: Schedule | None = None,
               steps_from: str | None = None) -> int:
    """Run ``script`` with ``sys.argv = [script, *argv]`` as ``__main__``, traced into ``outputs``.

    ``outputs`` are trace paths (format from the suffix); ``extra_sinks`` are sink
    objects (e.g. an OTLP exporter). ``sys.path[0]`` is the script's directory while
    it runs; its ``__file__`` is absolute, as ``python script.py`` gives it. Returns the
    script's exit status: 0, its ``SystemExit`` code (None -> 0, a message -> printed, 1),
    1 after an uncaught exception (traceback printed as Python prints it), 130 after
    KeyboardInterrupt. The trace is written in every case; with ``quiet=False`` (as the
    ``cltrace run`` command calls it) one ``cltrace: wrote ...`` line on stderr says where. SIGTERM closes the trace, then ends
    the process as it would have without cltrace. An output that cannot be written raises
    ``session.OutputError`` before the script starts. ``schedule``: trace the steps it says, the
    script marking them with ``cltrace.step()``/``cltrace.steps()``, or, with ``steps_from``, each
    outermost region of that name being a step.
    """
    script = os.fspath(script)
    if not os.path.isfile(script):
        print(f"cltrace run: can't open file {script!r}: no such file", file=sys.stderr)
        return 2
    saved_argv = sys.argv[:]
    saved_path0 = sys.path[0] if sys.path else None
    sys.argv = [script, *argv]
    full = os.path.abspath(script)
    script_dir = os.path.dirname(full)
    if sys.path:
        sys.path[0] = script_dir
    else:
        sys.path.insert(0, script_dir)
    was_instrumented = instrumented()
    status = 0
    try:
        session.start(*outputs, *extra_sinks, capacity=capacity, overflow=overflow, quiet=quiet,
                      schedule=schedule)
        if steps_from:
            steps_from_region.install(steps_from)
        instrument()
        try:
            runpy.run_path(full, run_name="__main__")
        except SystemExit as exc:
            status = _exit_status(exc.code)
        except KeyboardInterrupt as exc:
            _print_exception(exc, script)
            status = 130
        except BaseException as exc:
            _print_exception(exc, script)
            status = 1
        sys.stdout.flush()
    finally:
        if not was_instrumented:
            uninstrument()
        steps_from_region.uninstall()
        session.stop()
        sys.argv = saved_argv
        if saved_path0 is not None:
            sys.path[0] = saved_path0
    return status
