"""The steps of one ``compile`` call, each a host-only span on the compile track.

``BuildSteps`` runs them — cache lookup, binary load, source build
(clBuildProgram), cache store — and ``CompileSpans`` holds their spans until
the call ends, then pushes them with the enclosing ``compile`` span (only
while tracing).
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
from ..record.recorder import RECORDER, new_id
from ..record.regions import current_parent
from ..timeline.spans import BUILD, COMPILE, STATUS_ERROR
from ..timeline.tracks import COMPILE_THREAD

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


class BuildSteps:
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
        self.spans = CompileSpans(f"compile {label}")
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
        """Write the built binary to the disk cache; a failure is a failed span and a warning, never an error."""
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
