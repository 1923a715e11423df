"""Call sites: where in the user's code a launch, transfer, region or allocation came from.

The site is the first frame outside cltrace, pyopencl (with pytools, whose generated code its
invokers are), ``contextlib`` (``ExitStack.enter_context`` enters a region for its caller) and any
module the user lists as a library (``configure(library_modules=...)``);
``stack_depth=N`` records N such frames. Capture is split so the hot path stays cheap:
``capture()`` walks frames and returns a raw tuple ``(code, offset, ...)`` (no line lookup); the
resolver's worker turns it into a ``CallSite`` later (``timeline.sites``).

Cost contract (``benchmarks/bench_callsite.py``): where the C extension is built, ``capture`` is
one C call: it walks the frames with a per-code-object "library?" flag kept in the code object's
extra slot, and hands out one cached tuple per (code, offset), so a line seen before allocates
nothing. The fallback (``CLTRACE_NATIVE=0``) does the same walk in Python, the flag in a dict keyed
by the code object's identity (hashing a code object hashes its contents: too slow here).
``stack_depth=0`` turns capture off (``None`` everywhere).
"""
from __future__ import annotations

import contextlib
import os
import sys
from types import CodeType
from typing import Any, Iterable

import pyopencl
import pytools

from .._native import choose, extension
from ..timeline.sites import CallSite, describe

__all__ = ["CallSite", "capture", "configure", "describe", "here", "set_library_modules", "CAPTURE_PATH"]

_getframe = sys._getframe


def _package_dir(module: Any) -> str:
    return os.path.dirname(os.path.abspath(getattr(module, "__file__", "") or "")) + os.sep


_CLTRACE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_BUILTIN: tuple[str, ...] = (_CLTRACE_DIR, _package_dir(pyopencl), _package_dir(pytools),
                             os.path.abspath(contextlib.__file__),
                             "<frozen ", "<generated: ", "<cltrace ")  # frozen stdlib, generated code
_prefixes: tuple[str, ...] = _BUILTIN
_modules: tuple[str, ...] = ()
_depth = 1
_gen = 1  # bumped when the library set changes: cached flags of an older generation are stale


def _classify(code: CodeType) -> bool:
    """Is this code object library code (not a call site)? The slow path, once per code object."""
    return code.co_filename.startswith(_prefixes)


# ---- the Python fallback --------------------------------------------------------------------
_lib: dict[int, bool] = {}  # id(code) -> library?
_kept: list[CodeType] = []  # the code objects in _lib, kept alive so an id is never reused meanwhile


def _remember(code: CodeType) -> bool:
    lib = _classify(code)
    _kept.append(code)
    _lib[id(code)] = lib
    return lib


# (id(code) << 16 | offset) -> its one-frame capture, shared as the C capture shares its tuples: the
# resolver then looks each distinct object up once instead of grouping a new tuple a record. A tuple holds
# its code object, so an id here is never reused while its entry lives.
_shared: dict[int, tuple] = {}
_SHARED_MAX = 4096


def _py_capture(skip: int = 1, _getframe: Any = _getframe, _get: Any = _lib.get, _id: Any = id,
                _one: Any = _shared.get) -> tuple | None:
    """(code, offset[, code, offset ...]) of the first user frames above the caller's ``skip - 1``."""
    if not _depth:
        return None
    try:
        f = _getframe(skip)
    except ValueError:
        return None
    code = f.f_code
    if _get(_id(code)) is False and _depth == 1:  # the usual case: the caller is user code
        at = f.f_lasti
        if at >= 65536:
            return (code, at)
        key = _id(code) << 16 | at
        site = _one(key)
        if site is None:
            if len(_shared) >= _SHARED_MAX:
                _shared.clear()
            site = _shared[key] = (code, at)
        return site
    return _py_walk(f)


def _py_walk(f: Any) -> tuple | None:
    out: list[Any] = []
    get = _lib.get
    while f is not None and len(out) < 2 * _depth:
        code = f.f_code
        lib = get(id(code))
        if lib is None:
            lib = _remember(code)
        if not lib:
            out += (code, f.f_lasti)
        f = f.f_back
    return tuple(out) if out else None


def _load_native() -> Any:
    _region = extension("region")
    if not hasattr(_region, "site"):
        raise ImportError("C extension built for another cltrace: reinstall cltrace")
    _region.site_config(_classify, _gen, _depth)
    return _region.site


_CHOICE = choose("call sites", _load_native)
CAPTURE_PATH: str = _CHOICE.path  # "native" or "python"
CAPTURE_DETAIL: str = _CHOICE.detail
capture: Any = _CHOICE.native or _py_capture


def _share() -> None:
    """Hand the settings to the C capture."""
    if _CHOICE.native is not None:
        extension("region").site_config(_classify, _gen, _depth)


def _reset() -> None:
    """The library set changed: every code object's cached flag is stale."""
    global _gen
    _gen += 1
    _lib.clear()
    _kept.clear()
    _share()


def set_library_modules(modules: Iterable[str]) -> None:
    """Treat these modules (by import name, packages included) as library code, not call sites.

    Raises ``ValueError`` naming a module that does not import (nothing changes then)."""
    global _prefixes, _modules
    extra = []
    names = tuple(modules)
    for name in names:
        if not isinstance(name, str) or not name:
            raise ValueError(f"library_modules: {name!r} is not a module name (give import names, e.g. 'mypkg.ops')")
        mod = sys.modules.get(name)
        if mod is None:
            try:
                mod = __import__(name, fromlist=["_"])
            except Exception as exc:
                raise ValueError(f"library_modules: cannot import {name!r} ({type(exc).__name__}: {exc}); "
                                 f"give the import name of an installed module") from None
        f = getattr(mod, "__file__", None)
        if not f:
            continue
        f = os.path.abspath(f)
        extra.append(os.path.dirname(f) + os.sep if os.path.basename(f) == "__init__.py" else f)
    _prefixes = (*_BUILTIN, *extra)
    _modules = names
    _reset()


def configure(library_modules: Iterable[str] | None = None, stack_depth: int | None = None) -> None:
    """Set the library modules skipped when looking for a call site, and how many user frames a
    site records (``stack_depth``: 1 by default, 0 records none). None leaves a setting as it is."""
    global _depth
    if stack_depth is not None and (isinstance(stack_depth, bool) or not isinstance(stack_depth, int)
                                    or not 0 <= stack_depth <= 64):
        raise ValueError(f"stack_depth must be an int from 0 to 64, not {stack_depth!r}")
    if library_modules is not None:  # first: a module that does not import changes nothing
        set_library_modules([library_modules] if isinstance(library_modules, str) else library_modules)
    if stack_depth is not None:
        _depth = stack_depth
        _share()


def settings() -> dict[str, Any]:
    """The current settings: ``library_modules`` and ``stack_depth``."""
    return {"library_modules": list(_modules), "stack_depth": _depth}


def here(skip: int = 1) -> CallSite | None:
    """The user's call site of the caller (not for the hot path: it looks the line up now)."""
    return describe(capture(skip + 1))

