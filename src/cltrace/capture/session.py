"""Switching tracing on and off, attaching file exporters by path, and closing the trace
however the process ends: ``stop()``, normal exit, or SIGTERM (what ``timeout``,
``docker stop`` and job schedulers send).

A file given by path is written as ``<path>.partial`` and renamed to its path when the session
closes it completely, so an earlier file of that name is replaced only by a whole new one. A
session that ``stop(failed=True)`` ends (``trace()`` left by an exception) closes its files but
leaves them ``.partial``; a killed process leaves them ``.partial``, readable up to the last flush.

A session says where its files are when it closes them: one ``cltrace: wrote ...`` line
on stderr (``quiet=True`` or ``CLTRACE_QUIET=1`` silences it). ``CLTRACE=1`` at import
starts one from the environment (and says where only for the default file, the one the
user did not name); a setting it cannot use costs that output, with one warning line,
never the program.
"""
from __future__ import annotations

import atexit
import contextlib
import logging
import os
import signal
import sys
import threading
from typing import Any, Callable, Iterator

from .. import _state
from ..errors import OutputError
from ..export import claim
from ..export import offpath
from ..export.base import partial_path, put_in_place
from ..export.formats import format_for, register_format, sink_for
from ..record import heap, regions, switch
from ..record.recorder import RECORDER
from . import instrument as _instrument, sigwake, stepper
from .schedule import Schedule
from .stepper import Cycle

__all__ = ["start", "stop", "trace", "enabled", "start_from_env", "format_for", "sink_for", "register_format",
           "OutputError", "default_output", "otlp_configured", "wanted_from_env", "active"]

log = logging.getLogger("cltrace")

_session_sinks: list[Any] = []
# id(sink) -> (the path it writes as given, say so when closed, that path made absolute: the rename at
# stop does not depend on the working folder then)
_session_paths: dict[int, tuple[str, bool, str]] = {}
_session_claims: dict[int, int] = {}  # id(sink) -> the descriptor holding its path (``export.claim``)
_written_as: dict[str, str] = {}  # a path given to start, made absolute -> the path written instead (taken)
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def _checked(out: str | os.PathLike[str]) -> str:
    """The path ``out`` names, or OutputError saying what to change (before anything is created)."""
    path = os.fspath(out)
    try:
        format_for(path)
    except ValueError as exc:
        raise OutputError(str(exc)) from None
    if os.path.isdir(path):
        raise OutputError(f"cannot write the trace {path!r}: it is a folder; give a file name such as "
                          f"{os.path.join(path, 'trace.json')!r}")
    folder = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(folder):
        folder = os.path.dirname(folder)
    if not os.path.isdir(folder):
        raise OutputError(f"cannot write the trace {path!r}: {shown(folder)!r} is a file, not a folder; "
                          "choose another path")
    return path


def _cannot_write(path: str, exc: OSError) -> OutputError:
    return OutputError(f"cannot write the trace {path!r}: {exc.strerror or exc}; "
                       "choose a path in a folder you can write to")


def _claim(paths: list[str]) -> tuple[list[str], list[int]]:
    """``paths`` taken for this process (``export.claim``): themselves, or numbered names where another
    process is writing one of them, said in one line (quiet or not: two runs meant to write one file)."""
    try:
        taken, fds = claim.claim(paths)
    except OSError as exc:
        where = os.path.abspath(str(exc.filename or ""))  # the .partial, or a folder it needed
        path = next((p for p in paths if os.path.abspath(partial_path(p)) == where
                     or os.path.abspath(p).startswith(where + os.sep)), paths[0])
        raise _cannot_write(path, exc) from None
    if taken != paths:
        busy = ", ".join(shown(p) for p in paths)
        print(f"cltrace: another process is writing {busy}: this one writes {', '.join(shown(p) for p in taken)}",
              file=sys.stderr, flush=True)
    return taken, fds


def _open(path: str) -> Any:
    """A started sink writing ``partial_path(path)`` (which ``_claim`` took), in the format of ``path``."""
    sink = sink_for(partial_path(path), format_for(path))
    try:
        RECORDER.add_sink(sink)
    except OSError as exc:
        raise _cannot_write(path, exc) from None
    return sink


def written_as(path: str | os.PathLike[str]) -> str:
    """The path this process writes for a path given to ``start``: itself, or the numbered name it took
    because another process was writing it (``s.json`` -> ``s.1.json``)."""
    p = os.fspath(path)
    return _written_as.get(os.path.abspath(p), p)


def start(*outputs: str | os.PathLike[str] | Any, capacity: int | None = None, overflow: str | None = None,
          quiet: bool | None = None, schedule: Schedule | None = None,
          on_trace_ready: Callable[[Cycle], Any] | None = None) -> None:
    """Turn tracing on. Each output is a path (format from its suffix) or a sink object.

    A path that cannot be written raises ``OutputError`` (a ``ValueError``) before tracing
    starts, and none of this call's outputs is attached. A path the session already writes (the
    file ``CLTRACE=1`` opened, named again by the program) is not opened twice. ``quiet``: do not
    print where the files are when they are closed (default: ``CLTRACE_QUIET``). ``schedule``
    (``cltrace.schedule(...)``): trace only the steps it says (see ``capture/stepper.py``);
    ``on_trace_ready(cycle)`` is called at the end of each active cycle (default: write
    ``run.cycleN.json`` next to each output ``run.json``).
    """
    if schedule is not None and not isinstance(schedule, Schedule):
        raise TypeError(f"schedule must come from cltrace.schedule(...), not {type(schedule).__name__}")
    if schedule is None and on_trace_ready is not None:
        raise ValueError("on_trace_ready needs a schedule: cltrace.trace(..., schedule=cltrace.schedule(...))")
    if schedule is not None and stepper.current() is not None:
        raise ValueError("a schedule is already running: cltrace.stop() it before starting another")
    RECORDER.configure(capacity=capacity, overflow=overflow)
    if quiet is None:
        quiet = os.environ.get("CLTRACE_QUIET", "").strip().lower() in _TRUE
    added: list[Any] = []
    given = [_checked(out) for out in outputs if isinstance(out, (str, os.PathLike)) and not _writing(out)]
    twice = sorted({p for p in given if [os.path.abspath(q) for q in given].count(os.path.abspath(p)) > 1})
    if twice:
        raise OutputError(f"the trace {twice[0]!r} is given twice: give each output once")
    paths, fds = _claim(given) if given else ([], [])
    held = dict(zip(paths, fds))
    taken = iter(paths)
    try:
        for out in outputs:
            if isinstance(out, (str, os.PathLike)) and _writing(out):
                continue  # already this session's (CLTRACE=1's file named again by the program's trace())
            if isinstance(out, (str, os.PathLike)):
                path = next(taken)
                sink = _open(path)
                _session_paths[id(sink)] = (path, not quiet, os.path.abspath(path))
                _session_claims[id(sink)] = held.pop(path)
            else:
                sink = out
                RECORDER.add_sink(sink)
            added.append(sink)
    except BaseException:
        for sink in added:
            full = _session_paths.pop(id(sink), (None, False, None))[2]
            with contextlib.suppress(Exception):
                RECORDER.remove_sink(sink)
            if full is not None:
                with contextlib.suppress(OSError):
                    os.unlink(partial_path(full))
                claim.release([_session_claims.pop(id(sink))])
        for path, fd in held.items():  # taken, no sink made yet
            with contextlib.suppress(OSError):
                os.unlink(partial_path(path))
            claim.release([fd])
        raise
    for g, p in zip(given, paths):
        if g != p:
            _written_as[os.path.abspath(g)] = p
        else:
            _written_as.pop(os.path.abspath(g), None)
    _session_sinks.extend(added)
    _hook_pyopencl()
    _state.ENABLED = True
    RECORDER.activate()
    if schedule is not None:
        st = stepper.Stepper(schedule, on_trace_ready, _file_outputs, None if quiet else _announce)
        stepper.set_current(st)
        st.attach()
    elif stepper.current() is not None:  # an output added to a scheduled session: the step decides
        _state.ENABLED = stepper.current().tracing()
    _install_sigterm()


_hooked_here = False  # start() installed pyopencl's hooks: stop() takes them off


def record_pyopencl(on: bool | None = None) -> bool:
    """Whether ``start()`` hooks pyopencl so every command the program enqueues through it is
    recorded (default: yes; ``CLTRACE_PYOPENCL=0`` or ``cltrace.configure(record_pyopencl=False)``
    leaves pyopencl alone: then only ``cltrace.launch``, ``cltrace.compile``'s kernels and regions
    are). Sets it when ``on`` is given; returns the setting."""
    global _record_pyopencl
    if on is not None:
        _record_pyopencl = bool(on)
    return _record_pyopencl


def _setting_from_env() -> bool:
    raw = os.environ.get("CLTRACE_PYOPENCL", "").strip().lower()
    if raw in ("", *_TRUE):
        return True
    if raw in _FALSE:
        return False
    log.warning("cltrace: CLTRACE_PYOPENCL=%r is not 0/1/true/false: pyopencl's commands are recorded "
                "(CLTRACE_PYOPENCL=0 leaves pyopencl alone)", raw[:40])
    return True


_record_pyopencl = _setting_from_env()


def _hook_pyopencl() -> None:
    """Hooks pyopencl for the session unless the user (or ``cltrace run``) already did, or said not to.
    The hooks read the tracing flag first: outside a session they are taken off, and cost nothing."""
    global _hooked_here
    if _record_pyopencl and not _instrument.instrumented():
        _instrument.instrument(for_session=True)
        _hooked_here = True


def _unhook_pyopencl() -> None:
    global _hooked_here
    if _hooked_here:
        _hooked_here = False
        if not _instrument.asked():
            _instrument.uninstrument()


_env_paths: set[str] = set()  # the files CLTRACE=1 asked for (absolute), while its session writes them


def _writing(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a file ``CLTRACE=1``'s session already writes (the program's own ``trace()``
    naming it again gets no second sink; any other path held by this process goes to a numbered name)."""
    return bool(_session_sinks) and os.path.abspath(os.fspath(path)) in _env_paths


def active() -> bool:
    """Whether a session has outputs open (``stop()`` has something to close)."""
    return bool(_session_sinks)


def _file_outputs() -> list[str]:
    """The trace files of the session, in the order they were attached."""
    return [_session_paths[id(s)][0] for s in _session_sinks if id(s) in _session_paths]


def stop(*, failed: bool = False) -> None:
    """Turn tracing off, flush everything recorded and close the sinks ``start`` attached.

    Each file is renamed from ``<path>.partial`` to its path once closed; with ``failed`` (the
    traced work did not finish as it should) the files stay ``.partial`` and earlier files of
    those names are left as they were. Prints one ``cltrace: wrote ...`` line on stderr for the
    files it closed, unless quiet. A SIGTERM that comes meanwhile (a pool terminating a worker that
    is closing its files) takes effect once the files are complete."""
    global _stopping
    _stopping += 1
    try:
        _stop(failed)
    finally:
        _stopping -= 1
    if _sigterm_pending and not _stopping:
        _redeliver_sigterm()


def _stop(failed: bool) -> None:
    st = stepper.current()
    if st is not None:
        st.finish(failed)  # the last step ends, a cycle cut short is handed out
    _state.ENABLED = False
    _unhook_pyopencl()
    if not _session_sinks or any(s not in _session_sinks for s in RECORDER.sinks):
        RECORDER.flush(block=True)  # sinks this session does not close are left durable; its own are closed below
    wrote, kept = [], []
    _env_paths.clear()
    sinks = list(_session_sinks)
    errors = RECORDER.remove_sinks(sinks) if sinks else {}  # closed side by side
    _session_sinks.clear()
    for sink in sinks:
        path, announce, full = _session_paths.pop(id(sink), (None, False, None))
        held = _session_claims.pop(id(sink), None)
        try:
            if id(sink) in errors:
                raise errors[id(sink)]
            if full is not None and not failed:
                put_in_place(full)
        except Exception as exc:  # one output failing must not cost the others
            log.warning("cltrace: writing %s failed: %s (what was written is in %s)", path or repr(sink), exc,
                        partial_path(path) if path else "the sink")
            continue
        finally:
            if held is not None:  # renamed into place (or left .partial): the path is free for the next writer
                claim.release([held])
        if announce:
            (kept if failed else wrote).append(path)
    if st is not None:
        st.detach()
        stepper.set_current(None)
    _uninstall_sigterm()
    switch.restore()
    regions.forget_kernels()
    _instrument.forget_queues()
    offpath.later(heap.give_back)  # what the session freed (waiting records, step columns, file buffers) back to the OS
    if wrote:
        print(f"cltrace: wrote {', '.join(shown(p) for p in wrote)}", file=sys.stderr, flush=True)
    if kept:
        print(f"cltrace: the traced work failed: kept {', '.join(shown(partial_path(p)) for p in kept)}; "
              f"{', '.join(shown(p) for p in kept)} left as before", file=sys.stderr, flush=True)
    _say_dropped()


def _say_dropped() -> None:
    """Spans lost past the memory budget, said once a session (quiet or not): nothing goes without a word."""
    lost, kept = RECORDER.lost, RECORDER.memory_dropped
    if lost:
        print(f"cltrace: {lost:,} spans dropped: more than {RECORDER.hard_cap:,} records waited to be resolved "
              f"at once, past the memory budget of {RECORDER.memory_budget_mb:g} MB (keep them with "
              f"cltrace.RECORDER.configure(memory_budget_mb=...) or CLTRACE_MEMORY_MB)", file=sys.stderr, flush=True)
    if kept:
        print(f"cltrace: {kept:,} spans not kept in memory past capacity={RECORDER.capacity:,} (files and sinks "
              f"have them; raise cltrace.RECORDER.configure(capacity=...) for reports)", file=sys.stderr, flush=True)


def _announce(paths: list[str]) -> None:
    print(f"cltrace: wrote {', '.join(shown(p) for p in paths)}", file=sys.stderr, flush=True)


def forget_after_fork() -> list[tuple[Any, str | None]]:
    """In a forked child: the parent's outputs, as (sink, path or None), forgotten here (the recorder
    has abandoned them: they are the parent's to close)."""
    global _stopping, _sigterm_pending
    out = [(s, _session_paths.get(id(s), (None, False, None))[0]) for s in _session_sinks]
    _stopping, _sigterm_pending = 0, False  # a stop() of another of the parent's threads is not this one's
    _session_sinks.clear()
    _session_paths.clear()
    # The child's copies of the parent's descriptors: a flock belongs to the open file, held while any copy is
    # open, so the parent's hold stays, and ends when the parent lets go even if this child runs on.
    claim.release(list(_session_claims.values()))
    _session_claims.clear()
    _written_as.clear()
    return out


def shown(path: str) -> str:
    """A path as the user can open it from where they are: relative under the working folder."""
    full = os.path.abspath(path)
    try:
        rel = os.path.relpath(full)
    except ValueError:  # another drive
        return full
    return full if rel.startswith(os.pardir) else rel


def enabled() -> bool:
    return _state.ENABLED


@contextlib.contextmanager
def trace(*outputs: str | os.PathLike[str] | Any, capacity: int | None = None, overflow: str | None = None,
          quiet: bool | None = None, schedule: Schedule | None = None,
          on_trace_ready: Callable[[Cycle], Any] | None = None) -> Iterator[Any]:
    """``with cltrace.trace("out.json"):`` traces the block and writes the file(s) at exit,
    saying where on stderr unless ``quiet``; a block left by an exception leaves them
    ``out.json.partial`` (``stop(failed=True)``). ``schedule``/``on_trace_ready``: see ``start``."""
    start(*outputs, capacity=capacity, overflow=overflow, quiet=quiet, schedule=schedule,
          on_trace_ready=on_trace_ready)
    failed = True
    try:
        yield RECORDER
        failed = False
    finally:
        stop(failed=failed)


@atexit.register
def _at_exit() -> None:  # registered after the recorder's: runs first, so the files are named
    if _session_sinks:
        stop()


# ---- SIGTERM ------------------------------------------------------------------------------

_prev_sigterm: Any = None
_sigterm_installed = False
_stopping = 0  # stop() calls under way: a SIGTERM meanwhile waits for them (re-entered, they lose the files)
_sigterm_pending = False


def _install_sigterm() -> None:
    """Close the trace on SIGTERM, then do what the process would have done without cltrace.

    Installed only from the main thread and only over the default action or a Python
    handler: an ignored SIGTERM stays ignored."""
    global _prev_sigterm, _sigterm_installed
    if threading.current_thread() is not threading.main_thread():
        return
    if _sigterm_installed:  # (a forked child inherits it: it needs a watcher of its own)
        sigwake.start(_on_sigterm)
        return
    try:
        prev = signal.getsignal(signal.SIGTERM)
        if prev is signal.SIG_IGN or prev is None:  # ignored, or set outside Python: leave it
            return
        signal.signal(signal.SIGTERM, _on_sigterm)
    except (ValueError, OSError, AttributeError):  # no signals here (embedded interpreter)
        return
    _prev_sigterm, _sigterm_installed = prev, True
    sigwake.start(_on_sigterm)


def _uninstall_sigterm() -> None:
    global _sigterm_installed
    if not _sigterm_installed or threading.current_thread() is not threading.main_thread():
        return
    _sigterm_installed = False
    sigwake.stop()
    with contextlib.suppress(ValueError, OSError):
        if signal.getsignal(signal.SIGTERM) is _on_sigterm:  # a handler set since is the program's
            signal.signal(signal.SIGTERM, _prev_sigterm)


def _on_sigterm(signum: int, frame: Any) -> None:
    global _sigterm_pending
    sigwake.handled()
    if _stopping:  # closing the files: the signal is sent again when they are closed
        _sigterm_pending = True
        if _stopping:  # (a stop() in another thread may have ended since)
            return
        _sigterm_pending = False
    prev = _prev_sigterm
    if callable(prev):
        # The program handles SIGTERM itself (it may exit, or carry on): make the files
        # complete up to now and let it decide; exit closes them as usual.
        RECORDER.flush(block=True)
        prev(signum, frame)
        return
    # Default action: close every output, then die of the signal as without cltrace.
    try:
        stop()
        RECORDER.shutdown()
    finally:
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)


def _redeliver_sigterm() -> None:
    """The SIGTERM that came while stop() closed the files, again: the program's handler, or the
    default action, now that they are complete (ours, if still installed, closes what is left)."""
    global _sigterm_pending
    _sigterm_pending = False
    os.kill(os.getpid(), signal.SIGTERM)


# ---- CLTRACE=1 ------------------------------------------------------------------------------

def default_output(argv0: str | None = None) -> str:
    """Where ``CLTRACE=1`` writes without ``CLTRACE_OUT``: ``traces/<script>.json``, as ``cltrace run``."""
    a = sys.argv[0] if argv0 is None else argv0
    base = os.path.splitext(os.path.basename(a))[0] if a and not a.startswith("-") else ""
    return os.path.join("traces", f"{base or 'python'}.json")


def wanted_from_env() -> bool:
    """Whether ``CLTRACE`` asks for tracing (1, true, yes or on)."""
    return os.environ.get("CLTRACE", "").strip().lower() in _TRUE


def start_from_env() -> tuple[list[str], list[Any], bool] | None:
    """``CLTRACE=1`` turns tracing on at import. ``CLTRACE_OUT`` names the output file(s)
    (``os.pathsep``-separated); OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT also sends the spans
    there. With neither, the trace goes to ``default_output()``. A setting that cannot be
    used gives one warning line naming the variable and the fix, and that output is off:
    importing cltrace never stops the program. Returns what it started, (trace paths, other
    sinks, whether it says where the files are), or None where tracing stays off."""
    if not wanted_from_env():
        return None
    try:
        return _start_from_env()
    except Exception as exc:  # the last line of defence: the user's program goes on
        _state.ENABLED = False
        log.warning("cltrace: CLTRACE=1: tracing is off: %s", exc)
        return None


def _start_from_env() -> tuple[list[str], list[Any], bool]:
    raw_out = os.environ.get("CLTRACE_OUT", "")
    paths = [p for p in raw_out.split(os.pathsep) if p.strip()]
    otlp = _otlp_from_env()
    default = not paths and otlp is None and not otlp_configured()
    if default:
        paths = [default_output()]
    start()
    opened = []
    for path in paths:
        try:
            start(path, quiet=None if default else True)  # CLTRACE_OUT's files are where the user said
            opened.append(path)
            _env_paths.add(os.path.abspath(path))
        except OutputError as exc:
            log.warning("cltrace: CLTRACE_OUT: %s (this output is off)", exc)
    if otlp is not None:
        start(otlp)
    announce = default and os.environ.get("CLTRACE_QUIET", "").strip().lower() not in _TRUE
    return opened, [otlp] if otlp is not None else [], announce


def otlp_configured() -> bool:
    """Whether OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT asks for OTLP export."""
    return bool(os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"))


def _otlp_from_env() -> Any:
    """The OTLP sink the environment asks for, or None (with one warning line per bad setting)."""
    if not otlp_configured():
        return None
    from ..export.otlp.config import env_problems

    problems = env_problems()
    for p in problems:
        log.warning("cltrace: %s (OTLP export is off)", p)
    if problems:
        return None
    try:
        from ..export.otlp import otlp_sink_from_env

        return otlp_sink_from_env()
    except Exception as exc:
        log.warning("cltrace: OTLP export from OTEL_EXPORTER_OTLP_* is off: %s", exc)
        return None
