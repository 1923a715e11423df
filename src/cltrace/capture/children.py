"""Following child processes: each Python child of a traced program writes its own trace next to
the parent's (``traces/train.json`` -> ``traces/train.pid12345.json``, in the same formats) and
continues the parent's OTLP trace.

How a child is reached:

- forked (``os.fork``, multiprocessing's "fork", the forkserver's forks): the recorder and the
  region stacks reset themselves in the child; the hook here forgets the parent's outputs (left
  unwritten: they are the parent's files) and opens the child's own.
- a new interpreter (multiprocessing's "spawn", the forkserver itself, ``subprocess`` running
  Python): ``follow()`` puts the folder of cltrace's ``sitecustomize`` (``cli/_boot``) first on
  PYTHONPATH and the family's settings in ``CLTRACE_FAMILY``; the child starts tracing when it
  first imports pyopencl or cltrace, so a child that never uses OpenCL pays nothing and leaves no
  file. Chosen over a ``.pth`` file (needs installing into site-packages, and acts on every
  program of the environment) and ``usercustomize`` (off in virtual environments); a
  sitecustomize already on the path still runs, after ours. ``python -I``/``-E`` children ignore PYTHONPATH: not followed.

A child's files are created on its first span and closed on normal exit, an uncaught exception,
SIGTERM (the session's handler), and at the end of a multiprocessing child, which leaves through
``os._exit`` (no atexit): a multiprocessing finalizer closes them first. A child's OTLP root span
is a child of the parent's root (W3C ``TRACEPARENT``, in the environment and the settings).
"""
from __future__ import annotations

import contextlib
import functools
import glob
import json
import logging
import os
import re
import sys
import time
import uuid
from dataclasses import asdict, dataclass
from typing import Any, Callable, Sequence

from ..export.base import TraceContext
from ..export.formats import format_for, sink_for, suffix
from ..export.processes import program_name
from ..record.recorder import RECORDER
from ..timeline.batch import SpanBatch
from . import session

log = logging.getLogger("cltrace")

ENV = "CLTRACE_FAMILY"
_PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@dataclass
class Family:
    """The processes of one traced run: where the root writes and how children join its trace."""

    run: str  # shared by every file of the run (metadata "process.run")
    root: int  # pid of the process whose outputs name the children's
    outputs: list[str]  # the root's trace paths, absolute
    otlp: dict[str, str] | None = None  # {"endpoint", "protocol"} of the root's own OTLP exporter
    traceparent: str | None = None  # W3C traceparent of the root's "cltrace.run" span
    package_root: str = _PACKAGE_ROOT  # where cltrace is importable from, for a child that lacks it
    started: float = 0.0  # Unix time the run started: older files next to the outputs are not its

    @classmethod
    def from_env(cls) -> "Family | None":
        raw = os.environ.get(ENV)
        if not raw:
            return None
        try:
            return cls(**json.loads(raw))
        except (ValueError, TypeError):
            return None


_family: Family | None = None
_saved_env: dict[str, str | None] = {}


def child_path(path: str, pid: int) -> str:
    """``traces/train.json`` -> ``traces/train.pid<pid>.json``: the pid goes before the format's suffix."""
    end = suffix(format_for(path))
    return f"{path[:len(path) - len(end)]}.pid{pid}{end}"


def child_files(path: str, family: Family) -> list[str]:
    """The files children of ``family`` wrote for the root's output ``path``, by pid."""
    end = suffix(format_for(path))
    stem = path[:len(path) - len(end)]
    pattern = re.compile(re.escape(stem) + r"\.pid(\d+)" + re.escape(end) + "$")
    found = [(int(m.group(1)), f) for f in glob.glob(glob.escape(stem) + ".pid*" + end)
             if (m := pattern.match(f))]
    return [f for pid, f in sorted(found) if pid != family.root]


def process_info(family: Family) -> dict[str, Any]:
    """The ``process`` metadata of this process: its name, run, root and parent."""
    name = program_name()
    with contextlib.suppress(Exception):
        mp = sys.modules.get("multiprocessing")
        current = mp.current_process().name if mp is not None else "MainProcess"
        if current != "MainProcess":
            name += f" [{current}]"
    return {"name": name, "run": family.run, "root": family.root, "parent": os.getppid()}


# ---- the root: start following -----------------------------------------------------------------

def follow(outputs: Sequence[str], sinks: Sequence[Any], boot_dir: str) -> Family:
    """Let this process's Python children trace into files next to ``outputs`` (call after
    ``session.start``): set the environment children inherit, with ``boot_dir`` (the folder of the
    bootstrap ``sitecustomize``) first on PYTHONPATH. ``unfollow()`` restores it."""
    global _family
    family = Family(uuid.uuid4().hex, os.getpid(), [os.path.abspath(p) for p in outputs],
                    *_otlp_of(sinks), started=time.time())
    _family = family
    RECORDER.meta["process"] = process_info(family)
    env = {ENV: json.dumps(asdict(family)),
           "PYTHONPATH": os.pathsep.join([boot_dir, *filter(None, [os.environ.get("PYTHONPATH")])])}
    if family.traceparent:
        env["TRACEPARENT"] = family.traceparent
    for k, v in env.items():
        _saved_env.setdefault(k, os.environ.get(k))
        os.environ[k] = v
    return family


def unfollow() -> None:
    """Put back the environment ``follow`` changed."""
    global _family
    _family = None
    RECORDER.meta.pop("process", None)
    for k, v in _saved_env.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    _saved_env.clear()


def _otlp_of(sinks: Sequence[Any]) -> tuple[dict[str, str] | None, str | None]:
    """How children reach the OTLP collector of the first started OTLP sink, and its root's traceparent."""
    for s in sinks:
        protocol = getattr(s, "protocol", None)
        if protocol in ("grpc", "http/protobuf") and getattr(s, "mapper", None) is not None:
            parent = f"00-{s.trace_id:032x}-{s.span_id(0):016x}-01"
            return {"endpoint": getattr(s, "url", None) or s.endpoint, "protocol": protocol}, parent
    return None, None


# ---- a child: start tracing ----------------------------------------------------------------------

def start_child() -> bool:
    """In a new interpreter started by a followed process (the bootstrap calls this): trace into
    this process's own files. False where this is not such a child."""
    global _family
    family = Family.from_env()
    if family is None or family.root == os.getpid() or session.enabled():
        return False
    _family = family
    _open_outputs(family)
    return True


def _open_outputs(family: Family) -> None:
    """Trace into this process's files (and OTLP), each made on its first span: in a forked child
    this runs inside the fork, where other libraries' locks are not yet usable."""
    pid = os.getpid()
    RECORDER.meta["process"] = process_info(family)
    sinks = [LazySink(functools.partial(sink_for, child_path(p, pid)), child_path(p, pid)) for p in family.outputs]
    if family.otlp:
        sinks.append(LazySink(functools.partial(_otlp_sink, family), f"OTLP {family.otlp['endpoint']}"))
    session.start(*sinks, quiet=True)
    _close_at_multiprocessing_exit()


def _otlp_sink(family: Family) -> Any:
    """An OTLP sink whose root span is a child of the parent's (``family.traceparent``)."""
    from opentelemetry import context
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    from ..export.otlp import OtlpSink

    sink = OtlpSink(endpoint=family.otlp["endpoint"], protocol=family.otlp["protocol"])  # type: ignore[index]
    token = context.attach(TraceContextTextMapPropagator().extract({"traceparent": family.traceparent or ""}))
    try:
        sink.start(RECORDER)  # reads the current context: the parent's root span
    finally:
        context.detach(token)
    return sink


class LazySink:
    """A sink made on the first span (``make()``): a child that traces nothing leaves no file, and
    nothing is built inside a fork."""

    def __init__(self, make: Callable[[], Any], what: str) -> None:
        self.make = make
        self.what = what
        self._ctx: TraceContext | None = None
        self._sink: Any = None

    def start(self, ctx: TraceContext) -> None:
        self._ctx = ctx

    def write(self, batch: SpanBatch) -> None:
        if self._sink is None:
            if not len(batch):
                return
            sink = self.make()
            sink.start(self._ctx)
            self._sink = sink
        self._sink.write(batch)

    def flush(self, meta: dict[str, Any]) -> None:
        if self._sink is not None:
            self._sink.flush(meta)

    def close(self, meta: dict[str, Any]) -> None:
        if self._sink is not None:
            self._sink.close(meta)

    def abandon(self) -> None:
        abandon = getattr(self._sink, "abandon", None)
        if abandon is not None:
            abandon()
        self._sink = None

    def __repr__(self) -> str:
        return f"<LazySink {self.what}>"


# ---- fork ------------------------------------------------------------------------------------------

def _after_fork_in_child() -> None:
    """The recorder has reset itself and abandoned the parent's sinks; trace into this child's files."""
    global _family
    parent_outputs = session.forget_after_fork()
    if not parent_outputs:
        return
    family = _family
    if family is None:  # the parent traced without ``follow``: its own paths name the child's files
        paths = [os.path.abspath(p) for _, p in parent_outputs if p is not None]
        otlp, parent = _otlp_of([s for s, _ in parent_outputs])
        family = _family = Family(uuid.uuid4().hex, -1, paths, otlp, parent)
    try:
        _open_outputs(family)
    except Exception as exc:  # the child program goes on untraced
        log.warning("cltrace: child %d: tracing is off: %s", os.getpid(), exc)


class _Closer:
    """The multiprocessing after-fork registry holds its entries weakly: this one stays."""


_CLOSER = _Closer()


def _close_at_multiprocessing_exit() -> None:
    """A multiprocessing child ends with os._exit after running multiprocessing's finalizers (atexit
    handlers do not run): a finalizer closes the files first. A forked process object clears the
    finalizers it inherited, then runs the after-fork hooks: one arms it there; a spawned one
    (or any other process) has it armed now."""
    util = sys.modules.get("multiprocessing.util")
    if util is not None:
        util.register_after_fork(_CLOSER, _arm_finalizer)
        _arm_finalizer(_CLOSER)


def _arm_finalizer(_: Any) -> None:
    if _family is not None:  # now the process object is current: its name is known
        RECORDER.meta["process"] = process_info(_family)
    sys.modules["multiprocessing.util"].Finalize(None, _close, exitpriority=0)


def _close() -> None:
    session.stop()
    RECORDER.shutdown()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
