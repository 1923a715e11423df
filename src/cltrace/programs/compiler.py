"""Compiling OpenCL programs through a cache, with compile/build spans; the compiler's public names.

``compile()`` looks a program up in a ``ProgramCache`` (memory, then program
binaries on disk, keyed on source hash + build options + device identity
including the driver version) and builds it from source only on a miss. With
tracing on, each step is a host-only span on the compile track: the whole
``compile`` call, the cache lookup, the source build (clBuildProgram), the
binary load, the cache store. Its ``Program`` hands out ``Kernel``s (launcher.py).

The parts live in their own modules and are importable from here:
program_cache.py (the cache and its entry format), program_build.py (the build
steps and their spans, ``BuildError``), build_options.py (defines, tuned
options), shared_context.py (default context and queue, ``device_key``),
launcher.py (``Kernel`` and its launchers).
"""
from __future__ import annotations

import json
import re
import time
from typing import Any, Mapping, Sequence

import pyopencl as cl

from . import tunedb
from .options import define_options, defined_names, forget_tuned, resolve_options, tuned_fit_error
from .launcher import Kernel, _FreshKernel
from .build import BuildError, BuildSteps
from .cache import CACHE_DISK, CACHE_MEMORY, CACHE_MISS, ProgramCache, default_cache
from .context import default_context, default_queue, device_key
from ..timeline.spans import STATUS_ERROR

__all__ = [
    "compile", "Program", "Kernel", "BuildError", "ProgramCache", "default_cache",
    "default_context", "default_queue", "device_key", "define_options", "defined_names", "kernel_names",
    "CACHE_MEMORY", "CACHE_DISK", "CACHE_MISS",
]

_perf = time.perf_counter_ns

_KERNEL_RE = re.compile(r"\b(?:__)?kernel\b[^;{}()]*?\bvoid\s+(\w+)\s*\(")


def kernel_names(source: str) -> list[str]:
    """Names of the ``__kernel`` functions in OpenCL C source (for span names)."""
    return _KERNEL_RE.findall(source)


def _program_label(source: str, src_hash: str) -> str:
    names = kernel_names(source)
    if not names:
        return src_hash[:12]
    label = ",".join(names[:4])
    return label + (",…" if len(names) > 4 else "")


def compile(source: str, options: str | Sequence[str] = (), *, context: Any = None, device: Any = None,
            cache: ProgramCache | None = None, defines: Mapping[str, Any] | None = None,
            tune_key: Sequence[Any] | None = None) -> "Program":
    """Build ``source`` for one device through the program cache; returns a ``Program``.

    ``context`` None uses cltrace's shared context of ``device`` (or of the default
    device). ``defines`` become sorted ``-DNAME=VALUE`` options. If the tune DB holds
    a configuration for (source, options, device) and the problem signature
    ``tune_key`` (None: the only signature stored, if just one), its defines are added
    (names the options already define are kept as given) and its local size becomes
    the default for launches without one; a stored configuration that no longer builds
    or whose local size the kernel cannot run is dropped from the tune DB with one
    warning and the untuned program is built. Raises ``BuildError`` with the build log on failure.
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
    opts, tuned = resolve_options(src_hash, options, defines, dev_key, tune_key)
    cache = cache if cache is not None else default_cache()
    if tuned is None:
        return _compile(source, src_hash, opts, None, dev_key, context, device, cache, hb)
    try:
        prg = _compile(source, src_hash, opts, tuned, dev_key, context, device, cache, hb)
        stale = tuned_fit_error(prg.program, device, tuned)
    except BuildError as err:
        lines = [ln.strip() for ln in err.build_log.splitlines() if ln.strip()]
        stale = "it no longer builds: " + next((ln for ln in lines if "error" in ln.lower()), lines[0] if lines
                                                else "clBuildProgram failed")[:200]
    if stale is None:
        return prg
    forget_tuned(src_hash, options, defines, dev_key, tune_key, stale)
    opts, _ = resolve_options(src_hash, options, defines, dev_key, use_tuned=False)
    return _compile(source, src_hash, opts, None, dev_key, context, device, cache, _perf())


def _compile(source: str, src_hash: str, opts: tuple[str, ...], tuned: dict[str, Any] | None, dev_key: str,
             context: Any, device: Any, cache: ProgramCache, hb: int) -> "Program":
    """One build of ``opts`` through the cache, with its spans."""
    job = BuildSteps(source, _program_label(source, src_hash), opts, src_hash, dev_key, context, device, cache)
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

    def kernel(self, name: str) -> Kernel:
        knl = self._kernels.get(name)
        if knl is None:
            if name not in self.kernel_names:
                raise LookupError(f"no kernel {name!r} in this program (kernels: {', '.join(self.kernel_names)})")
            knl = self._kernels[name] = _FreshKernel(self, name)
        return knl

    def __getattr__(self, name: str) -> Kernel:
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
