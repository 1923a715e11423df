"""Launching a ``Program``'s kernels: ``Kernel`` and the launchers it generates.

``Kernel`` launches with ``knl[global_size, local_size, queue](*args)`` or
pyopencl's own ``knl(queue, global_size, local_size, *args)``. Everything that
is not the enqueue (kernel creation, generating the launcher, binding
arguments) happens before the measured host interval. With tracing off and no
``profile``, ``knl[gs, ls, q](*args)`` is a dict lookup and one generated frame
that reads the flag, binds the arguments and enqueues.
"""
from __future__ import annotations

import logging
import time
from typing import Any, Protocol, Sequence

import numpy as np
import pyopencl as cl
import pyopencl._cl as _cl

from .. import _state
from ..errors import ProfilingNotEnabledError
from ..record.callsite import capture
from ..record.queues import has_profiling
from ..record.recorder import RECORDER, new_id
from ..record import regions
from ..record.regions import _ROOT, _tls, failed_launch
from .context import default_queue
from ..timeline.spans import KERNEL

log = logging.getLogger("cltrace")


class Program(Protocol):
    """What a ``Kernel`` needs of its program (``compiler.Program`` is one)."""

    program: cl.Program
    context: cl.Context
    devices: tuple[cl.Device, ...]  # the devices it was built for
    tuned: dict[str, Any] | None

    def _take_compile_charge(self) -> int: ...

_perf = time.perf_counter_ns
# Captured at import: cltrace's own launches must not go through instrument()'s hooks.
_ENQUEUE = _cl.enqueue_nd_range_kernel

# Arguments bound on the traced path are remembered when, for each of them, comparing equal
# to the next call's argument means the kernel would receive the same thing: memory objects
# (equal = same cl_mem), integers, and floats other than zero (0.0 == -0.0, bytes differ).
# The next launch then skips re-binding when ``args == last`` (a C-level tuple compare).
_EQ_SAFE = (cl.MemoryObjectHolder, cl.LocalMemory, int, np.integer, type(None))
_FLOATS = (float, np.floating)


_GIVE_UP = 16  # misses after which a Kernel mostly stops remembering its arguments (Kernel._bind_args)


def _eq_means_same(a: Any) -> bool:
    if isinstance(a, _EQ_SAFE):
        return True
    return isinstance(a, _FLOATS) and a != 0 and a == a


def _invoker(knl: Any, nargs: int, arg_types: Sequence[Any] | None) -> tuple[Any, Any]:
    """pyopencl's generated (enqueue, set_args) functions for a kernel; pyopencl's own entry points otherwise."""
    try:
        from pyopencl.invoker import generate_enqueue_and_set_args

        enq, set_args = generate_enqueue_and_set_args(
            knl.function_name, nargs, knl.num_args, None if arg_types is None else tuple(arg_types),
            warn_about_arg_count_bug=False, work_around_arg_count_bug=False, devs=knl.context.devices)
        return enq, set_args
    except Exception as exc:  # a pyopencl without the invoker: slower, still correct
        log.debug("cltrace: pyopencl invoker unavailable (%s); using Kernel.__call__", exc)
        return _cl.Kernel.__call__, _cl.Kernel.set_args


# A launcher is a plain function of exactly the kernel's arguments, made from this template
# (compiled once per arity and argument handling, as pyopencl does for its invokers). Its first
# call goes through ``first_launch``: the kernel's first launch (of any launcher) carries the
# program's compile charge; later calls pay one closure read for it.
# Tracing off and no profile: bind the arguments (``_set_arg_multi`` as pyopencl's generic
# invoker does, the kernel's scalar setter (``_scalar_setter``) where it takes numpy scalars, or
# pyopencl's typed invoker) and enqueue, in one frame. Otherwise the
# measured launch: arguments bound first (skipped when unchanged), then two clock reads
# around the enqueue alone, then the span record (with the caller's call site) and/or the profile. The record is what
# ``regions.record_launch`` pushes, appended here without its two calls (the floor of a
# traced launch); the globals it uses are ``_RECORD_GLOBALS``. A pyopencl error from the
# enqueue leaves through ``_failed`` (the try costs nothing until something is raised).
_TEMPLATE = """
def make(state, enq, setm, enqueue, knl, queue, gs, ls, tknl, owner, perf, profile_error, m, fresh):
    first = True

    def first_launch(args, profile, wait_for):
        nonlocal first
        first = False
        owner._learn(args)
        m.charge = owner._first() if type(owner) is fresh else 0
        try:
            return launch(*args, profile=profile, wait_for=wait_for)
        finally:
            m.charge = 0

    def launch({params}*, profile=None, wait_for=None):
        if first:
            return first_launch(({params}), profile, wait_for)
        if profile is None and not state.ENABLED:
            try:
                {fast}
            except cl_error as exc:
                raise failed(exc, m, queue, None) from None
        if profile is not None and not m.profiled:
            raise profile_error(m.name)
        args = ({params})
        try:
            same = args == owner._last
        except Exception:  # e.g. an ndarray argument: compare as different
            same = False
        if not same:
            try:
                owner._bind_args(args)
            except cl_error as exc:  # an argument the kernel refuses: a failed span and the error naming the launch
                raise failed(exc, m, queue, None) from None
        hb = perf()
        try:
            ev = enqueue(queue, tknl, gs, ls, None, wait_for, False, False)
        except cl_error as exc:
            raise failed(exc, m, queue, hb) from None
        he = perf()
        if state.ENABLED:
            st = tls.stack
            parent, path = st[-1] if st else root
            if m.profiled:
                {push}(({cat!r}, m.name, new_id(), parent, path, st.key, hb, he,
                        queue, ev, None, m.attrs, None, None, site(2)))
                if st and state.PROJECT_REGIONS:  # where the open projected regions end so far
                    st.last_q = queue
                    st.last_ev = ev
            else:
                {push}(({cat!r}, m.name, new_id(), parent, path, st.key, hb, he,
                        None, None, None, m.attrs, None, None, site(2)))
            {room}
        if profile is not None:
            profile._add(ev, queue, hb, he, m.name, m.from_cache, m.charge)
        return ev
    return launch
"""


def _failed(exc: Exception, m: "_LaunchMeta", queue: Any, hb: int | None) -> Exception:
    """The error path of a launcher: a failed span (when tracing) and the error naming the launch."""
    return failed_launch(exc, m.name, m.attrs["global_size"], m.attrs["local_size"], hb, m.kernel._fast, queue)


# Read by the traced path as the generated module's globals: the recorder's deque and its
# back-pressure check (as ``RECORDER.push``), and this thread's innermost open region.
_RECORD_GLOBALS = {"tls": _tls, "root": _ROOT, "new_id": new_id,
                   "pending": RECORDER.pending, "append": RECORDER.pending.append, "recorder": RECORDER,
                   "cl_error": cl.Error, "failed": _failed, "site": capture, "push": regions.native_push}
# With the C push (native path) a record is pushed as ``record_launch`` pushes it: untracked, its event
# traded for the reaper's ticket, back-pressure checked in C. Otherwise appended here, checked here.
_PUSH, _ROOM = (("push", "") if regions.native_push is not None else
                ("append", "if len(pending) >= recorder.room:\n                recorder.make_room()"))
_FACTORIES: dict[tuple[int, bool], Any] = {}


def _factory(nargs: int, typed: bool) -> Any:
    make = _FACTORIES.get((nargs, typed))
    if make is None:
        params = "".join(f"a{i}, " for i in range(nargs))
        if typed:
            fast = f"return enq(knl, queue, gs, ls, {params}wait_for=wait_for)"
        else:
            pairs = "".join(f"{i}, a{i}, " for i in range(nargs))
            pad = "\n" + " " * 16  # the fast path's indent in _TEMPLATE
            setargs = (f"s = owner._setargs{pad}if s is None:{pad}    setm(({pairs})){pad}else:{pad}"
                       f"    s(knl, {params}){pad}") if nargs else ""
            fast = f"{setargs}return enqueue(queue, knl, gs, ls, None, wait_for, False, False)"
        ns: dict[str, Any] = dict(_RECORD_GLOBALS)
        # A fixed template (only the arity varies), under a name callsite takes for cltrace's own code.
        exec(compile(_TEMPLATE.format(params=params, fast=fast, cat=KERNEL, push=_PUSH, room=_ROOM), "<cltrace launcher>", "exec"), ns)
        make = _FACTORIES[(nargs, typed)] = ns["make"]
    return make


# pyopencl's generic setter (``Kernel._set_arg_multi``) takes a numpy scalar in 6-9 us: it tries the argument
# as every kind of OpenCL object before its bytes. ``_set_arg_buf_multi`` takes the same bytes in ~0.05 us. A
# kernel launched with numpy scalars gets a setter that gives the positions that held them to the latter and
# the rest to the former; where a position no longer holds bytes (the buffer setter refuses it), that call
# goes through the generic setter, which gives exactly pyopencl's result or error, and the positions are
# learnt again. Measured on an H200 host: a 10-argument GEMM with 7 scalars, set_args 63 us -> ~1 us.
_SETTERS: dict[tuple[int, tuple[int, ...]], Any] = {}
_SETTER_TEMPLATE = """
def make(owner):
    def setargs(knl, {params}):
        try:
            knl._set_arg_buf_multi(({scalars}))
        except Exception:
            owner._learn(({params}))
            knl._set_arg_multi(({pairs}))
            return
        {rest}
    return setargs
"""


def _scalar_setter(owner: "Kernel", nargs: int, scalars: tuple[int, ...]) -> Any:
    """A setter ``(cl_kernel, *args)`` for a kernel whose arguments at ``scalars`` are numpy scalars."""
    make = _SETTERS.get((nargs, scalars))
    if make is None:
        params = ", ".join(f"a{i}" for i in range(nargs)) + ","
        others = [i for i in range(nargs) if i not in scalars]
        rest = f"knl._set_arg_multi(({''.join(f'{i}, a{i}, ' for i in others)}))" if others else "pass"
        src = _SETTER_TEMPLATE.format(params=params, scalars="".join(f"{i}, a{i}, " for i in scalars),
                                      pairs="".join(f"{i}, a{i}, " for i in range(nargs)), rest=rest)
        ns: dict[str, Any] = {}
        exec(compile(src, "<cltrace setter>", "exec"), ns)
        make = _SETTERS[(nargs, scalars)] = ns["make"]
    return make(owner)


def _profile_error(name: str) -> ProfilingNotEnabledError:
    return ProfilingNotEnabledError(f"LaunchProfile for kernel {name!r}")


def _size(v: Any, what: str) -> tuple[int, ...] | None:
    if v is None:
        return None
    if isinstance(v, (int, np.integer)):
        return (int(v),)
    try:
        t = tuple(int(x) for x in v)
    except TypeError:
        raise TypeError(f"{what} must be an int or a sequence of ints, not {type(v).__name__}") from None
    if not 1 <= len(t) <= 3:
        raise ValueError(f"{what} must have 1 to 3 dimensions, got {t}")
    return t


_NO_DEVICE_TIME = {"cltrace.device_time": "unavailable: queue without PROFILING_ENABLE"}


class Kernel(dict):
    """A kernel of a ``Program``, primed for launching.

    ``knl[gs, ls, queue](*args, profile=None, wait_for=None)`` (``ls`` None: the tuned
    local size if there is one, else the driver's choice; queue omitted: the program
    context's default profiling queue; sizes are ints or tuples) or pyopencl's form
    ``knl(queue, gs, ls, *args, profile=None, wait_for=None)``. Both return the
    ``cl.Event``. Like a ``cl.Kernel`` it holds argument state: launch one ``Kernel``
    from one thread at a time.

    A ``Kernel`` is a dict of its launchers keyed by the subscript, so ``knl[gs, ls, q]``
    is one C-level lookup once that launcher exists (at most 256 are kept).
    """

    __slots__ = ("program", "name", "_fast", "_knl", "_enq", "_set", "_typed", "_setargs", "_last", "_misses",
                 "_binds", "_tuned_ls", "_prime_ns")
    records_launches = True  # cltrace.launch(knl, ...) calls it without recording a second span
    __hash__ = object.__hash__  # identity, not contents
    __eq__ = object.__eq__
    __ne__ = object.__ne__

    def __init__(self, program: Program, name: str) -> None:
        super().__init__()
        t0 = _perf()
        self.program = program
        self.name = name
        # Two cl.Kernels: the untraced fast path sets its arguments on every call; the traced/profiled
        # path keeps its own, so it can skip re-binding unchanged arguments outside the measured interval.
        self._fast = cl.Kernel(program.program, name)
        self._knl = cl.Kernel(program.program, name)
        self._enq, self._set = _invoker(self._fast, self._fast.num_args, None)
        self._typed = not hasattr(self._fast, "_set_arg_multi")
        self._setargs: Any = None  # _scalar_setter's, once launches show numpy scalars (``_learn``)
        self._last: tuple | None = None
        self._misses = 0  # launches whose arguments differed from the remembered ones
        self._binds = 0
        tuned = program.tuned
        ls = tuned.get("local_size") if tuned else None
        kname = tuned.get("kernel") if tuned else None
        self._tuned_ls = tuple(ls) if ls and kname in (None, name) else None
        self._prime_ns = _perf() - t0

    def __bool__(self) -> bool:
        return True

    def set_scalar_arg_dtypes(self, dtypes: Sequence[Any]) -> None:
        """Like ``cl.Kernel.set_scalar_arg_dtypes``: lets plain Python numbers be passed for scalar args."""
        self._enq, self._set = _invoker(self._fast, len(dtypes), dtypes)
        self._typed = True
        self._setargs = None
        self._last = None
        self.clear()

    @property
    def tuned_local_size(self) -> tuple[int, ...] | None:
        return self._tuned_ls

    @property
    def function_name(self) -> str:
        """The kernel's name, as ``cl.Kernel.function_name`` gives it."""
        return self.name

    @property
    def num_args(self) -> int:
        return self._fast.num_args

    def __missing__(self, key: Any) -> Any:
        launch = self._bind(key)
        if len(self) < 256:
            dict.__setitem__(self, key, launch)
        return launch

    def _get(self, key: tuple) -> Any:
        try:
            return dict.__getitem__(self, key)
        except TypeError:  # unhashable sizes (lists): a launcher that is not kept
            return self._bind(key)

    def __call__(self, queue: Any, global_size: Any, local_size: Any, *args: Any,
                 profile: Any = None, wait_for: Any = None) -> Any:
        if profile is None and not _state.ENABLED:
            if self._tuned_ls is not None and local_size is None and len(self._tuned_ls) == len(global_size):
                local_size = self._tuned_ls
            try:
                setargs = self._setargs
                if setargs is None:
                    return self._enq(self._fast, queue, global_size, local_size, *args, wait_for=wait_for)
                setargs(self._fast, *args)
                return _ENQUEUE(queue, self._fast, global_size, local_size, None, wait_for, False, False)
            except cl.Error as exc:
                raise failed_launch(exc, self.name, global_size, local_size, None, self._fast, queue) from None
        try:
            launch = self[global_size, local_size, queue]  # the C lookup, no frame of ours (``_get``'s)
        except TypeError:  # unhashable sizes (lists): a launcher that is not kept
            launch = self._bind((global_size, local_size, queue))
        if profile is None and wait_for is None:
            return launch(*args)
        return launch(*args, profile=profile, wait_for=wait_for)

    def _bind(self, key: Any) -> Any:
        if not isinstance(key, tuple) or len(key) not in (2, 3):
            raise TypeError("launch as knl[global_size, local_size](*args) or "
                            "knl[global_size, local_size, queue](*args)")
        gs = _size(key[0], "global_size")
        if gs is None:
            raise TypeError("global_size must not be None")
        ls = _size(key[1], "local_size")
        if ls is None and self._tuned_ls is not None and len(self._tuned_ls) == len(gs):
            ls = self._tuned_ls
        prg = self.program
        queue = key[2] if len(key) == 3 and key[2] is not None else default_queue(prg.context, prg.devices[0])
        _check_device(self, queue)
        meta = _LaunchMeta(self, queue, gs, ls)
        make = _factory(self._fast.num_args, self._typed)
        launch = make(_state, self._enq, getattr(self._fast, "_set_arg_multi", None), _ENQUEUE, self._fast,
                      queue, gs, ls, self._knl, self, _perf, _profile_error, meta, _FreshKernel)
        launch.__qualname__ = launch.__name__ = f"{self.name}[{gs}, {ls}]"
        launch.meta = meta
        return launch

    def _bind_args(self, args: tuple) -> None:
        """Bind the arguments of a measured launch, and remember them where ``==`` says they are the same
        next time. A kernel whose remembered arguments went unused ``_GIVE_UP`` times (a training step's
        GEMM, called on other buffers each time) is checked only every 64th bind: the check cost
        ~0.15 us an argument on every launch and saved nothing."""
        if self._last is not None:  # here, so the remembered arguments did not match
            self._misses += 1
        self._last = None
        setargs = self._setargs
        if setargs is None:
            self._set(self._knl, *args)
        else:
            setargs(self._knl, *args)
        self._binds += 1
        if self._misses >= _GIVE_UP and self._binds & 63:
            return
        if all(map(_eq_means_same, args)):
            self._last = args

    def _learn(self, args: tuple) -> None:
        """Give the positions that hold numpy scalars to the fast scalar setter (``_scalar_setter``); none, or a
        kernel with declared scalar types (pyopencl's typed invoker packs them itself): pyopencl's setter."""
        if self._typed:
            return
        scalars = tuple(i for i, a in enumerate(args) if isinstance(a, np.generic))
        self._setargs = _scalar_setter(self, len(args), scalars) if scalars else None

    def __repr__(self) -> str:
        return f"<cltrace.Kernel {self.name} of {self.program!r}>"


class _FreshKernel(Kernel):
    """A kernel not launched yet: its first launch is charged the program's compile time.

    That launch turns the object into a plain ``Kernel`` (class swap); each launcher's own
    first call checks for it once (``first_launch`` in the template).
    """

    __slots__ = ()

    def _first(self) -> int:
        prg = self.program
        self.__class__ = Kernel if len(prg.devices) >= len(prg.context.devices) else _SomeDevicesKernel
        return prg._take_compile_charge() + self._prime_ns

    def __call__(self, queue: Any, global_size: Any, local_size: Any, *args: Any,
                 profile: Any = None, wait_for: Any = None) -> Any:
        return self[global_size, local_size, queue](*args, profile=profile, wait_for=wait_for)


class _SomeDevicesKernel(Kernel):
    """A kernel of a program built for some of its context's devices only.

    Its pyopencl-form call goes through the launchers, which check the queue's device: a
    launch on another device's queue is an error here, where some drivers (PoCL) crash.
    """

    __slots__ = ()

    def __call__(self, queue: Any, global_size: Any, local_size: Any, *args: Any,
                 profile: Any = None, wait_for: Any = None) -> Any:
        return self._get((global_size, local_size, queue))(*args, profile=profile, wait_for=wait_for)


def _check_device(knl: Kernel, queue: Any) -> None:
    """ValueError unless the kernel's program was built for the queue's device."""
    devices = knl.program.devices
    dev = queue.device
    if any(d.int_ptr == dev.int_ptr for d in devices):
        return
    from ..timeline.tracks import device_info

    built = ", ".join(device_info(d).label for d in devices)
    raise ValueError(f"kernel {knl.name!r} was compiled for {built}, not for this queue's device "
                     f"{device_info(dev).label}: compile with devices=[...] including it, or without "
                     f"device=/devices= to build for every device of the context")


class _LaunchMeta:
    """What a launcher's measured path records: kernel name, span attributes, profiling, compile charge."""

    __slots__ = ("kernel", "name", "attrs", "profiled", "from_cache", "charge")

    def __init__(self, kernel: Kernel, queue: Any, gs: tuple[int, ...], ls: tuple[int, ...] | None) -> None:
        prg = kernel.program
        self.kernel = kernel
        self.name = kernel.name
        self.profiled = has_profiling(queue)
        self.from_cache = prg.from_cache
        self.charge = 0
        # Shared by every span of this launcher; nothing downstream mutates span attributes.
        self.attrs = {"global_size": list(gs), "local_size": list(ls) if ls else None,
                      "from_cache": prg.from_cache, "cache": prg.cache_hit, "program": prg.source_hash}
        if not self.profiled:
            self.attrs.update(_NO_DEVICE_TIME)
