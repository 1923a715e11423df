"""The steps of one ``compile`` call, each a host-only span on the compile track.

``BuildSteps`` runs them for the devices a program is for — cache lookup, source build
(clBuildProgram), cache store, binary load — and ``CompileSpans`` holds their spans until
the call ends, then pushes them with the enclosing ``compile`` span (only while tracing).
"""
from __future__ import annotations

import logging
import time
from typing import Any, Sequence

import pyopencl as cl
import pyopencl._cl as _cl

from .. import _state
from ..errors import CltraceError
from .cache import CACHE_DISK, CACHE_MEMORY, CACHE_MISS, ProgramCache
from ..record.callsite import capture
from ..record.recorder import RECORDER, new_id
from ..record.regions import current_parent
from ..timeline.spans import BUILD, COMPILE, STATUS_ERROR
from ..timeline.tracks import COMPILE_THREAD, device_info

log = logging.getLogger("cltrace")

_perf = time.perf_counter_ns
_push = RECORDER.push


class BuildError(CltraceError):
    """An OpenCL program failed to build. ``build_log`` holds the compiler's log."""

    def __init__(self, what: str, build_log: str, options: Sequence[str] = ()) -> None:
        self.build_log = build_log
        self.options = tuple(options)
        opts = f" (options: {' '.join(options)})" if options else ""
        super().__init__(f"{what} failed to build{opts}:\n{build_log.strip() or '(empty build log)'}")


class CompileSpans:
    """Compile-track spans of one ``compile`` call, pushed when it ends (only while tracing)."""

    __slots__ = ("on", "name", "sid", "parent", "path", "children", "site")

    def __init__(self, name: str) -> None:
        self.on = _state.ENABLED
        self.name = name
        if self.on:
            self.sid = new_id()
            self.parent, ppath = current_parent()
            self.path = ppath + (name,)
            self.children: list[tuple] = []
            self.site = capture(2)

    def child(self, cat: str, name: str, hb: int, he: int, attrs: dict[str, Any],
              status: str | None = None, error: str | None = None) -> None:
        if self.on:
            self.children.append((cat, name, new_id(), self.sid, self.path, COMPILE_THREAD, hb, he,
                                  None, None, None, attrs, status, error, self.site))

    def close(self, hb: int, he: int, attrs: dict[str, Any],
              status: str | None = None, error: str | None = None) -> None:
        if not self.on:
            return
        for rec in self.children:
            _push(rec)
        _push((COMPILE, self.name, self.sid, self.parent, self.path[:-1], COMPILE_THREAD, hb, he,
               None, None, None, attrs, status, error, self.site))


def _build_log(prg: Any, device: Any) -> str:
    try:
        return (prg.get_build_info(device, cl.program_build_info.LOG) or "").strip()
    except Exception:
        return ""


def _joined_logs(prg: Any, devices: Sequence[Any]) -> str:
    logs: list[str] = []
    for d in devices:
        text = _build_log(prg, d)
        if text and text not in logs:
            logs.append(text)
    return "\n".join(logs)


def _binary_of(raw: Any, device: Any) -> bytes:
    """The binary a program built for ``device`` alone holds for it.

    Drivers differ in what they list for the context's other, unbuilt devices (an empty
    binary, or nothing: PoCL), so the one non-empty binary is the device's.
    """
    devices = raw.get_info(cl.program_info.DEVICES)
    binaries = raw.get_info(cl.program_info.BINARIES)
    if len(binaries) == len(devices):
        for d, b in zip(devices, binaries):
            if d.int_ptr == device.int_ptr and b:
                return bytes(b)
    found = [b for b in binaries if b]
    if len(found) != 1:
        raise CltraceError(f"the driver listed {len(found)} binaries for a program built for one device")
    return bytes(found[0])


class BuildSteps:
    """The steps of one ``compile`` call for one or more devices of a context.

    A cache lookup per device model (identical devices share a disk entry), a source build
    (clBuildProgram) on one device per model whose binary is missing, a cache store per new
    binary, and, for several devices, one binary load that makes a single program for all of
    them, so its kernels launch on a queue of any of them. Spans name their devices (labels).
    """

    def __init__(self, source: str, label: str, opts: tuple[str, ...], src_hash: str, context: Any,
                 devices: Sequence[Any], dev_keys: Sequence[str], cache: ProgramCache) -> None:
        self.source = source
        self.label = label
        self.opts = opts
        self.opt_bytes = " ".join(opts).encode("utf-8")
        self.src_hash = src_hash
        self.context = context
        self.devices = list(devices)
        self.dev_keys = list(dev_keys)
        self.names = [device_info(d).label for d in self.devices]
        self.cache = cache
        self.keys = [cache.entry_key(src_hash, opts, k) for k in self.dev_keys]
        self.spans = CompileSpans(f"compile {label}")
        self.binaries: list[bytes | None] = [None] * len(self.devices)
        self.from_disk: set[str] = set()  # entry keys whose binary came from disk
        self.error: str | None = None

    def _models(self) -> list[int]:
        """Index of the first device of each distinct model (entry key)."""
        seen: dict[str, int] = {}
        for i, k in enumerate(self.keys):
            seen.setdefault(k, i)
        return list(seen.values())

    def _sharing(self, i: int) -> list[str]:
        return [n for n, k in zip(self.names, self.keys) if k == self.keys[i]]

    def lookup(self) -> tuple[Any, str]:
        """(program, build log) from memory; otherwise reads each model's disk entry into ``binaries``."""
        cache = self.cache
        t0 = _perf()
        hit = cache.get_memory(self.context, self.devices, self.keys)
        if hit is not None:
            self.spans.child(COMPILE, "cache lookup", t0, _perf(), {"cache": CACHE_MEMORY, "devices": self.names})
            return hit
        for i in self._models():
            key = self.keys[i]
            binary, corrupt = cache.load(key, self.src_hash, self.opts, self.dev_keys[i])
            attrs: dict[str, Any] = {"cache": CACHE_DISK if binary is not None else CACHE_MISS,
                                     "path": cache.path(key), "devices": self._sharing(i)}
            if corrupt:
                attrs["cache.corrupt"] = corrupt
                log.warning("cltrace: program cache entry %s was %s; removed, rebuilding from source",
                            cache.path(key), corrupt)
            if binary is not None:
                self.from_disk.add(key)
                self._set_binary(key, binary)
            self.spans.child(COMPILE, "cache lookup", t0, _perf(), attrs)
            t0 = _perf()
        return None, ""

    def _set_binary(self, key: str, binary: bytes | None) -> None:
        for j, k in enumerate(self.keys):
            if k == key:
                self.binaries[j] = binary

    def obtain(self) -> tuple[Any, str, str]:
        """(program, build log, CACHE_DISK or CACHE_MISS) after a memory miss: builds the models
        without a binary, stores their binaries, loads the program for every device."""
        built = any(b is None for b in self.binaries)
        for _ in range(2):
            raw, build_log = None, ""
            for i in self._models():
                if self.binaries[i] is None:
                    raw, build_log = self._build_source(i)
                    self._store(i, build_log)
            if len(self.devices) == 1 and raw is not None:
                return cl.Program(raw), build_log, CACHE_MISS
            prg, build_log = self._load_binaries()
            if prg is not None:
                return prg, build_log, CACHE_MISS if built else CACHE_DISK
            if not self.from_disk:
                break
            for key in self.from_disk:  # the driver rejected a cached binary: build those again
                self.cache.remove(key)
                self._set_binary(key, None)
            self.from_disk.clear()
            built = True
        raise BuildError(f"OpenCL program {self.label!r} on {', '.join(self.names)}",
                         f"the driver rejected the binaries it had just built: {self.error}", self.opts)

    def _load_binaries(self) -> tuple[Any, str]:
        """(program, build log) from the binaries for every device, or (None, "") if the driver rejects them."""
        binaries = self.binaries
        size = sum(len(b) for b in binaries if b is not None)
        t0 = _perf()
        try:
            raw = _cl._Program(self.context, self.devices, binaries)
            raw._build(self.opt_bytes, self.devices)
        except cl.Error as exc:
            self.error = str(exc)
            self.spans.child(BUILD, "load binary", t0, _perf(), {"binary_size": size, "devices": self.names},
                             STATUS_ERROR, f"driver rejected the binary: {exc}")
            if self.from_disk:
                log.warning("cltrace: driver rejected cached program binary %s (%s); rebuilding",
                            ", ".join(self.cache.path(k) for k in sorted(self.from_disk)), exc)
            return None, ""
        t1 = _perf()
        self.spans.child(BUILD, "load binary", t0, t1, {"binary_size": size, "duration_ns": t1 - t0,
                                                         "devices": self.names})
        return cl.Program(raw), _joined_logs(raw, self.devices)

    def _build_source(self, i: int) -> tuple[Any, str]:
        """(raw program, build log) of clBuildProgram on device ``i``; raises BuildError with the log."""
        device = self.devices[i]
        attrs: dict[str, Any] = {"device": self.names[i], "devices": self._sharing(i)}
        t0 = _perf()
        raw = _cl._Program(self.context, self.source)
        try:
            raw._build(self.opt_bytes, [device])
        except cl.Error as exc:
            t1 = _perf()
            build_log = _build_log(raw, device) or str(exc)
            self.error = str(exc)
            self.spans.child(BUILD, "clBuildProgram", t0, t1, {**attrs, "build_log": build_log, "duration_ns": t1 - t0},
                             STATUS_ERROR, str(exc))
            raise BuildError(f"OpenCL program {self.label!r} on {self.names[i]}", build_log, self.opts) from None
        t1 = _perf()
        build_log = _build_log(raw, device)
        binary = _binary_of(raw, device)
        self._set_binary(self.keys[i], binary)
        attrs.update(binary_size=len(binary), duration_ns=t1 - t0)
        if build_log:
            attrs["build_log"] = build_log
        self.spans.child(BUILD, "clBuildProgram", t0, t1, attrs)
        return raw, build_log

    def _store(self, i: int, build_log: str) -> None:
        """Write device ``i``'s new binary to the disk cache; a failure is a failed span and a warning."""
        binary = self.binaries[i]
        assert binary is not None
        attrs: dict[str, Any] = {"binary_size": len(binary), "devices": self._sharing(i)}
        t0 = _perf()
        try:
            path = self.cache.store(self.keys[i], self.src_hash, self.opts, self.dev_keys[i], binary, build_log)
        except OSError as exc:
            log.warning("cltrace: could not store program binary in %s: %s", self.cache.directory, exc)
            self.spans.child(COMPILE, "cache store", t0, _perf(), attrs, STATUS_ERROR, f"cache store failed: {exc}")
            return
        if path is None:  # a folder cltrace does not trust: said once by the cache, nothing written
            self.spans.child(COMPILE, "cache store", t0, _perf(), {**attrs, "cache.refused": self.cache.directory})
            return
        self.spans.child(COMPILE, "cache store", t0, _perf(), {**attrs, "path": path})
