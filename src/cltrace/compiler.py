"""Compiling OpenCL programs through a cache, with compile/build spans, and launching their kernels.

``compile()`` looks a program up in a ``ProgramCache`` (memory, then program
binaries on disk, keyed on source hash + build options + device identity
including the driver version) and builds it from source only on a miss. With
tracing on, each step is a host-only span on the compile track: the whole
``compile`` call, the cache lookup, the source build (clBuildProgram), the
binary load, the cache store.

``Kernel`` launches with ``knl[global_size, local_size, queue](*args)`` or
pyopencl's own ``knl(queue, global_size, local_size, *args)``. Everything that
is not the enqueue (compile, kernel creation, generating the launcher, binding
arguments) happens before the measured host interval. With tracing off and no
``profile``, ``knl[gs, ls, q](*args)`` is a dict lookup and one generated frame
that reads the flag, binds the arguments and enqueues.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import tempfile
import threading
import time
from typing import Any, Mapping, Sequence

import numpy as np
import pyopencl as cl
import pyopencl._cl as _cl

from . import _state, tunedb
from .errors import CltraceError, ProfilingNotEnabledError
from .queues import PROFILING, default_device
from .recorder import RECORDER, new_id
from .regions import current_parent, record_launch
from .spans import BUILD, COMPILE, KERNEL, STATUS_ERROR
from .tracks import COMPILE_THREAD, device_info

log = logging.getLogger("cltrace")

_perf = time.perf_counter_ns
_push = RECORDER.push
# Captured at import: cltrace's own launches must not go through instrument()'s hooks.
_ENQUEUE = _cl.enqueue_nd_range_kernel

CACHE_MEMORY = "memory"
CACHE_DISK = "disk"
CACHE_MISS = "miss"

_MAGIC = b"CLTRACE-PROGRAM 1\n"
_IDENT = re.compile(r"[A-Za-z_]\w*")
_KERNEL_RE = re.compile(r"\b(?:__)?kernel\b[^;{}()]*?\bvoid\s+(\w+)\s*\(")


class BuildError(CltraceError):
    """An OpenCL program failed to build. ``build_log`` holds the compiler's log."""

    def __init__(self, what: str, build_log: str, options: Sequence[str] = ()) -> None:
        self.build_log = build_log
        self.options = tuple(options)
        opts = f" (options: {' '.join(options)})" if options else ""
        super().__init__(f"{what} failed to build{opts}:\n{build_log.strip() or '(empty build log)'}")


def kernel_names(source: str) -> list[str]:
    """Names of the ``__kernel`` functions in OpenCL C source (for span names)."""
    return _KERNEL_RE.findall(source)


def _program_label(source: str, src_hash: str) -> str:
    names = kernel_names(source)
    if not names:
        return src_hash[:12]
    label = ",".join(names[:4])
    return label + (",…" if len(names) > 4 else "")


# ---- default device, context and queue -------------------------------------------

_lock = threading.Lock()
_default_dev: dict[tuple[str | None, str | None], Any] = {}
_contexts: dict[int, Any] = {}  # device int_ptr -> shared context
_queues: dict[int, tuple[Any, Any]] = {}  # context int_ptr -> (context, profiling queue)
_device_keys: dict[int, str] = {}  # device int_ptr -> tracks.device_info(device).key


def _default_device() -> Any:
    env = (os.environ.get("CLTRACE_DEVICE"), os.environ.get("PYOPENCL_CTX"))
    dev = _default_dev.get(env)
    if dev is None:
        dev = _default_dev[env] = default_device()
    return dev


def default_context(device: Any = None) -> Any:
    """One shared context per device (cltrace's default device when None)."""
    if device is None:
        device = _default_device()
    ctx = _contexts.get(device.int_ptr)
    if ctx is None:
        with _lock:
            ctx = _contexts.get(device.int_ptr)
            if ctx is None:
                ctx = _contexts[device.int_ptr] = cl.Context([device])
    return ctx


def default_queue(context: Any = None) -> Any:
    """The shared in-order profiling queue of a context (of the default context when None)."""
    if context is None:
        context = default_context()
    entry = _queues.get(context.int_ptr)
    if entry is None:
        with _lock:
            entry = _queues.get(context.int_ptr)
            if entry is None:
                q = cl.CommandQueue(context, context.devices[0], properties=PROFILING)
                entry = _queues[context.int_ptr] = (context, q)
    return entry[1]


def device_key(device: Any) -> str:
    """Platform|device|driver identity of a device (cached per device)."""
    key = _device_keys.get(device.int_ptr)
    if key is None:
        key = _device_keys[device.int_ptr] = device_info(device).key
    return key


# ---- build options -----------------------------------------------------------------

def define_options(defines: Mapping[str, Any] | None, skip: frozenset[str] = frozenset()) -> tuple[str, ...]:
    """``-DNAME=VALUE`` options, sorted by name (``-DNAME`` for a value of None)."""
    if not defines:
        return ()
    out = []
    for name in sorted(defines, key=str):
        if not isinstance(name, str) or not _IDENT.fullmatch(name):
            raise ValueError(f"define name {name!r} is not a C identifier")
        if name in skip:
            continue
        value = defines[name]
        out.append(f"-D{name}" if value is None else f"-D{name}={value}")
    return tuple(out)


def defined_names(options: Sequence[str]) -> frozenset[str]:
    """Macro names that ``-D`` options define."""
    names = set()
    it = iter(options)
    for tok in it:
        if tok == "-D":
            tok = "-D" + next(it, "")
        if tok.startswith("-D"):
            names.add(tok[2:].split("=", 1)[0])
    return frozenset(names)


def _valid_tuned(cfg: Any) -> dict[str, Any] | None:
    """A tune DB config usable here, or None (a malformed entry is ignored, with a warning)."""
    if cfg is None:
        return None
    defs = cfg.get("defines") or {} if isinstance(cfg, dict) else None
    ls = cfg.get("local_size") if isinstance(cfg, dict) else None
    ok = (isinstance(defs, dict) and all(isinstance(k, str) and _IDENT.fullmatch(k) for k in defs)
          and (ls is None or (isinstance(ls, (list, tuple)) and 1 <= len(ls) <= 3
                              and all(isinstance(x, int) and x > 0 for x in ls))))
    if not ok:
        log.warning("cltrace: ignoring malformed tune DB config %r", cfg)
        return None
    return cfg


# ---- the program cache ---------------------------------------------------------------

class ProgramCache:
    """Built programs in memory and program binaries on disk.

    Keyed on (source hash, build options, device key incl. driver version). A disk
    entry is one file: a magic line, a JSON header (key, size, sha256) and the
    binary; it is written to a temporary file and renamed, and checked against
    its checksum before the driver sees it, so a truncated or garbled entry is
    removed and rebuilt, never loaded.
    """

    def __init__(self, directory: str | os.PathLike[str] | None = None, memory: bool = True) -> None:
        self._directory = os.fspath(directory) if directory is not None else None
        self.memory = memory
        self._mem: dict[tuple[Any, ...], tuple[Any, Any, str]] = {}  # -> (context, cl.Program, build log)
        self._lock = threading.Lock()

    @property
    def directory(self) -> str:
        """``<tunedb.cache_dir()>/programs`` unless given."""
        return self._directory or os.path.join(tunedb.cache_dir(), "programs")

    @staticmethod
    def entry_key(src_hash: str, options: Sequence[str], dev_key: str) -> str:
        return tunedb.entry_key(src_hash, options, dev_key)

    def path(self, key: str) -> str:
        return os.path.join(self.directory, key[:2], key + ".clbin")

    # memory
    def get_memory(self, context: Any, device: Any, key: str) -> tuple[Any, str] | None:
        """(program, build log) built earlier in this process for this context, or None."""
        if not self.memory:
            return None
        # The entry holds its context, so a live entry's context address cannot be reused.
        entry = self._mem.get((context.int_ptr, device.int_ptr, key))
        return entry[1:] if entry is not None else None

    def put_memory(self, context: Any, device: Any, key: str, program: Any, build_log: str = "") -> None:
        if self.memory:
            with self._lock:
                self._mem[(context.int_ptr, device.int_ptr, key)] = (context, program, build_log)

    # disk
    def load(self, key: str, src_hash: str, options: Sequence[str], dev_key: str) -> tuple[bytes | None, str | None]:
        """(binary, None) for a valid entry; (None, None) if absent; (None, reason) if it was corrupt (and is now removed)."""
        path = self.path(key)
        try:
            with open(path, "rb") as fh:
                data = fh.read()
        except FileNotFoundError:
            return None, None
        except OSError as exc:
            return None, f"unreadable: {exc}"
        reason = None
        try:
            if not data.startswith(_MAGIC):
                raise ValueError("bad magic")
            nl = data.index(b"\n", len(_MAGIC))
            head = json.loads(data[len(_MAGIC):nl].decode("utf-8"))
            binary = data[nl + 1:]
            if (head.get("source_hash"), head.get("options"), head.get("device_key")) != (
                    src_hash, list(options), dev_key):
                raise ValueError("key mismatch")
            if head.get("size") != len(binary):
                raise ValueError(f"size {len(binary)} != {head.get('size')}")
            if head.get("sha256") != hashlib.sha256(binary).hexdigest():
                raise ValueError("checksum mismatch")
            return binary, None
        except (ValueError, UnicodeDecodeError, AttributeError) as exc:
            reason = f"corrupt entry ({exc})"
        self.remove(key)
        return None, reason

    def store(self, key: str, src_hash: str, options: Sequence[str], dev_key: str, binary: bytes,
              build_log: str = "") -> str:
        """Write one entry atomically (temporary file + rename); returns its path."""
        path = self.path(key)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        head = {"source_hash": src_hash, "options": list(options), "device_key": dev_key,
                "size": len(binary), "sha256": hashlib.sha256(binary).hexdigest(), "build_log": build_log}
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(_MAGIC)
                fh.write(json.dumps(head).encode("utf-8") + b"\n")
                fh.write(binary)
            os.replace(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        return path

    def remove(self, key: str) -> None:
        try:
            os.unlink(self.path(key))
        except OSError:
            pass

    def clear(self, disk: bool = False) -> None:
        """Forget in-memory programs; with ``disk`` also delete this cache's binaries."""
        with self._lock:
            self._mem.clear()
        if disk:
            import shutil

            shutil.rmtree(self.directory, ignore_errors=True)


_default_cache: ProgramCache | None = None


def default_cache() -> ProgramCache:
    global _default_cache
    if _default_cache is None:
        _default_cache = ProgramCache()
    return _default_cache


# ---- compile ---------------------------------------------------------------------------

class _Spans:
    """Compile-track spans of one ``compile`` call, pushed when it ends (only while tracing)."""

    __slots__ = ("on", "name", "sid", "parent", "path", "children")

    def __init__(self, name: str) -> None:
        self.on = _state.ENABLED
        self.name = name
        if self.on:
            self.sid = new_id()
            self.parent, ppath = current_parent()
            self.path = ppath + (name,)
            self.children: list[tuple] = []

    def child(self, cat: str, name: str, hb: int, he: int, attrs: dict[str, Any],
              status: str | None = None, error: str | None = None) -> None:
        if self.on:
            self.children.append((cat, name, new_id(), self.sid, self.path, COMPILE_THREAD, hb, he,
                                  None, None, None, attrs, status, error))

    def close(self, hb: int, he: int, attrs: dict[str, Any],
              status: str | None = None, error: str | None = None) -> None:
        if not self.on:
            return
        for rec in self.children:
            _push(rec)
        _push((COMPILE, self.name, self.sid, self.parent, self.path[:-1], COMPILE_THREAD, hb, he,
               None, None, None, attrs, status, error))


def _build_log(prg: Any, device: Any) -> str:
    try:
        return (prg.get_build_info(device, cl.program_build_info.LOG) or "").strip()
    except Exception:
        return ""


def compile(source: str, options: str | Sequence[str] = (), *, context: Any = None, device: Any = None,
            cache: ProgramCache | None = None, defines: Mapping[str, Any] | None = None) -> "Program":
    """Build ``source`` for one device through the program cache; returns a ``Program``.

    ``context`` None uses cltrace's shared context of ``device`` (or of the default
    device). ``defines`` become sorted ``-DNAME=VALUE`` options. If the tune DB holds
    a configuration for (source, options, device), its defines are added (names the
    options already define are kept as given) and its local size becomes the default
    for launches without one. Raises ``BuildError`` with the build log on failure.
    """
    hb = _perf()
    if not isinstance(source, str):
        raise TypeError(f"compile: source must be OpenCL C text (str), not {type(source).__name__}")
    if context is None:
        context = default_context(device)
    if device is None:
        device = context.devices[0]
    elif device not in context.devices:
        raise ValueError(f"compile: device {device.name!r} is not in the given context")
    dev_key = device_key(device)
    src_hash = tunedb.source_hash(source)
    opts = tunedb.normalize_options(options) + define_options(defines)
    tuned = _valid_tuned(tunedb.lookup(src_hash, opts, dev_key))
    if tuned is not None:
        opts = opts + define_options(tuned.get("defines"), skip=defined_names(opts))
    cache = cache if cache is not None else default_cache()
    label = _program_label(source, src_hash)
    job = _Build(source, label, opts, src_hash, dev_key, context, device, cache)
    attrs: dict[str, Any] = {"source_hash": src_hash, "options": " ".join(opts), "device": dev_key}
    if tuned is not None:
        attrs["tuned"] = json.dumps(tuned, sort_keys=True, default=str)

    prg, build_log = job.lookup()
    hit = CACHE_MEMORY if prg is not None else CACHE_MISS
    if prg is None and job.binary is not None:
        prg, build_log = job.load_binary()
        hit = CACHE_DISK if prg is not None else CACHE_MISS
    if prg is None:
        try:
            prg, build_log = job.build_source()
        except BuildError as err:
            job.spans.close(hb, _perf(), {**attrs, "cache": CACHE_MISS, "build_log": err.build_log},
                            STATUS_ERROR, f"BuildError: {job.error}")
            raise
        job.store(build_log)
    if hit != CACHE_MEMORY:
        cache.put_memory(context, device, job.key, prg, build_log)
    binary_size = len(job.binary) if job.binary is not None else sum(prg.get_info(cl.program_info.BINARY_SIZES))
    he = _perf()
    attrs.update(cache=hit, from_cache=hit != CACHE_MISS, binary_size=binary_size, duration_ns=he - hb)
    if build_log:
        attrs["build_log"] = build_log
    job.spans.close(hb, he, attrs)
    return Program(prg, context=context, device=device, source=source, source_hash=src_hash, options=opts,
                   device_key=dev_key, cache_hit=hit, compile_ns=he - hb, binary_size=binary_size,
                   build_log=build_log, tuned=tuned)


class _Build:
    """The steps of one ``compile`` call: cache lookup, binary load, source build, cache store."""

    def __init__(self, source: str, label: str, opts: tuple[str, ...], src_hash: str, dev_key: str,
                 context: Any, device: Any, cache: ProgramCache) -> None:
        self.source = source
        self.label = label
        self.opts = opts
        self.opt_bytes = " ".join(opts).encode("utf-8")
        self.src_hash = src_hash
        self.dev_key = dev_key
        self.context = context
        self.device = device
        self.cache = cache
        self.key = cache.entry_key(src_hash, opts, dev_key)
        self.spans = _Spans(f"compile {label}")
        self.binary: bytes | None = None
        self.error: str | None = None

    def lookup(self) -> tuple[Any, str]:
        """(program, build log) from memory; otherwise reads the disk entry into ``binary``."""
        cache = self.cache
        t0 = _perf()
        hit = cache.get_memory(self.context, self.device, self.key)
        attrs: dict[str, Any] = {"cache": CACHE_MEMORY}
        if hit is None:
            self.binary, corrupt = cache.load(self.key, self.src_hash, self.opts, self.dev_key)
            attrs = {"cache": CACHE_DISK if self.binary is not None else CACHE_MISS, "path": cache.path(self.key)}
            if corrupt:
                attrs["cache.corrupt"] = corrupt
                log.warning("cltrace: program cache entry %s was %s; removed, rebuilding from source",
                            cache.path(self.key), corrupt)
        self.spans.child(COMPILE, "cache lookup", t0, _perf(), attrs)
        return hit if hit is not None else (None, "")

    def load_binary(self) -> tuple[Any, str]:
        """(program, build log) from the cached binary, or (None, "") if the driver rejects it."""
        binary = self.binary
        assert binary is not None
        t0 = _perf()
        try:
            raw = _cl._Program(self.context, [self.device], [binary])
            raw._build(self.opt_bytes, [self.device])
        except cl.Error as exc:
            self.spans.child(BUILD, "load binary", t0, _perf(), {"binary_size": len(binary)},
                             STATUS_ERROR, f"driver rejected the cached binary: {exc}")
            log.warning("cltrace: driver rejected cached program binary %s (%s); rebuilding",
                        self.cache.path(self.key), exc)
            self.cache.remove(self.key)
            self.binary = None
            return None, ""
        t1 = _perf()
        self.spans.child(BUILD, "load binary", t0, t1, {"binary_size": len(binary), "duration_ns": t1 - t0})
        return cl.Program(raw), _build_log(raw, self.device)

    def build_source(self) -> tuple[Any, str]:
        """(program, build log) from clBuildProgram; raises BuildError with the log."""
        t0 = _perf()
        raw = _cl._Program(self.context, self.source)
        try:
            raw._build(self.opt_bytes, [self.device])
        except cl.Error as exc:
            t1 = _perf()
            build_log = _build_log(raw, self.device) or str(exc)
            self.error = str(exc)
            self.spans.child(BUILD, "clBuildProgram", t0, t1, {"build_log": build_log, "duration_ns": t1 - t0},
                             STATUS_ERROR, str(exc))
            raise BuildError(f"OpenCL program {self.label!r} on {self.device.name.strip()}",
                             build_log, self.opts) from None
        t1 = _perf()
        build_log = _build_log(raw, self.device)
        self.binary = raw.get_info(cl.program_info.BINARIES)[0]
        attrs: dict[str, Any] = {"binary_size": len(self.binary), "duration_ns": t1 - t0}
        if build_log:
            attrs["build_log"] = build_log
        self.spans.child(BUILD, "clBuildProgram", t0, t1, attrs)
        return cl.Program(raw), build_log

    def store(self, build_log: str) -> None:
        binary = self.binary
        assert binary is not None
        t0 = _perf()
        try:
            path = self.cache.store(self.key, self.src_hash, self.opts, self.dev_key, binary, build_log)
        except OSError as exc:
            log.warning("cltrace: could not store program binary in %s: %s", self.cache.directory, exc)
            self.spans.child(COMPILE, "cache store", t0, _perf(), {"binary_size": len(binary)},
                             STATUS_ERROR, f"cache store failed: {exc}")
            return
        self.spans.child(COMPILE, "cache store", t0, _perf(), {"path": path, "binary_size": len(binary)})


class Program:
    """A built program and how it was obtained.

    ``from_cache``/``cache_hit`` ("memory", "disk" or "miss") say where it came from,
    ``compile_ns`` what this ``compile`` call cost, ``options`` the build options
    actually used (user options, ``defines``, tuned defines). Kernels: ``prg.kernel(name)``
    or ``prg.name``; each name gives one shared ``Kernel``.
    """

    def __init__(self, program: Any, *, context: Any, device: Any, source: str, source_hash: str,
                 options: tuple[str, ...], device_key: str, cache_hit: str, compile_ns: int,
                 binary_size: int, build_log: str, tuned: dict[str, Any] | None) -> None:
        self.program = program
        self.context = context
        self.device = device
        self.source = source
        self.source_hash = source_hash
        self.options = options
        self.device_key = device_key
        self.cache_hit = cache_hit
        self.from_cache = cache_hit != CACHE_MISS
        self.compile_ns = compile_ns
        self.binary_size = binary_size
        self.build_log = build_log
        self.tuned = tuned
        self._kernels: dict[str, Kernel] = {}
        self._uncharged_ns = compile_ns  # charged to the first launch of any of its kernels

    @property
    def kernel_names(self) -> list[str]:
        names = self.program.get_info(cl.program_info.KERNEL_NAMES)
        return [n for n in names.split(";") if n]

    def kernel(self, name: str) -> "Kernel":
        knl = self._kernels.get(name)
        if knl is None:
            if name not in self.kernel_names:
                raise LookupError(f"no kernel {name!r} in this program (kernels: {', '.join(self.kernel_names)})")
            knl = self._kernels[name] = _FreshKernel(self, name)
        return knl

    def __getattr__(self, name: str) -> "Kernel":
        if name.startswith("_"):
            raise AttributeError(name)
        try:
            return self.kernel(name)
        except LookupError as exc:
            raise AttributeError(str(exc)) from None

    def _take_compile_charge(self) -> int:
        ns, self._uncharged_ns = self._uncharged_ns, 0
        return ns

    def __repr__(self) -> str:
        return (f"<cltrace.Program {_program_label(self.source, self.source_hash)} cache={self.cache_hit} "
                f"compile={self.compile_ns / 1e6:.3f}ms>")


# ---- kernels and launches ------------------------------------------------------------

# Arguments bound on the traced path are remembered when, for each of them, comparing equal
# to the next call's argument means the kernel would receive the same thing: memory objects
# (equal = same cl_mem), integers, and floats other than zero (0.0 == -0.0, bytes differ).
# The next launch then skips re-binding when ``args == last`` (a C-level tuple compare).
_EQ_SAFE = (cl.MemoryObjectHolder, cl.LocalMemory, int, np.integer, type(None))
_FLOATS = (float, np.floating)


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
# (compiled once per arity and argument handling, as pyopencl does for its invokers).
# Tracing off and no profile: bind the arguments (``_set_arg_multi`` as pyopencl's generic
# invoker does, or pyopencl's typed invoker) and enqueue, in one frame. Otherwise the
# measured launch: arguments bound first (skipped when unchanged), then two clock reads
# around the enqueue alone, then the span record and/or the profile.
_TEMPLATE = """
def make(state, enq, setm, enqueue, knl, queue, gs, ls, tknl, owner, perf, record, profile_error, m):
    def launch({params}*, profile=None, wait_for=None):
        if profile is None and not state.ENABLED:
            {fast}
        if profile is not None and not m.profiled:
            raise profile_error(m.name)
        args = ({params})
        try:
            same = args == owner._last
        except Exception:  # e.g. an ndarray argument: compare as different
            same = False
        if not same:
            owner._bind_args(args)
        hb = perf()
        ev = enqueue(queue, tknl, gs, ls, None, wait_for, False, False)
        he = perf()
        if state.ENABLED:
            if m.profiled:
                record(m.name, queue, ev, hb, he, {cat!r}, m.attrs)
            else:
                record(m.name, None, None, hb, he, {cat!r}, m.attrs)
        if profile is not None:
            profile._add(ev, queue, hb, he, m.name, m.from_cache, m.charge)
        return ev
    return launch
"""
_FACTORIES: dict[tuple[int, bool], Any] = {}


def _factory(nargs: int, typed: bool) -> Any:
    make = _FACTORIES.get((nargs, typed))
    if make is None:
        params = "".join(f"a{i}, " for i in range(nargs))
        if typed:
            fast = f"return enq(knl, queue, gs, ls, {params}wait_for=wait_for)"
        else:
            pairs = "".join(f"{i}, a{i}, " for i in range(nargs))
            setargs = f"setm(({pairs}))\n            " if nargs else ""
            fast = f"{setargs}return enqueue(queue, knl, gs, ls, None, wait_for, False, False)"
        ns: dict[str, Any] = {}
        exec(_TEMPLATE.format(params=params, fast=fast, cat=KERNEL), ns)  # fixed template: only the arity varies
        make = _FACTORIES[(nargs, typed)] = ns["make"]
    return make


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


def _has_profiling(queue: Any) -> bool:
    return bool(queue.properties & PROFILING)


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

    __slots__ = ("program", "name", "_fast", "_knl", "_enq", "_set", "_typed", "_last", "_tuned_ls",
                 "_prime_ns")
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
        self._last: tuple | None = None
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
        self._last = None
        self.clear()

    @property
    def tuned_local_size(self) -> tuple[int, ...] | None:
        return self._tuned_ls

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
            return self._enq(self._fast, queue, global_size, local_size, *args, wait_for=wait_for)
        return self._get((global_size, local_size, queue))(*args, profile=profile, wait_for=wait_for)

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
        queue = key[2] if len(key) == 3 and key[2] is not None else default_queue(self.program.context)
        meta = _LaunchMeta(self, queue, gs, ls)
        make = _factory(self._fast.num_args, self._typed)
        launch = make(_state, self._enq, getattr(self._fast, "_set_arg_multi", None), _ENQUEUE, self._fast,
                      queue, gs, ls, self._knl, self, _perf, record_launch, _profile_error, meta)
        launch.__qualname__ = launch.__name__ = f"{self.name}[{gs}, {ls}]"
        launch.meta = meta
        return launch

    def _bind_args(self, args: tuple) -> None:
        self._last = None
        self._set(self._knl, *args)
        if all(_eq_means_same(a) for a in args):
            self._last = args

    def __repr__(self) -> str:
        return f"<cltrace.Kernel {self.name} of {self.program!r}>"


class _FreshKernel(Kernel):
    """A kernel not launched yet: its first launch is charged the program's compile time.

    That launch turns the object into a plain ``Kernel`` (class swap), so steady-state
    launches carry no first-call check.
    """

    __slots__ = ()

    def _first(self) -> int:
        self.__class__ = Kernel
        return self.program._take_compile_charge() + self._prime_ns

    def __getitem__(self, key: Any) -> Any:
        return _First(self._get(key))

    def __call__(self, queue: Any, global_size: Any, local_size: Any, *args: Any,
                 profile: Any = None, wait_for: Any = None) -> Any:
        return self[global_size, local_size, queue](*args, profile=profile, wait_for=wait_for)


class _First:
    """The launcher handed out before a kernel's first launch; that launch carries the compile charge."""

    __slots__ = ("launch",)

    def __init__(self, launch: Any) -> None:
        self.launch = launch

    def __call__(self, *args: Any, profile: Any = None, wait_for: Any = None) -> Any:
        meta = self.launch.meta
        k = meta.kernel
        if type(k) is not _FreshKernel:
            return self.launch(*args, profile=profile, wait_for=wait_for)
        meta.charge = k._first()
        try:
            return self.launch(*args, profile=profile, wait_for=wait_for)
        finally:
            meta.charge = 0


class _LaunchMeta:
    """What a launcher's measured path records: kernel name, span attributes, profiling, compile charge."""

    __slots__ = ("kernel", "name", "attrs", "profiled", "from_cache", "charge")

    def __init__(self, kernel: Kernel, queue: Any, gs: tuple[int, ...], ls: tuple[int, ...] | None) -> None:
        prg = kernel.program
        self.kernel = kernel
        self.name = kernel.name
        self.profiled = _has_profiling(queue)
        self.from_cache = prg.from_cache
        self.charge = 0
        # Shared by every span of this launcher; nothing downstream mutates span attributes.
        self.attrs = {"global_size": list(gs), "local_size": list(ls) if ls else None,
                      "from_cache": prg.from_cache, "cache": prg.cache_hit, "program": prg.source_hash}
        if not self.profiled:
            self.attrs.update(_NO_DEVICE_TIME)
