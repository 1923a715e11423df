"""Named, nested regions and launch recording: the hot path.

Off: ``timing_region`` is one flag read and returns a shared no-op whose
``__enter__``/``__exit__`` are C callables (no frame, no allocation).
On: a region takes two host clock reads, its call site (``callsite.capture``)
and, with a queue, two markers; its record is a tuple pushed onto the
recorder's deque at exit. A launch or transfer recorded here carries its call site too. Its
``__enter__``/``__exit__`` run in C (``_region``) where the extension is built,
else in ``_Region`` below: same records, same shared stack, ids and deque.
``REGION_PATH`` says which ("native" or "python"); ``CLTRACE_NATIVE=0`` forces Python.
While an OTLP sink is attached, regions are ``otel_context.OtelRegion`` (swapped in, no flag here).
"""
from __future__ import annotations

import functools
import itertools
import os
import sys
import threading
import time
from typing import Any, Callable, TypeVar

import pyopencl as cl

from .. import _state
from .._native import choose, extension
from ..errors import ProfilingNotEnabledError
from .failures import named_error, sizes
from . import queues as _queues
from .callsite import capture as _site
from .queues import PROFILING, active_queue
from .recorder import RECORDER, new_id
from ..timeline import stamps
from ..timeline.spans import KERNEL, REGION, REGION_CATS, STATUS_ERROR, TRANSFER

F = TypeVar("F", bound=Callable[..., Any])

_perf = time.perf_counter_ns
_marker = cl.enqueue_marker
_get_ident = threading.get_ident
_push = RECORDER.push
_pending = RECORDER.pending
_pending_append = _pending.append
_new_region = object.__new__
_ROOT: tuple[int, tuple[str, ...]] = (0, ())


class _Stack(list):
    """A thread's open regions, (span id, path) each, the thread key its records carry, and the last
    command it launched with an event (``last_q``, ``last_ev``): where a projected region's device span ends."""

    __slots__ = ("key", "last_q", "last_ev")


class _ThreadState(threading.local):
    """Per-thread region stack; created on a thread's first region or launch."""

    def __init__(self) -> None:
        self.stack = st = _Stack()
        # The track is made and named now: by resolve time a short-lived thread has exited.
        st.key = RECORDER.tracks.new_thread(_get_ident(), threading.current_thread().name)
        st.last_q = st.last_ev = None


_tls = _ThreadState()


def _reset_after_fork() -> None:
    """In a forked child: the forking thread's open regions are the parent's spans; the child's
    records start at the root (the same list: the C regions hold it). The queue given to
    ``set_queue`` is the parent's: OpenCL objects do not cross a fork."""
    _tls.stack.clear()
    _queues._default_queue = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_after_fork)  # after the recorder's reset


def thread_key() -> int:
    """The key this thread's records carry in their thread field (its OS ident, made unique)."""
    return _tls.stack.key


def current_parent() -> tuple[int, tuple[str, ...]]:
    """(span id, path) of the innermost open region on this thread, or the root."""
    st = _tls.stack
    return st[-1] if st else _ROOT


class _Region:
    """A region on the pure-Python path (``_region.Region`` in C). ``project``: its device span is projected
    from the commands it launched on its queue (``set_region_mode``), else bracketed by two markers."""

    __slots__ = ("name", "queue", "attrs", "cat", "project", "_st", "_id", "_parent", "_path", "_hb", "_ev0",
                 "_site")

    def __init__(self, name: str, queue: Any, attrs: dict[str, Any] | None, cat: str = REGION,
                 project: bool = False) -> None:
        self.name = name
        self.queue = queue
        self.attrs = attrs
        self.cat = cat
        self.project = project

    def __enter__(self) -> "_Region":
        self._st = st = _tls.stack  # a region closes on the thread that opened it
        parent, ppath = st[-1] if st else _ROOT
        self._id = sid = new_id()
        self._parent = parent
        self._path = path = ppath + (self.name,)
        st.append((sid, path))
        self._site = _site(2)
        q = self.queue
        self._hb = _perf()  # host bracket encloses the markers' QUEUED stamps
        # Projected: the thread's last command so far marks where the region's own commands begin.
        self._ev0 = None if q is None else st.last_ev if self.project else _marker(q)
        return self

    def __exit__(self, et: Any, ev: Any, tb: Any) -> None:
        q = self.queue
        st = self._st
        e0, ev1 = self._ev0, None
        if q is not None:
            if not self.project:
                ev1 = _marker(q)
            else:
                e0, q = _projected(st, q, e0)
        he = _perf()
        sid = self._id
        if st and st[-1][0] == sid:
            st.pop()
        else:  # closed out of order (generator/async misuse): remove wherever it is
            st[:] = [e for e in st if e[0] != sid]
        if not st and self.project:  # the thread's last command is no region's end now
            st.last_q = st.last_ev = None
        if et is None:
            _pending_append((self.cat, self.name, sid, self._parent, self._path, st.key, self._hb, he,
                             q, e0, ev1, self.attrs, None, None, self._site))
        else:
            _pending_append((self.cat, self.name, sid, self._parent, self._path, st.key, self._hb, he,
                             q, e0, ev1, self.attrs, STATUS_ERROR, f"{et.__name__}: {ev}", self._site))
        if len(_pending) >= RECORDER.room:
            RECORDER.make_room()

    def set(self, key: str, value: Any) -> None:
        """Attach an attribute to this region."""
        if self.attrs is None:
            self.attrs = {}
        self.attrs[key] = value

    def __call__(self, fn: F) -> F:
        return _decorate(fn, self.name, self.queue, self.attrs, self.cat)


def _projected(st: _Stack, q: Any, mark: Any) -> tuple[Any, Any]:
    """(event, queue) of a projected region's record, at its exit: the last command the thread launched on
    ``q`` since the region began (``mark``: its last command then), whose END is the region's device end
    (the resolver widens its START to its commands' first); a marker where the thread's last command went
    to another queue; (None, None), host only, where it launched nothing."""
    last = st.last_ev
    if last is None or last is mark:
        return None, None
    return (last, q) if _same_queue(st.last_q, q) else (_marker(q), q)


def _same_queue(a: Any, b: Any) -> bool:
    """The same OpenCL queue (two pyopencl wrappers of one queue are different objects)."""
    return a is b or getattr(a, "int_ptr", None) == getattr(b, "int_ptr", 0)


class _NoopRegion:
    """The shared object returned while tracing is off."""

    __slots__ = ()

    def set(self, key: str, value: Any) -> None:
        pass

    def __call__(self, fn: F) -> F:
        return _decorate(fn, _last_name, _last_queue, _last_attrs, REGION)


NOOP = _NoopRegion()
# C callables: entering/exiting the no-op runs no Python frame. "".format(*exc) returns ""
# (falsy), so exceptions propagate.
_NoopRegion.__enter__ = itertools.repeat(NOOP).__next__  # type: ignore[attr-defined]
_NoopRegion.__exit__ = "".format  # type: ignore[attr-defined]
# Arguments of the last timing_region call made while off, read if NOOP decorates a function.
_last_name: str = ""
_last_queue: Any = None
_last_attrs: dict[str, Any] | None = None


def _decorate(fn: F, name: str, queue: Any, attrs: dict[str, Any] | None, cat: str) -> F:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not _state.ENABLED:
            return fn(*args, **kwargs)
        with _open(name, queue, dict(attrs) if attrs else None, cat):
            return fn(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


def _load_native() -> Any:
    """The C region type, initialised with the state the Python one uses."""
    _region = extension("region")
    base = type(_tls).__base__  # CPython's own, not a per-greenlet local (gevent patches threading.local)
    per_os_thread = (base.__module__, base.__qualname__) == ("_thread", "_local")
    _region.init(_tls, new_id.__self__, _pending, RECORDER, _marker, _decorate,  # type: ignore[attr-defined]
                 STATUS_ERROR, REGION, per_os_thread, bool(stamps.REAPER))
    return _region.Region


_CHOICE = choose("regions", _load_native)
_NativeRegion: Any = _CHOICE.native
REGION_WHY: str = _CHOICE.why  # why the C region is not used ("" when it is)
REGION_PATH: str = _CHOICE.path
REGION_DETAIL: str = _CHOICE.detail
_RegionType: Any = _Region if _NativeRegion is None else _NativeRegion
# Launches and copies push through C too: each record untracked by the cyclic GC, its events traded
# for the reaper's tickets (timeline/stamps.py). None on the Python fallback.
native_push: Any = None if _NativeRegion is None else sys.modules[_NativeRegion.__module__].push
if native_push is not None:
    _push = native_push


def swap_region_types(types: tuple[Any, Any]) -> tuple[Any, Any]:
    """Make ``timing_region`` build ``types[0]`` and the other region paths ``types[1]``; returns
    the pair in use before. ``otel_context`` routes regions through its own type this way while an
    OTLP sink is attached, so the region path carries no flag for it."""
    global _NativeRegion, _RegionType
    old = (_NativeRegion, _RegionType)
    _NativeRegion, _RegionType = types
    return old


def timing_region(name: str, queue: Any = None, attrs: dict[str, Any] | None = None) -> Any:
    """A named region of work: ``with timing_region("forward", queue):`` or ``@timing_region("step")``.

    With ``queue`` (or an active queue from ``cltrace.set_queue``) the region also
    gets a device span on that queue's track, bracketed by two markers. Regions nest
    per thread; an exception closes the region and marks it failed. ``attrs`` are
    attached to the span. Off, this is one flag read, three global stores (kept for
    ``NOOP`` used as a decorator) and the shared ``NOOP``: nothing is allocated.
    """
    global _last_name, _last_queue, _last_attrs
    if not _state.ENABLED:
        _last_name = name
        _last_queue = queue
        _last_attrs = attrs
        return NOOP
    if queue is None:
        queue = _queues._default_queue
    project = queue is not None and _projects(queue, name)
    if _NativeRegion is not None:
        r = _NativeRegion(name, queue, attrs)
        if project:
            r.project = True
        return r
    r = _new_region(_Region)  # no __init__ frame: about a fifth of an enabled region's cost
    r.name = name
    r.queue = queue
    r.attrs = attrs
    r.cat = REGION
    r.project = project
    return r


def _projects(queue: Any, name: str) -> bool:
    """Whether a region on ``queue`` projects its device span from its commands: while regions are
    projected, on an in-order queue (on an out-of-order one the last command launched need not be the
    last to end, and the next region's commands may run beside it: two markers, which wait for what
    came before, bracket it). A queue without profiling is ``ProfilingNotEnabledError``."""
    props = queue.properties  # asked of the driver each time (see queues.has_profiling)
    if not props & PROFILING:  # the message is built only on failure
        raise ProfilingNotEnabledError(f"timing_region({name!r})")
    return _state.PROJECT_REGIONS and not props & _OUT_OF_ORDER


def category_region(name: str, queue: Any = None, attrs: dict[str, Any] | None = None,
                    cat: str = REGION) -> Any:
    """``timing_region`` with another category from ``spans.REGION_CATS`` (the autotuner's
    ``"autotune"``/``"trial"`` spans). Not usable as a decorator while tracing is off."""
    if not _state.ENABLED:
        return NOOP
    return _open(name, queue, attrs, cat)


def _open(name: str, queue: Any, attrs: dict[str, Any] | None, cat: str) -> "_Region":
    if cat not in REGION_CATS:
        raise ValueError(f"cat must be one of {sorted(REGION_CATS)}, not {cat!r}")
    if queue is None:
        queue = active_queue()
    project = queue is not None and _projects(queue, name)
    r = _RegionType(name, queue, attrs, cat)
    if project:
        r.project = True
    return r


region = timing_region

class _Own(threading.local):
    on = False  # inside launch/copy's enqueue (the pure-Python path's flag; C keeps its own)
    hooked: Any = None  # the event of the last command the hooks recorded on this thread, and its span id
    hooked_sid = 0


OWN = _Own()
_OUT_OF_ORDER = cl.command_queue_properties.OUT_OF_ORDER_EXEC_MODE_ENABLE
Gate: Any = None  # the C gate in front of pyopencl's hooked entry points (capture/instrument.py), where built


def own_on() -> bool:
    """Whether this thread is inside ``launch``/``copy``'s enqueue: pyopencl's hooks
    (``capture/instrument.py``) then leave the command to them, which record it under its own name."""
    return OWN.on


def set_own(flag: bool) -> bool:
    """Set ``own_on()`` for this thread; returns what it was."""
    was, OWN.on = OWN.on, bool(flag)
    return was

REGION_MODES = ("auto", "projected", "markers")
_region_mode = "auto"


def set_region_mode(mode: str) -> None:
    """How regions on a queue get their device span: ``"projected"`` from the commands they launch there (no
    command of their own), ``"markers"`` bracketed by two markers, ``"auto"`` projected while every pyopencl
    enqueue is traced (``cltrace.instrument()``, ``cltrace run``), else markers."""
    global _region_mode
    if mode not in REGION_MODES:
        raise ValueError(f"regions must be one of {', '.join(REGION_MODES)}, not {mode!r}")
    _region_mode = mode
    update_region_mode()


def update_region_mode() -> None:
    """Recompute ``_state.PROJECT_REGIONS`` (the mode was set, or pyopencl's hooks came or went)."""
    _state.PROJECT_REGIONS = _region_mode == "projected" or (_region_mode == "auto" and _state.INSTRUMENTED)


def region_mode() -> str:
    """The mode ``set_region_mode`` set, and what it means now: ``"auto (projected)"``."""
    now = "projected" if _state.PROJECT_REGIONS else "markers"
    return f"{_region_mode} ({now})" if _region_mode == "auto" else _region_mode


_CALLER: Any = object()  # record_launch's default site: its caller's (found by walking up)


def record_launch(name: str, queue: Any, event: Any, host_begin: int, host_end: int,
                  cat: str = KERNEL, attrs: dict[str, Any] | None = None, site: Any = _CALLER) -> int:
    """Record one enqueued command (kernel, copy, fill...) and return its span id.

    The event is resolved later in a batch; nothing waits here. Pass ``queue=None``
    (or ``event=None``) for an explicitly host-only span. ``site`` is the call site
    (``callsite.capture()``), by default the caller's; a cltrace helper that has it passes
    it, saving the walk through its own frame. An event that pyopencl's hooks recorded already (the
    last command this thread enqueued through pyopencl while tracing) is not recorded twice: its span's
    id is returned.
    """
    if event is not None and OWN.hooked is event:
        return OWN.hooked_sid
    return _record(name, queue, event, host_begin, host_end, cat, attrs, _site(2) if site is _CALLER else site)


def record_hooked(name: str, queue: Any, event: Any, host_begin: int, host_end: int, cat: str,
                  attrs: dict[str, Any] | None, site: Any) -> int:
    """``record_launch`` for pyopencl's hooks: the command is remembered as this thread's last hooked
    one, so a ``record_launch`` of the same event by the program adds no second span."""
    sid = _record(name, queue, event, host_begin, host_end, cat, attrs, site)
    OWN.hooked, OWN.hooked_sid = event, sid
    return sid


def _record_py(name: str, queue: Any, event: Any, host_begin: int, host_end: int, cat: str,
               attrs: dict[str, Any] | None, site: Any) -> int:
    st = _tls.stack
    parent, path = st[-1] if st else _ROOT
    sid = new_id()
    _push((cat, name, sid, parent, path, st.key, host_begin, host_end,
           queue, event, None, attrs, None, None, site))
    if st and event is not None and queue is not None and _state.PROJECT_REGIONS:  # where open regions end so far
        st.last_q = queue
        st.last_ev = event
    return sid


# A launch's or copy's record: ``_record_py`` in C where the extension is built.
_record: Callable[[str, Any, Any, int, int, str, Any, Any], int] = (
    _record_py if _NativeRegion is None else sys.modules[_NativeRegion.__module__].record_launch)


def record_failure(name: str, cat: str, host_begin: int, exc: BaseException,
                   attrs: dict[str, Any] | None) -> None:
    """Record a command that failed to enqueue: a host-only span with status error."""
    parent, path = current_parent()
    _push((cat, name, new_id(), parent, path, thread_key(), host_begin, _perf(),
           None, None, None, attrs, STATUS_ERROR, f"{type(exc).__name__}: {exc}", _site(2)))


def failed_launch(exc: Exception, name: str, global_size: Any, local_size: Any, host_begin: int | None,
                  kernel: Any = None, queue: Any = None) -> Exception:
    """The error path of every launch site: a failed "kernel" span (when tracing) and the error
    to raise in ``exc``'s place, naming the kernel and its sizes (see ``failures``)."""
    gs, ls = sizes(global_size), sizes(local_size)
    if _state.ENABLED and not getattr(exc, "cltrace_launch", None):
        record_failure(name, KERNEL, _perf() if host_begin is None else host_begin, exc,
                       {"global_size": gs, "local_size": ls})
    return named_error(exc, name, gs, ls, kernel, queue)


def _launch_py(kernel: Any, queue: Any, global_size: Any, local_size: Any, *args: Any,
               wait_for: Any = None, name: str | None = None) -> Any:
    """Enqueue a pyopencl kernel and record it (when tracing is on). Returns the event.

    A ``cltrace.Kernel`` records its own launches, so then this records nothing more. While
    pyopencl is hooked (tracing records its enqueues), the hooks leave this launch to this
    function (``OWN``), so ``name`` holds. A failed enqueue leaves a failed span and raises the
    same pyopencl error, naming the kernel and its sizes.
    """
    if not _state.ENABLED:
        return kernel(queue, global_size, local_size, *args, wait_for=wait_for)
    known = _KERNELS.get(id(kernel))
    own = known[1] if known is not None and known[0] is kernel else _learn(kernel)
    if own is None:  # a cltrace.Kernel: it records its own launches
        return kernel(queue, global_size, local_size, *args, wait_for=wait_for)
    hb = _perf()
    was = set_own(True)
    try:
        ev = kernel(queue, global_size, local_size, *args, wait_for=wait_for)
    except cl.Error as exc:
        raise failed_launch(exc, name or own, global_size, local_size, hb, kernel, queue) from None
    finally:
        set_own(was)
    he = _perf()
    _record(name or own, queue, ev, hb, he, KERNEL, launch_attrs(global_size, local_size), _site(2))
    return ev


# id(kernel) -> (kernel, its name, or None where it records its own launches). pyopencl's
# ``function_name`` asks the driver each time (~0.2-0.5 us) and a Kernel takes no weak reference:
# the entries hold their kernels (so an id is never reused while cached), at most _KERNELS_MAX of
# them, forgotten when tracing stops (``forget_kernels``).
_KERNELS: dict[int, tuple[Any, str | None]] = {}
_KERNELS_MAX = 64


def _learn(kernel: Any) -> str | None:
    own = None if getattr(kernel, "records_launches", False) else _kernel_name(kernel)
    if len(_KERNELS) >= _KERNELS_MAX:
        _KERNELS.clear()
    _KERNELS[id(kernel)] = (kernel, own)
    return own


def launch_name(kernel: Any) -> str:
    """A kernel's name for its spans, remembered as ``launch`` remembers it (the driver's answer costs ~1 us)."""
    known = _KERNELS.get(id(kernel))
    own = known[1] if known is not None and known[0] is kernel else _learn(kernel)
    return own if own is not None else _kernel_name(kernel)


def forget_kernels() -> None:
    """Drop the kernels ``launch`` remembered (tracing stopped: they may be freed)."""
    _KERNELS.clear()


def _kernel_name(kernel: Any) -> str:
    """A kernel object's name: pyopencl's ``function_name``, else ``name``, else its type."""
    name = getattr(kernel, "function_name", None) or getattr(kernel, "name", None)
    return name if isinstance(name, str) else type(kernel).__name__


def _size_tuple(v: Any) -> tuple[int, ...] | None:
    if not v:
        return None
    try:
        return tuple(v)
    except TypeError:  # a plain int size
        return (v,)


def shape_attrs(size: Callable[[Any], Any]) -> tuple[Callable[[Any, Any], dict[str, Any]], dict[Any, dict[str, Any]]]:
    """``(attrs, cache)``: ``attrs(global_size, local_size)`` gives one shared attrs dict per launch shape, kept
    in ``cache``, each size written by ``size``: nothing allocated per launch, encoded once per sink (a dict a
    launch cost the Chrome sink ~9 us of the worker's time a span). A closure, not a function with the cache
    as a parameter: the hot path calls it once a launch."""
    cache: dict[Any, dict[str, Any]] = {}

    def attrs(global_size: Any, local_size: Any) -> dict[str, Any]:
        try:
            return cache[(global_size, local_size)]
        except KeyError:
            pass
        except TypeError:  # sizes given as lists or arrays
            return {"global_size": size(global_size), "local_size": size(local_size)}
        made = {"global_size": size(global_size), "local_size": size(local_size)}
        if len(cache) < 4096:
            cache[(global_size, local_size)] = made
        return made

    return attrs, cache


launch_attrs, _ATTRS = shape_attrs(_size_tuple)  # ``launch``'s; the pyopencl hooks keep their own, sizes as lists


# ``launch``: the C one (``_region.launch``, the same behaviour without a Python frame of its own for a
# kernel seen before) where the extension is built, else ``_launch_py``.
launch: Callable[..., Any] = _launch_py
if _NativeRegion is not None:
    _native_mod = sys.modules[_NativeRegion.__module__]
    _native_mod.launch_init(_state, _KERNELS, _ATTRS, _launch_py, launch_attrs, failed_launch, cl.Error, KERNEL)
    own_on, set_own = _native_mod.own, _native_mod.set_own
    Gate = _native_mod.Gate
    launch = _native_mod.launch


def copy(queue: Any, dest: Any, src: Any, name: str | None = None, **kwargs: Any) -> Any:
    """``cl.enqueue_copy`` (non-blocking unless ``is_blocking=True``), recorded as a "transfer"
    span with its byte count when tracing is on. Returns the event. A copy between two memory objects
    (buffer, image) takes no ``is_blocking``: it never blocks the host."""
    if not (isinstance(dest, cl.MemoryObjectHolder) and isinstance(src, cl.MemoryObjectHolder)):
        kwargs.setdefault("is_blocking", False)
    if not _state.ENABLED:
        return cl.enqueue_copy(queue, dest, src, **kwargs)
    nbytes = next((getattr(b, "nbytes", None) for b in (src, dest) if getattr(b, "nbytes", None)), None)
    if nbytes is None:
        nbytes = next((b.size for b in (dest, src) if isinstance(b, cl.MemoryObject)), None)
    hb = _perf()
    was = set_own(True)
    try:
        ev = cl.enqueue_copy(queue, dest, src, **kwargs)
    finally:
        set_own(was)
    he = _perf()
    _record(name or "copy", queue, ev, hb, he, TRANSFER, {"bytes": nbytes, "direction": direction(dest, src)},
            _site(2))
    return ev


_DEVICE_MEMORY = tuple(t for t in (getattr(cl, "MemoryObjectHolder", None), getattr(cl, "SVMPointer", None)) if t)


def direction(dest: Any, src: Any) -> str:
    """A copy's direction, as ``analyze`` groups transfer bandwidth: HtoD, DtoH, DtoD (or HtoH)."""
    d, s = isinstance(dest, _DEVICE_MEMORY), isinstance(src, _DEVICE_MEMORY)
    return f"{'D' if s else 'H'}to{'D' if d else 'H'}"
