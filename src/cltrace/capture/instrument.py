"""Tracing unmodified pyopencl programs: hooks on pyopencl's entry points.

``instrument()`` replaces, on the ``pyopencl`` and ``pyopencl._cl`` modules:

* ``enqueue_nd_range_kernel`` — on both modules: ``cl.Kernel.__call__`` (and so
  ``pyopencl.array``, ``ElementwiseKernel``, ``ReductionKernel``...) reaches the driver
  through pyopencl's generated invokers, which look up ``_cl.enqueue_nd_range_kernel``
  at call time; user code calls ``cl.enqueue_nd_range_kernel``. Spans are named after
  the kernel's function name.
* ``enqueue_copy`` and ``enqueue_fill_buffer`` (``enqueue_fill`` and ``Array.get/set``
  call them through the module) — "transfer"/"fill" spans with ``bytes``.
* every other command pyopencl can enqueue (``COMMANDS``): image fills, buffer and image
  maps and their unmap (``MemoryMap.release``), SVM fills, maps, unmaps and migrations,
  memory-object migrations, AMD peer copies ("transfer"/"fill" spans), and markers and
  barriers ("marker" spans; cltrace's own markers — clock calibration, ``EventTimer`` —
  are not the program's and are not recorded).
* ``Program.build`` — a "build" span on the compile track, with pyopencl's own
  binary-cache outcome when it reports one.
* ``CommandQueue.finish``, ``Event.wait`` and ``wait_for_events`` — host-only "sync" spans
  (``blocking: true``): the time the host sat blocked on the device, which analysis needs to
  tell a starved device from a blocked host. Copies carry ``blocking`` too (pyopencl's default: true).
* ``Buffer``, ``Image``, ``SVMAllocation`` (and the SVM class behind ``csvm_empty``) — pyopencl's
  classes subclassed (``record.allocations``), and ``pyopencl.tools.MemoryPool``/``SVMPool``:
  allocations and releases feed the per-context device-memory counter.
* ``CommandQueue`` — a stand-in class (``isinstance`` still holds for every queue)
  that adds PROFILING_ENABLE, so queues made while instrumented have device times.

Each hook reads the tracing flag first and otherwise calls straight through.
Work on a queue made without profiling gives host-only spans and one warning.
``uninstrument()`` puts every original object back.
"""
from __future__ import annotations

import hashlib
import sys
import threading
import time
import warnings
from dataclasses import dataclass
from typing import Any, Callable

import pyopencl as cl
import pyopencl._cl as _cl
import pyopencl.tools as cl_tools

from .. import _state
from ..record.sources import kernel_names
from ..record.queues import PROFILING
from ..record.callsite import capture as _site
from ..record.recorder import RECORDER, new_id
from ..record.allocations import classes as _memory_classes, pool_classes as _pool_classes
from ..record.failures import sizes as _sizes
from ..record.regions import (Gate, current_parent, direction, failed_launch, launch_name, own_on, shape_attrs,
                              record_failure, record_hooked, record_launch, update_region_mode)
from ..timeline.spans import BUILD, FILL, KERNEL, MARKER, STATUS_ERROR, SYNC, TRANSFER
from ..timeline.tracks import COMPILE_THREAD

_perf = time.perf_counter_ns
_lock = threading.Lock()
_saved: list[tuple[Any, str, bool, Any]] = []  # (owner, attribute, was in owner's __dict__, original)
_warned = False
# True while the hooks are installed: code that records its own pyopencl calls (cltrace.launch,
# record_launch around enqueue_copy) can read it to avoid a second span per command.
ACTIVE = False
_asked = False  # instrument() was called by the user or cltrace run (not only by a session): it outlives sessions

NO_PROFILING = "unavailable: queue without PROFILING_ENABLE"

# What the hooks call through to: refreshed by instrument() from the attributes it replaces.
_ORIG_NDRANGE = _cl.enqueue_nd_range_kernel
_ORIG_COPY = cl.enqueue_copy
_ORIG_FILL = cl.enqueue_fill_buffer
_ORIG_BUILD = cl.Program.build
_ORIG_QUEUE = _cl.CommandQueue
_ORIG_FINISH = _cl.CommandQueue.finish
_ORIG_EV_WAIT = _cl.Event.wait
_ORIG_WAIT_EVENTS = _cl.wait_for_events


# id(queue) -> the queue, for queues known to have PROFILING_ENABLE (a queue's properties never change, and
# pyopencl asks the driver each time: ~0.4 us a launch). The entries hold their queues, so an id is never
# reused while cached; at most _QUEUES_MAX, forgotten when tracing stops (``forget_queues``).
_PROFILED_QUEUES: dict[int, Any] = {}
_QUEUES_MAX = 64


def forget_queues() -> None:
    """Drop the queues ``_profiled`` remembered (tracing stopped: they may be freed)."""
    _PROFILED_QUEUES.clear()


def _profiled(queue: Any) -> bool:
    global _warned
    if _PROFILED_QUEUES.get(id(queue)) is queue:
        return True
    try:
        if queue.properties & PROFILING:
            if len(_PROFILED_QUEUES) >= _QUEUES_MAX:
                _PROFILED_QUEUES.clear()
            _PROFILED_QUEUES[id(queue)] = queue
            return True
    except Exception:
        return False
    if not _warned:
        _warned = True
        warnings.warn(
            "cltrace: work was submitted on a command queue created without PROFILING_ENABLE "
            "(made before tracing started?); its spans are host-only, without device times. "
            "Fix: make the queue with cltrace.profiling_queue(ctx) or "
            "properties=cl.command_queue_properties.PROFILING_ENABLE (queues made while tracing, "
            "or under `cltrace run`, have it).",
            RuntimeWarning, stacklevel=4)
    return False


def _record(name: str, cat: str, queue: Any, ev: Any, hb: int, he: int, attrs: dict[str, Any]) -> None:
    site = _site(3)  # the hook's caller and up: pyopencl's frames are skipped as library code
    if _profiled(queue):
        record_hooked(name, queue, ev, hb, he, cat, attrs, site)
    else:  # a copy: launch attrs are shared by every launch of one shape
        record_launch(name, None, None, hb, he, cat, {**attrs, "cltrace.device_time": NO_PROFILING}, site)


_record_failure = record_failure


# ---- kernels -------------------------------------------------------------------------

def enqueue_nd_range_kernel(queue: Any, kernel: Any, global_size: Any, local_size: Any,
                            *args: Any, **kwargs: Any) -> Any:
    """``pyopencl.enqueue_nd_range_kernel``, recorded as a "kernel" span while tracing.

    A failed enqueue leaves a failed span and raises the same pyopencl error, naming the
    kernel and its sizes."""
    if not _state.ENABLED or own_on():
        return _ORIG_NDRANGE(queue, kernel, global_size, local_size, *args, **kwargs)
    hb = _perf()
    try:
        ev = _ORIG_NDRANGE(queue, kernel, global_size, local_size, *args, **kwargs)
    except cl.Error as exc:
        raise failed_launch(exc, _kernel_name(kernel), global_size, local_size, hb, kernel, queue) from None
    he = _perf()
    _record(_kernel_name(kernel), KERNEL, queue, ev, hb, he, _launch_attrs(global_size, local_size))
    return ev


_launch_attrs, _ = shape_attrs(_sizes)  # shared per launch shape, as ``launch``'s; sizes as lists, pyopencl's form


def _kernel_name(kernel: Any) -> str:
    try:
        return launch_name(kernel)
    except Exception:
        return "kernel"


# ---- transfers and fills ---------------------------------------------------------------

def _is_device(obj: Any) -> bool:
    return isinstance(obj, (cl.MemoryObjectHolder, cl.SVMPointer))


def _nbytes(obj: Any) -> int | None:
    n = getattr(obj, "nbytes", None)
    if n is not None:
        return int(n)
    try:
        return memoryview(obj).nbytes
    except TypeError:
        return None


def _copy_info(dest: Any, src: Any, kwargs: dict[str, Any]) -> tuple[str, int | None]:
    d_dev, s_dev = _is_device(dest), _is_device(src)
    name = "copy DtoD" if d_dev and s_dev else "copy HtoD" if d_dev else "copy DtoH" if s_dev else "copy"
    if "byte_count" in kwargs and kwargs["byte_count"] is not None:
        return name, int(kwargs["byte_count"])
    region = kwargs.get("region")
    if region is not None:
        img = dest if isinstance(dest, _cl.Image) else src if isinstance(src, _cl.Image) else None
        n = 1
        for r in region:
            n *= int(r)
        return name, n * (img.element_size if img is not None else 1)
    if d_dev and s_dev:
        sizes = [getattr(x, "size", None) for x in (dest, src)]
        if None in sizes:
            return name, None
        return name, min(sizes[0] - int(kwargs.get("dst_offset", 0)), sizes[1] - int(kwargs.get("src_offset", 0)))
    host = src if d_dev else dest
    return name, _nbytes(host)


def enqueue_copy(queue: Any, dest: Any, src: Any, **kwargs: Any) -> Any:
    """``pyopencl.enqueue_copy``, recorded as a "transfer" span with ``bytes`` while tracing."""
    if not _state.ENABLED or own_on():
        return _ORIG_COPY(queue, dest, src, **kwargs)
    hb = _perf()
    try:
        ev = _ORIG_COPY(queue, dest, src, **kwargs)
    except Exception as exc:
        name, nbytes = _copy_info(dest, src, kwargs)
        _record_failure(name, TRANSFER, hb, exc, {"bytes": nbytes})
        raise
    he = _perf()
    name, nbytes = _copy_info(dest, src, kwargs)
    attrs: dict[str, Any] = {"bytes": nbytes, "direction": direction(dest, src),
                             "blocking": bool(kwargs.get("is_blocking", True))}
    _record(name, TRANSFER, queue, ev, hb, he, attrs)
    return ev


def enqueue_fill_buffer(queue: Any, mem: Any, pattern: Any, offset: int, size: int,
                        wait_for: Any = None) -> Any:
    """``pyopencl.enqueue_fill_buffer``, recorded as a "fill" span with ``bytes`` while tracing."""
    if not _state.ENABLED:
        return _ORIG_FILL(queue, mem, pattern, offset, size, wait_for)
    hb = _perf()
    try:
        ev = _ORIG_FILL(queue, mem, pattern, offset, size, wait_for)
    except Exception as exc:
        _record_failure("fill", FILL, hb, exc, {"bytes": int(size)})
        raise
    he = _perf()
    _record("fill", FILL, queue, ev, hb, he, {"bytes": int(size), "pattern_bytes": _nbytes(pattern)})
    return ev


# ---- program builds ---------------------------------------------------------------------

_PYOPENCL_CACHE = {"cache retrieval": "hit", "source build resulting from a binary cache miss": "miss"}


def program_build(self: Any, options: Any = None, devices: Any = None, cache_dir: Any = None) -> Any:
    """``pyopencl.Program.build``, recorded as a "build" span on the compile track while tracing."""
    if not _state.ENABLED:
        return _ORIG_BUILD(self, options, devices, cache_dir)
    parent, path = current_parent()
    source = getattr(self, "_source", None)
    text = source.decode("utf-8", "replace") if isinstance(source, bytes) else source
    names = kernel_names(text) if text else []
    name = "build " + (",".join(names[:4]) if names else "program")
    attrs: dict[str, Any] = {"options": options if isinstance(options, str) else " ".join(options or ())}
    if source is not None:
        raw = source.encode("utf-8") if isinstance(source, str) else source
        attrs["source_hash"] = hashlib.sha256(raw).hexdigest()
    hb = _perf()
    try:
        result = _ORIG_BUILD(self, options, devices, cache_dir)
    except Exception as exc:
        he = _perf()
        attrs["build_log"] = str(exc)
        RECORDER.push((BUILD, name, new_id(), parent, path, COMPILE_THREAD, hb, he, None, None, None,
                       attrs, STATUS_ERROR, f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}",
                       _site(2)))
        raise
    he = _perf()
    info = getattr(self, "_build_duration_info", None)
    if info:
        attrs["pyopencl.build"] = info[0]
        attrs["cache"] = _PYOPENCL_CACHE.get(info[0], "none")
        attrs["cache_hit"] = bool(info[1])
    try:
        attrs["binary_size"] = sum(self.get_info(cl.program_info.BINARY_SIZES))
        logs = [(self.get_build_info(d, cl.program_build_info.LOG) or "").strip()
                for d in self.get_info(cl.program_info.DEVICES)]
        log = "\n".join(x for x in logs if x)
        if log:
            attrs["build_log"] = log
    except Exception:
        pass
    attrs["duration_ns"] = he - hb
    RECORDER.push((BUILD, name, new_id(), parent, path, COMPILE_THREAD, hb, he, None, None, None,
                   attrs, None, None, _site(2)))
    return result


# ---- blocking waits ----------------------------------------------------------------------

_BLOCKING = {"blocking": True}


def queue_finish(self: Any) -> Any:
    """``CommandQueue.finish``, recorded as a host-only "sync" span while tracing."""
    if not _state.ENABLED:
        return _ORIG_FINISH(self)
    hb = _perf()
    result = _ORIG_FINISH(self)
    record_launch("finish", None, None, hb, _perf(), SYNC, _BLOCKING)
    return result


def event_wait(self: Any) -> Any:
    """``Event.wait``, recorded as a host-only "sync" span while tracing."""
    if not _state.ENABLED:
        return _ORIG_EV_WAIT(self)
    hb = _perf()
    result = _ORIG_EV_WAIT(self)
    record_launch("wait", None, None, hb, _perf(), SYNC, _BLOCKING)
    return result


def wait_for_events(events: Any) -> Any:
    """``pyopencl.wait_for_events``, recorded as a host-only "sync" span while tracing."""
    if not _state.ENABLED:
        return _ORIG_WAIT_EVENTS(events)
    hb = _perf()
    result = _ORIG_WAIT_EVENTS(events)
    record_launch("wait", None, None, hb, _perf(), SYNC, _BLOCKING)
    return result


# ---- every other command -------------------------------------------------------------------

Info = Callable[[tuple, dict, Any], dict]


@dataclass(frozen=True)
class Command:
    """A pyopencl entry point that enqueues one command: where it lives, the span it gives,
    and ``info(args, kwargs, result)`` -> the span's attributes (``bytes`` where known)."""

    owner: Any
    attr: str
    name: str
    cat: str
    info: Info | None = None
    skip_own: bool = False  # calls from cltrace's own modules are not recorded


def _arg(args: tuple, kwargs: dict, i: int, key: str, default: Any = None) -> Any:
    return args[i] if len(args) > i else kwargs.get(key, default)


def _prod(xs: Any) -> int:
    n = 1
    for x in xs:
        n *= int(x)
    return n


def _mapped_bytes(args: tuple, kwargs: dict, res: Any) -> dict:
    return {"bytes": int(res[0].nbytes)}


def _image_fill_bytes(args: tuple, kwargs: dict, res: Any) -> dict:
    return {"bytes": _prod(_arg(args, kwargs, 4, "region")) * int(_arg(args, kwargs, 1, "mem").element_size)}


def _migrate_info(args: tuple, kwargs: dict, res: Any) -> dict:
    flags = int(_arg(args, kwargs, 2, "flags", 0) or 0)
    return {**_objects_bytes(1, "mem_objects")(args, kwargs, res),
            "to": "host" if flags & cl.mem_migration_flags.HOST else "device",
            "content_undefined": bool(flags & cl.mem_migration_flags.CONTENT_UNDEFINED)}


def _objects_bytes(i: int, key: str) -> Info:
    def info(args: tuple, kwargs: dict, res: Any) -> dict:
        return {"bytes": sum(int(m.size) for m in _arg(args, kwargs, i, key))}
    return info


def _svm_fill_bytes(args: tuple, kwargs: dict, res: Any) -> dict:
    n = _arg(args, kwargs, 3, "byte_count")
    dest = _arg(args, kwargs, 1, "dest")
    return {"bytes": int(n) if n is not None else _nbytes(getattr(dest, "mem", dest)) or getattr(dest, "size", None)}


def _svm_map_bytes(args: tuple, kwargs: dict, res: Any) -> dict:
    n = _arg(args, kwargs, 5, "size")
    return {"bytes": int(n) if n is not None else getattr(_arg(args, kwargs, 3, "svm"), "size", None)}


def _svm_bytes(args: tuple, kwargs: dict, res: Any) -> dict:
    return {"bytes": getattr(_arg(args, kwargs, 1, "svm"), "size", None)}


def _p2p_bytes(args: tuple, kwargs: dict, res: Any) -> dict:
    n = _arg(args, kwargs, 4, "byte_count")
    return {"bytes": int(n) if n is not None else getattr(_arg(args, kwargs, 2, "src"), "size", None)}


def _waits(args: tuple, kwargs: dict, res: Any) -> dict:
    return {"wait_for": len(_arg(args, kwargs, 1, "wait_for") or ())}


# Every command-enqueuing entry point not hooked above. enqueue_fill reaches the driver through
# enqueue_fill_buffer / enqueue_svm_memfill (looked up in the module), SVM copies through enqueue_copy.
COMMANDS: tuple[Command, ...] = (
    Command(cl, "enqueue_fill_image", "fill image", FILL, _image_fill_bytes),
    Command(cl, "enqueue_svm_memfill", "fill SVM", FILL, _svm_fill_bytes),
    Command(cl, "enqueue_map_buffer", "map buffer", TRANSFER, _mapped_bytes),
    Command(cl, "enqueue_map_image", "map image", TRANSFER, _mapped_bytes),
    Command(_cl.MemoryMap, "release", "unmap", TRANSFER),
    Command(_cl, "_enqueue_svm_map", "map SVM", TRANSFER, _svm_map_bytes),
    Command(_cl, "_enqueue_svm_unmap", "unmap SVM", TRANSFER, _svm_bytes),
    Command(cl, "enqueue_migrate_mem_objects", "migrate", TRANSFER, _migrate_info),
    Command(cl, "enqueue_svm_migrate_mem", "migrate SVM", TRANSFER, _objects_bytes(1, "svms")),
    Command(cl, "enqueue_copy_buffer_p2p_amd", "copy P2P", TRANSFER, _p2p_bytes),
    Command(cl, "enqueue_marker", "marker", MARKER, _waits, skip_own=True),
    Command(cl, "enqueue_barrier", "barrier", MARKER, _waits, skip_own=True),
)


def _from_cltrace() -> bool:
    """Whether the hook's caller is cltrace itself (two frames up: caller -> hook -> here)."""
    return sys._getframe(2).f_globals.get("__name__", "").startswith("cltrace.")


def _queue_of(args: tuple, kwargs: dict, ev: Any) -> Any:
    for a in args[:2]:
        if isinstance(a, _ORIG_QUEUE):
            return a
    q = kwargs.get("queue")
    return q if q is not None else ev.command_queue


def command_hook(original: Any, cmd: Command) -> Any:
    """A stand-in for ``original`` recording each call as one ``cmd`` span while tracing."""
    name, cat, info, skip_own = cmd.name, cmd.cat, cmd.info, cmd.skip_own

    def attrs_of(args: tuple, kwargs: dict, res: Any) -> dict[str, Any]:
        try:
            return info(args, kwargs, res) if info is not None else {}
        except Exception:  # attributes are best effort: never break the program for them
            return {}

    def hook(*args: Any, **kwargs: Any) -> Any:
        if not _state.ENABLED or (skip_own and _from_cltrace()):
            return original(*args, **kwargs)
        hb = _perf()
        try:
            res = original(*args, **kwargs)
        except Exception as exc:
            _record_failure(name, cat, hb, exc, attrs_of(args, kwargs, None))
            raise
        he = _perf()
        try:
            ev = res[1] if isinstance(res, tuple) else res
            queue = _queue_of(args, kwargs, ev)
        except Exception:
            return res
        _record(name, cat, queue, ev, hb, he, attrs_of(args, kwargs, res))
        return res

    for a in ("__name__", "__qualname__", "__doc__"):
        try:
            setattr(hook, a, getattr(original, a))
        except (AttributeError, TypeError):
            pass
    hook.__wrapped__ = original  # type: ignore[attr-defined]
    return hook


# ---- queues ---------------------------------------------------------------------------

class _QueueMeta(type):
    """Makes the stand-in behave as pyopencl's class for isinstance/issubclass/attributes."""

    def __call__(cls, context: Any, device: Any = None, properties: Any = None) -> Any:
        if properties is None:
            properties = PROFILING
        else:
            try:
                properties = properties | PROFILING
            except TypeError:
                pass
        return _ORIG_QUEUE(context, device, properties)

    def __instancecheck__(cls, obj: Any) -> bool:
        return isinstance(obj, _ORIG_QUEUE)

    def __subclasscheck__(cls, sub: type) -> bool:
        return issubclass(sub, _ORIG_QUEUE)

    def __getattr__(cls, name: str) -> Any:
        return getattr(_ORIG_QUEUE, name)


class CommandQueue(metaclass=_QueueMeta):
    """``pyopencl.CommandQueue`` while instrumented: creates real pyopencl queues with PROFILING_ENABLE."""


# ---- install / remove ---------------------------------------------------------------------

def _gated(original: Any, hook: Any) -> Any:
    """``hook`` behind the C gate where the extension is built: launch's and copy's own commands, and
    every call with tracing off, reach ``original`` without a Python frame."""
    return hook if Gate is None else Gate(original, hook)


def _hooks() -> list[tuple[Any, str, Any]]:
    return [
        (_cl, "enqueue_nd_range_kernel", _gated(_cl.enqueue_nd_range_kernel, enqueue_nd_range_kernel)),
        (cl, "enqueue_nd_range_kernel", _gated(cl.enqueue_nd_range_kernel, enqueue_nd_range_kernel)),
        (cl, "enqueue_copy", _gated(cl.enqueue_copy, enqueue_copy)),
        (cl, "enqueue_fill_buffer", enqueue_fill_buffer),
        (cl.Program, "build", program_build),
        (_cl.CommandQueue, "finish", queue_finish),
        (_cl.Event, "wait", event_wait),
        (_cl, "wait_for_events", wait_for_events),
        (cl, "wait_for_events", wait_for_events),
        (cl, "CommandQueue", CommandQueue),
        *((cl, name, cls) for name, cls in _memory_classes()),
        *((cl_tools, name, cls) for name, cls in _pool_classes()),
    ]


def instrument(*, for_session: bool = False) -> None:
    """Hook pyopencl so work issued through it is traced (while tracing is on). Idempotent.
    ``for_session``: installed by ``start()`` for its session only (taken off at its ``stop()`` unless
    ``instrument()`` was called for more meanwhile)."""
    global _warned, ACTIVE
    global _asked
    with _lock:
        if not for_session:
            _asked = True
        if _saved:
            return
        _warned = False
        _set_originals(_cl.enqueue_nd_range_kernel, cl.enqueue_copy, cl.enqueue_fill_buffer,
                       cl.Program.build, cl.CommandQueue)
        _set_waits(_cl.CommandQueue.finish, _cl.Event.wait, _cl.wait_for_events)
        for owner, attr, hook in _hooks():
            _saved.append((owner, attr, attr in vars(owner), getattr(owner, attr)))
            setattr(owner, attr, hook)
        for cmd in COMMANDS:
            original = getattr(cmd.owner, cmd.attr, None)
            if original is None:  # not in this pyopencl
                continue
            _saved.append((cmd.owner, cmd.attr, cmd.attr in vars(cmd.owner), original))
            setattr(cmd.owner, cmd.attr, command_hook(original, cmd))
        ACTIVE = _state.INSTRUMENTED = True
        update_region_mode()


def _set_originals(ndrange: Any, copy: Any, fill: Any, build: Any, queue: Any) -> None:
    global _ORIG_NDRANGE, _ORIG_COPY, _ORIG_FILL, _ORIG_BUILD, _ORIG_QUEUE
    _ORIG_NDRANGE, _ORIG_COPY, _ORIG_FILL, _ORIG_BUILD, _ORIG_QUEUE = ndrange, copy, fill, build, queue


def _set_waits(finish: Any, wait: Any, wait_events: Any) -> None:
    global _ORIG_FINISH, _ORIG_EV_WAIT, _ORIG_WAIT_EVENTS
    _ORIG_FINISH, _ORIG_EV_WAIT, _ORIG_WAIT_EVENTS = finish, wait, wait_events


def uninstrument() -> None:
    """Put back every pyopencl attribute ``instrument()`` replaced (the very same objects)."""
    global ACTIVE, _asked
    with _lock:
        _asked = False
        ACTIVE = _state.INSTRUMENTED = False
        update_region_mode()
        while _saved:
            owner, attr, own, original = _saved.pop()
            if own:
                setattr(owner, attr, original)
            else:
                delattr(owner, attr)


def instrumented() -> bool:
    """Whether the hooks are installed."""
    return ACTIVE


def asked() -> bool:
    """Whether ``instrument()`` was called for more than a session (the user, ``cltrace run``)."""
    return _asked
