"""Call sites: where in the user's code a launch, transfer, region or allocation came from.

The site is the first frame outside cltrace, pyopencl and any module the user lists as a
library (``set_library_modules``). Capture is split so the hot path stays cheap: ``capture()``
walks frames and returns the frame's code object and instruction offset (no line lookup, no
allocation beyond one tuple); ``describe()`` turns that pair into a ``CallSite`` later, off the
hot path, cached per pair.
"""
from __future__ import annotations

import os
import sys
from types import CodeType
from typing import NamedTuple

import pyopencl

_getframe = sys._getframe


class CallSite(NamedTuple):
    """A user code location: file path, 1-based line number and function name."""

    file: str
    line: int
    function: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line} ({self.function})"


def _package_dir(module: object) -> str:
    return os.path.dirname(os.path.abspath(getattr(module, "__file__", "") or "")) + os.sep


_CLTRACE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_prefixes: tuple[str, ...] = (_CLTRACE_DIR, _package_dir(pyopencl))
_library: dict[CodeType, bool] = {}  # code object -> "is library code", filled as frames are seen


def set_library_modules(modules: list[str] | tuple[str, ...]) -> None:
    """Treat these modules (by import name, packages included) as library code, not call sites."""
    global _prefixes
    extra = []
    for name in modules:
        mod = sys.modules.get(name)
        if mod is None:
            mod = __import__(name, fromlist=["_"])
        f = getattr(mod, "__file__", None)
        if not f:
            continue
        f = os.path.abspath(f)
        extra.append(os.path.dirname(f) + os.sep if os.path.basename(f) == "__init__.py" else f)
    _prefixes = (_CLTRACE_DIR, _package_dir(pyopencl), *extra)
    _library.clear()


def _is_library(code: CodeType) -> bool:
    lib = _library.get(code)
    if lib is None:
        fn = code.co_filename
        lib = _library[code] = fn.startswith(_prefixes) or fn.startswith("<frozen ")
    return lib


def capture(skip: int = 1) -> tuple[CodeType, int] | None:
    """(code, instruction offset) of the first user frame above the caller's ``skip`` frames."""
    try:
        f = _getframe(skip)
    except ValueError:
        return None
    lib = _library
    while f is not None:
        code = f.f_code
        is_lib = lib.get(code)
        if is_lib is None:
            is_lib = _is_library(code)
        if not is_lib:
            return code, f.f_lasti
        f = f.f_back
    return None


_described: dict[tuple[CodeType, int], CallSite] = {}


def describe(raw: tuple[CodeType, int] | None) -> CallSite | None:
    """The ``CallSite`` of a ``capture()`` result (cached)."""
    if raw is None:
        return None
    site = _described.get(raw)
    if site is None:
        code, lasti = raw
        line = code.co_firstlineno
        for start, end, ln in code.co_lines():
            if start <= lasti < end:
                if ln is not None:
                    line = ln
                break
        site = _described[raw] = CallSite(code.co_filename, line, code.co_qualname if hasattr(code, "co_qualname") else code.co_name)
    return site


def here(skip: int = 1) -> CallSite | None:
    """The user's call site of the caller (not for the hot path: it looks the line up now)."""
    return describe(capture(skip + 1))
