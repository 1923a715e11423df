"""Compiling OpenCL programs through a cache, with compile/build spans; the compiler's public names.

``compile()`` builds one program for every device of a context (or the devices
named), looking it up in a ``ProgramCache`` (memory, then program binaries on
disk, keyed on source hash + build options + device model including the driver
version) and building from source only what is missing. With tracing on, each
step is a host-only span on the compile track naming its devices: the whole
``compile`` call, the cache lookups, the source builds (clBuildProgram), the
binary load, the cache stores. Its ``Program`` hands out ``Kernel``s (launcher.py).

The parts live in their own modules and are importable from here:
cache.py (the cache and its entry format), build.py (the build steps and their
spans, ``BuildError``), options.py (defines, tuned options), context.py (default
context and queue, ``device_key``), launcher.py (``Kernel`` and its launchers).
"""
from __future__ import annotations

import json
import logging
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
from ..record.sources import kernel_names

log = logging.getLogger("cltrace")

def _program_label(source: str, src_hash: str) -> str:
    names = kernel_names(source)
    if not names:
        return src_hash[:12]
    label = ",".join(names[:4])
    return label + (",…" if len(names) > 4 else "")


def compile(source: str, options: str | Sequence[str] = (), *, context: Any = None, device: Any = None,
            devices: Sequence[Any] | None = None, cache: ProgramCache | None = None,
            defines: Mapping[str, Any] | None = None, tune_key: Sequence[Any] | None = None) -> "Program":
    """Build ``source`` through the program cache for the devices of a context; returns a ``Program``.

    Builds for every device of ``context``, or for ``device`` / ``devices`` (in that
    context) alone; its kernels launch on a queue of any device it was built for.
    ``context`` None uses cltrace's shared context of ``device`` (or of the default
    device). ``defines`` become sorted ``-DNAME=VALUE`` options. If the tune DB holds
    a configuration for (source, options, device model) and the problem signature
    ``tune_key`` (None: the only signature stored, if just one), its defines are added
    (names the options already define are kept as given) and its local size becomes the
    default for launches without one; devices of different models with different tuned
    configurations get none. A stored configuration that no longer builds or whose local
    size the kernel cannot run is dropped from the tune DB with one warning and the untuned
    program is built. Raises ``BuildError`` with the build log on failure.
    """
    hb = _perf()
    if not isinstance(source, str):
        raise TypeError(f"compile: source must be OpenCL C text (str), not {type(source).__name__}")
    context, targets = _targets(context, device, devices)
    dev_keys = [device_key(d) for d in targets]
    src_hash = tunedb.source_hash(source)
    resolved = {k: resolve_options(src_hash, options, defines, k, tune_key) for k in dict.fromkeys(dev_keys)}
    untuned = tunedb.normalize_options(options) + define_options(defines)
    opts, tuned = common_options(resolved, untuned)
    cache = cache if cache is not None else default_cache()
    if tuned is None:
        return _compile(source, src_hash, opts, None, context, targets, dev_keys, cache, hb)
    try:
        prg = _compile(source, src_hash, opts, tuned, context, targets, dev_keys, cache, hb)
        stale = next((e for e in (tuned_fit_error(prg.program, d, tuned) for d in targets) if e), None)
    except BuildError as err:
        lines = [ln.strip() for ln in err.build_log.splitlines() if ln.strip()]
        stale = "it no longer builds: " + next((ln for ln in lines if "error" in ln.lower()), lines[0] if lines
                                                else "clBuildProgram failed")[:200]
    if stale is None:
        return prg
    for k in dict.fromkeys(dev_keys):
        forget_tuned(src_hash, options, defines, k, tune_key, stale)
    opts, _ = resolve_options(src_hash, options, defines, dev_keys[0], use_tuned=False)
    return _compile(source, src_hash, opts, None, context, targets, dev_keys, cache, _perf())


def _compile(source: str, src_hash: str, opts: tuple[str, ...], tuned: dict[str, Any] | None, context: Any,
             targets: list[Any], dev_keys: list[str], cache: ProgramCache, hb: int) -> "Program":
    """One build of ``opts`` for ``targets`` through the cache, with its spans."""
    job = BuildSteps(source, _program_label(source, src_hash), opts, src_hash, context, targets, dev_keys, cache)
    attrs: dict[str, Any] = {"source_hash": src_hash, "options": " ".join(opts),
                             "device": ", ".join(dict.fromkeys(dev_keys)), "devices": job.names}
    if tuned is not None:
        attrs["tuned"] = json.dumps(tuned, sort_keys=True, default=str)

    prg, build_log = job.lookup()
    hit = CACHE_MEMORY
    if prg is None:
        try:
            prg, build_log, hit = job.obtain()
        except BuildError as err:
            job.spans.close(hb, _perf(), {**attrs, "cache": CACHE_MISS, "build_log": err.build_log},
                            STATUS_ERROR, f"BuildError: {job.error}")
            raise
        cache.put_memory(context, targets, job.keys, prg, build_log)
    if all(b is not None for b in job.binaries):
        binary_size = sum(len(b) for b in job.binaries if b is not None)
    else:
        binary_size = sum(prg.get_info(cl.program_info.BINARY_SIZES))
    he = _perf()
    attrs.update(cache=hit, from_cache=hit != CACHE_MISS, binary_size=binary_size, duration_ns=he - hb)
    if build_log:
        attrs["build_log"] = build_log
    job.spans.close(hb, he, attrs)
    return Program(prg, context=context, devices=targets, source=source, source_hash=src_hash, options=opts,
                   device_keys=dev_keys, cache_hit=hit, compile_ns=he - hb, binary_size=binary_size,
                   build_log=build_log, tuned=tuned)


def _targets(context: Any, device: Any, devices: Sequence[Any] | None) -> tuple[Any, list[Any]]:
    """(context, the distinct devices to build for), checked against the context."""
    if device is not None and devices is not None:
        raise TypeError("compile: give device= or devices=, not both")
    if devices is not None:
        devices = list(devices)
        if not devices:
            raise ValueError("compile: devices= is empty; leave it out to build for every device of the context")
        if context is None:
            if len(devices) > 1:
                raise TypeError("compile: devices=[...] needs the context= that holds them")
            device = devices[0]
    if context is None:
        context = default_context(device)
    in_context = {d.int_ptr for d in context.devices}
    if device is not None:
        devices = [device]
    elif devices is None:
        devices = list(context.devices)
    out: dict[int, Any] = {}
    for d in devices:
        if d.int_ptr not in in_context:
            raise ValueError(f"compile: device {d.name.strip()!r} is not in the given context")
        out.setdefault(d.int_ptr, d)
    return context, list(out.values())


def common_options(resolved: Mapping[str, tuple[tuple[str, ...], dict[str, Any] | None]],
                   untuned: tuple[str, ...]) -> tuple[tuple[str, ...], dict[str, Any] | None]:
    """The (options, tuned config) one program for several device models is built with.

    One program has one set of build options: the models' tuned configurations apply when
    they agree (identical devices always do); otherwise none does (``untuned``), with a warning.
    """
    distinct = {(o, json.dumps(t, sort_keys=True, default=str)) for o, t in resolved.values()}
    if len(distinct) == 1:
        return next(iter(resolved.values()))
    log.warning("cltrace: the devices %s have different tuned configurations; building without them "
                "(compile for each device model with devices=[...] to use each one's)", ", ".join(resolved))
    return untuned, None


class Program:
    """A built program and how it was obtained.

    ``devices`` are the devices it was built for (``device`` the first), ``device_keys``
    their model keys (``device_key`` the first's).

    ``from_cache``/``cache_hit`` ("memory", "disk" or "miss") say where it came from,
    ``compile_ns`` what this ``compile`` call cost, ``options`` the build options
    actually used (user options, ``defines``, tuned defines). Kernels: ``prg.kernel(name)``
    or ``prg.name``; each name gives one shared ``Kernel``.
    """

    def __init__(self, program: Any, *, context: Any, devices: Sequence[Any], source: str, source_hash: str,
                 options: tuple[str, ...], device_keys: Sequence[str], cache_hit: str, compile_ns: int,
                 binary_size: int, build_log: str, tuned: dict[str, Any] | None) -> None:
        self.program = program
        self.context = context
        self.devices = tuple(devices)
        self.device = self.devices[0]
        self.source = source
        self.source_hash = source_hash
        self.options = options
        self.device_keys = tuple(device_keys)
        self.device_key = self.device_keys[0]
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
