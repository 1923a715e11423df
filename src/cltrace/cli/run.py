"""``cltrace run``: run an unmodified Python script as ``python script.py args`` would, traced.

Tracing and pyopencl instrumentation start before the script's first line and
stop after it ends, however it ends; the trace is written in every case. The
return value is the exit status ``python`` would have given.
"""
from __future__ import annotations

import atexit
import importlib.util
import os
import runpy
import signal
import sys
import time
import traceback
from typing import Any, Sequence

from ..capture import children, session, stepper
from ..capture.schedule import Schedule
from ..errors import TraceFileError
from ..export.formats import format_for
from . import steps_from as steps_from_region
from ..capture.instrument import instrument, instrumented, uninstrument

BOOT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_boot")  # children's sitecustomize
CHILD_WAIT_S = 2.0  # how long the merge waits for children still writing their traces


def _exit_status(code: Any) -> int:
    """What ``python`` exits with for ``SystemExit(code)`` (printing a non-int code, as it does)."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # cltrace's own files


def _print_exception(exc: BaseException, script: str) -> None:
    """The traceback ``python script.py`` would print: frames from the script's own code on, and none
    of cltrace's after the program's last (an exception raised inside one of pyopencl's hooks, a
    KeyboardInterrupt in a hooked ``finish``, ends at the program's line, as without cltrace)."""
    tb = exc.__traceback__
    target = os.path.abspath(script)
    t = tb
    while t is not None and os.path.abspath(t.tb_frame.f_code.co_filename) != target:
        t = t.tb_next
    last_own = None
    u = t
    while u is not None:
        if not os.path.abspath(u.tb_frame.f_code.co_filename).startswith(_PACKAGE + os.sep):
            last_own = u
        u = u.tb_next
    if last_own is not None:
        last_own.tb_next = None
    # t is None for e.g. a SyntaxError in the script: Python then prints no traceback lines either.
    traceback.print_exception(type(exc), exc, t, file=sys.stderr)
    sys.stderr.flush()


_interrupted = False  # the script ended by KeyboardInterrupt: the command dies by SIGINT, as python does


def _die_if_interrupted() -> None:
    """Registered before the program's exit handlers and the merge, so it runs after them: like
    ``python`` after an uncaught KeyboardInterrupt, end by SIGINT (status -2 to a parent, 130 in a
    shell), not by ``exit(130)``."""
    if _interrupted:
        sys.stdout.flush()
        sys.stderr.flush()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)


def _closing_exit(real: Any, pid: int) -> Any:
    """``os._exit`` for the script's run: in this process, the trace is closed first (a complete
    file, as coverage's ``patch = _exit`` saves its data); a forked child's goes straight through
    (its own files are closed by ``capture.children``)."""
    def _exit(status: int) -> None:
        if os.getpid() == pid:
            try:
                session.stop()
            except BaseException:  # the program asked to end now: nothing of ours stops it
                pass
        real(status)
    _exit.__wrapped__ = real  # type: ignore[attr-defined]
    return _exit


def module_file(name: str) -> str:
    """The file ``python -m name`` runs (a package's ``__main__``), found as it finds it, with the
    working folder first on ``sys.path``; ``ImportError`` in Python's words when there is none."""
    added = os.getcwd() not in sys.path
    if added:
        sys.path.insert(0, os.getcwd())
    try:
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.submodule_search_locations is not None:
            main = importlib.util.find_spec(f"{name}.__main__")
            if main is None:
                raise ImportError(f"No module named {name}.__main__; {name!r} is a package and cannot be "
                                  "directly executed")
            spec = main
    except (ImportError, ValueError) as exc:  # a parent that is not a package, an empty name
        raise ImportError(str(exc)) from None
    finally:
        if added:
            sys.path.remove(os.getcwd())
    if spec is None or not spec.origin or not spec.has_location:
        raise ImportError(f"No module named {name}")
    return spec.origin


def run_script(script: str, argv: Sequence[str] = (), outputs: Sequence[str] = (), *,
               extra_sinks: Sequence[Any] = (), capacity: int | None = None,
               overflow: str | None = None, quiet: bool = True, schedule: Schedule | None = None,
               steps_from: str | None = None, follow: bool = True, merge_at_exit: bool = False,
               module: bool = False) -> int:
    """Run ``script`` with ``sys.argv = [script, *argv]`` as ``__main__``, traced into ``outputs``;
    with ``module``, ``script`` is a module name run as ``python -m script argv...`` runs it
    (``sys.path[0]`` the working folder, ``sys.argv[0]`` the module's file).

    ``outputs`` are trace paths (format from the suffix); ``extra_sinks`` are sink
    objects (e.g. an OTLP exporter). ``sys.path[0]`` is the script's directory while
    it runs; its ``__file__`` is absolute, as ``python script.py`` gives it. Returns the
    script's exit status: 0, its ``SystemExit`` code (None -> 0, a message -> printed, 1),
    1 after an uncaught exception (traceback printed as Python prints it), 130 after
    KeyboardInterrupt (with ``merge_at_exit``, the command, the process then ends by SIGINT once its
    exit handlers ran, as ``python`` does). ``os._exit`` in the script closes the trace first. The trace is written in every case; with ``quiet=False`` (as the
    ``cltrace run`` command calls it) one ``cltrace: wrote ...`` line on stderr says where. SIGTERM closes the trace, then ends
    the process as it would have without cltrace. An output that cannot be written raises
    ``session.OutputError`` before the script starts. ``schedule``: trace the steps it says, the
    script marking them with ``cltrace.step()``/``cltrace.steps()``, or, with ``steps_from``, each
    outermost region of that name being a step.

    With ``follow`` (the default), Python children (multiprocessing with fork, spawn or
    forkserver; ``subprocess`` running Python) write their own files next to each output
    (``run.json`` -> ``run.pid<PID>.json``, see ``capture.children``); at the end each output
    becomes the merged trace of this process and its children, on one timeline. The children's
    files are kept. The merge waits at most ``CHILD_WAIT_S`` for children still writing, then names
    the children left out. It happens on return, or with ``merge_at_exit`` (the command) once the
    process has exited as ``python`` would (threads joined, the program's atexit handlers run, its
    pools and executors shut down by their own exit code): cltrace never ends the program's children.
    """
    global _interrupted
    script = os.fspath(script)
    if module:
        try:
            full = module_file(script)
        except ImportError as exc:
            print(f"cltrace run: {exc}", file=sys.stderr)
            return 1
        path0 = os.getcwd()
    elif not os.path.isfile(script):
        print(f"cltrace run: can't open file {script!r}: no such file", file=sys.stderr)
        return 2
    else:
        full = os.path.abspath(script)
        path0 = os.path.dirname(full)
    saved_argv = sys.argv[:]
    saved_path0 = sys.path[0] if sys.path else None
    sys.argv = [full if module else script, *argv]
    if sys.path:
        sys.path[0] = path0
    else:
        sys.path.insert(0, path0)
    was_instrumented = instrumented()
    status = 0
    family = None  # set while children are followed; only the process that set it merges them
    root = False

    def merge_at_end() -> None:
        if root:
            merge_children_at_exit(outputs, family, quiet)

    if merge_at_exit:  # before the merge and the program's own exit handlers: it runs after them
        atexit.register(_die_if_interrupted)
    if follow and merge_at_exit:  # before the script: the program's own exit handlers run before it
        atexit.register(merge_at_end)
    try:
        session.start(*outputs, *extra_sinks, capacity=capacity, overflow=overflow, quiet=quiet,
                      schedule=schedule)
        outputs = [session.written_as(p) for p in outputs]  # another process writing one: the names taken instead
        if steps_from:
            steps_from_region.install(steps_from)
        if follow:
            family = children.follow(outputs, extra_sinks, BOOT_DIR)
        instrument()
        real_exit = os._exit
        os._exit = _closing_exit(real_exit, os.getpid())
        try:
            if module:
                runpy.run_module(script, run_name="__main__", alter_sys=True)
            else:
                runpy.run_path(full, run_name="__main__")
        except SystemExit as exc:
            status = _exit_status(exc.code)
        except KeyboardInterrupt as exc:
            _print_exception(exc, full)
            status = 130
            _interrupted = True
        except BaseException as exc:
            _print_exception(exc, full)
            status = 1
        finally:
            os._exit = real_exit
        sys.stdout.flush()
    finally:
        if not was_instrumented:
            uninstrument()
        steps_from_region.uninstall()
        root = family is not None and family.root == os.getpid()  # not a child forked by the script
        scheduled = stepper.current() if schedule is not None else None
        session.stop()
        if scheduled is not None and not scheduled.number and (root or not follow):
            _say_no_step(steps_from)
        if root:
            children.unfollow()
        sys.argv = saved_argv
        if saved_path0 is not None:
            sys.path[0] = saved_path0
    if root and not merge_at_exit:
        _merge_children(outputs, family, quiet)
    return status


def _say_no_step(steps_from: str | None) -> None:
    """A schedule that saw no step traced the whole run: say so, and what makes steps."""
    seen = (f"no region {steps_from!r} ran (--steps-from {steps_from})" if steps_from
            else "the script marked no step")
    print(f"cltrace: --schedule: {seen}, so the whole run was traced: call cltrace.step() at the top of "
          f"each iteration or loop over cltrace.steps(iterable)"
          f"{'' if steps_from else ', or pass --steps-from REGION (a region each step runs)'}",
          file=sys.stderr, flush=True)


def merge_children_at_exit(outputs: Sequence[str], family: children.Family, quiet: bool) -> set[int]:
    """The merge, as the process exits: after what ``python`` does at exit for the program. Returns
    the pids of the children merged."""
    if family.root != os.getpid():  # a forked child leaving through atexit
        return set()
    try:
        util = sys.modules.get("multiprocessing.util")
        if util is not None:  # imported before this handler was registered: it would run after it
            util._exit_function()  # pools finalized, daemonic children ended, the others joined; once
        return _merge_children(outputs, family, quiet)
    except KeyboardInterrupt:
        print("cltrace: interrupted: children not merged into the trace", file=sys.stderr)
    except Exception as exc:  # never a traceback from cltrace into the program's exit
        print(f"cltrace: children not merged into the trace: {type(exc).__name__}: {exc}", file=sys.stderr)
    return set()


def _running(pid: int) -> bool:
    """Whether a process still runs (a zombie has ended: its files are closed)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            return fh.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        pass
    try:
        os.kill(pid, 0)
    except (OSError, ValueError):
        return False
    return True


def _pid_of(path: str) -> int:
    return int(path.rpartition(".pid")[2].split(".")[0])


def _files_of_run(outputs: Sequence[str], family: children.Family) -> dict[str, list[str]]:
    """Each output's children's files of this run (older files next to it are not)."""
    return {out: [f for f in children.child_files(os.path.abspath(out), family)
                  if os.path.getmtime(f) >= family.started - 1] for out in outputs}


def _wait_for_children(outputs: Sequence[str], family: children.Family) -> tuple[dict[str, list[str]], list[int]]:
    """The children's files to merge, once their processes have ended (their files are closed), and
    the pids of those still running after ``CHILD_WAIT_S`` (their files left out)."""
    deadline = time.monotonic() + CHILD_WAIT_S
    while True:
        found = _files_of_run(outputs, family)
        running = sorted({pid for files in found.values() for pid in map(_pid_of, files) if _running(pid)})
        if not running or time.monotonic() >= deadline:
            break
        time.sleep(0.02)
    return {out: [f for f in files if _pid_of(f) not in running] for out, files in found.items()}, running


def _merge_children(outputs: Sequence[str], family: children.Family, quiet: bool) -> set[int]:
    """Merge each output with its children's files of this run, in place, and say so (after the
    session's usual ``cltrace: wrote`` line). Returns the pids of the children merged."""
    from ..merge import FORMATS, merge

    found, running = _wait_for_children(outputs, family)
    if running:
        stems = [children.child_path(session.shown(p), 0).replace(".pid0", ".pid<PID>") for p in outputs]
        print(f"cltrace: children {', '.join(map(str, running))} still writing their traces {CHILD_WAIT_S:g} s "
              f"after the program ended: left out of {', '.join(session.shown(p) for p in outputs)} (their own "
              f"files, {', '.join(stems)}, can be merged later with cltrace merge)", file=sys.stderr, flush=True)
    pids: set[int] = set()
    wrote = []
    for out, files in found.items():
        if files and not os.path.exists(out):  # a scheduled run writes per-cycle files, not ``out``
            print(f"cltrace: children's files kept apart, not merged: {session.shown(out)} was not written "
                  f"(a schedule writes one file per cycle)", file=sys.stderr)
            continue
        try:
            mergeable = format_for(out) in FORMATS
        except ValueError:
            mergeable = False
        while files and mergeable:
            try:
                result = merge([out, *files], out)
            except TraceFileError as exc:
                bad = next((f for f in files if str(exc).startswith(f)), None)
                print(f"cltrace: {out}: children not merged: {exc}" if bad is None else
                      f"cltrace: {bad}: left out of {session.shown(out)}: {exc}", file=sys.stderr)
                if bad is None:
                    break
                files.remove(bad)
                continue
            pids.update(p.pid for p in result.processes[1:])
            for line in result.lines():
                if "unix time" in line:
                    print(f"cltrace: {line.strip()}", file=sys.stderr)
            break
        wrote.append(out)
    if quiet or not pids:
        return pids
    stems = [children.child_path(session.shown(p), 0).replace(".pid0", ".pid<PID>") for p in wrote]
    print(f"cltrace: merged children {', '.join(map(str, sorted(pids)))} into "
          f"{', '.join(session.shown(p) for p in wrote)}: {len(pids) + 1} processes on one timeline "
          f"(each child's own file: {', '.join(stems)})", file=sys.stderr, flush=True)
    return pids
