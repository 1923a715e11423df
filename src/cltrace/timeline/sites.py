"""Call sites as the timeline keeps them: ``CallSite`` values, and the line lookup of a raw capture.

The hot path records a raw capture (``record/callsite.py``): a flat tuple ``(code, offset, code,
offset, ...)``, the innermost user frame first, no line looked up. The resolver turns each distinct
capture into a ``CallSite`` here, on the worker (``SiteTable``), and every output writes it under the
OpenTelemetry semantic-convention keys below.
"""
from __future__ import annotations

from operator import itemgetter
from types import CodeType
from typing import Any, Callable, NamedTuple

import numpy as np

FILE, LINE, FUNCTION, STACK = "code.file.path", "code.line.number", "code.function.name", "code.stacktrace"
KEYS = frozenset((FILE, LINE, FUNCTION, STACK))


class CallSite(NamedTuple):
    """A user code location: file path, 1-based line number and function name; ``callers`` holds the
    outer user frames (innermost first) when more than one is recorded (``stack_depth``)."""

    file: str
    line: int
    function: str
    callers: tuple["CallSite", ...] = ()

    def __str__(self) -> str:
        return f"{self.file}:{self.line} ({self.function})"

    def stacktrace(self) -> str:
        """Every recorded frame, innermost first, one per line (``file:line in function``)."""
        return "\n".join(f"{s.file}:{s.line} in {s.function}" for s in (self, *self.callers))

    def attrs(self) -> dict[str, Any]:
        """The semantic-convention attributes (``code.stacktrace`` only with callers)."""
        out: dict[str, Any] = {FILE: self.file, LINE: self.line, FUNCTION: self.function}
        if self.callers:
            out[STACK] = self.stacktrace()
        return out


def from_attrs(attrs: dict[str, Any] | None) -> CallSite | None:
    """The ``CallSite`` written into a span's attributes by ``CallSite.attrs`` (a reader's inverse)."""
    if not attrs or FILE not in attrs:
        return None
    try:
        site = CallSite(str(attrs[FILE]), int(attrs.get(LINE) or 0), str(attrs.get(FUNCTION) or ""))
    except (TypeError, ValueError, OverflowError):  # a file's line number may be anything (Infinity, "x")
        return None
    stack = attrs.get(STACK)
    if isinstance(stack, str) and "\n" in stack:
        callers = []
        for ln in stack.split("\n")[1:]:
            where, _, fn = ln.partition(" in ")
            path, _, num = where.rpartition(":")
            callers.append(CallSite(path, int(num) if num.isdecimal() else 0, fn))  # "²".isdigit(), int() refuses
        site = site._replace(callers=tuple(callers))
    return site


def without_site(attrs: dict[str, Any] | None) -> dict[str, Any] | None:
    """``attrs`` less the call-site keys (None when nothing is left)."""
    if not attrs or not KEYS.intersection(attrs):
        return attrs
    return {k: v for k, v in attrs.items() if k not in KEYS} or None


def line_of(code: CodeType, offset: int) -> int:
    """The source line of the instruction at byte ``offset`` in ``code``."""
    for start, end, line in code.co_lines():
        if start <= offset < end:
            return line if line is not None else code.co_firstlineno
    return code.co_firstlineno


def describe(raw: tuple | None) -> CallSite | None:
    """The ``CallSite`` of a raw capture (None for none)."""
    if not raw:
        return None
    frames = [CallSite(code.co_filename, line_of(code, off), getattr(code, "co_qualname", code.co_name))
              for code, off in zip(raw[::2], raw[1::2])]
    return frames[0]._replace(callers=tuple(frames[1:])) if len(frames) > 1 else frames[0]


class SiteTable:
    """Raw captures -> interned site ids (``Tables.sites``), on the resolver's thread.

    Rows that share a capture object (the native capture hands the same tuple out for the same
    line) are looked up once; distinct objects are keyed by their code objects' identities and
    offsets, never by hashing code objects (slow: CPython hashes their contents). Code objects
    seen are kept, so an identity is never reused meanwhile.
    """

    __slots__ = ("interner", "_ids", "_codes")

    def __init__(self, interner: Any) -> None:
        self.interner = interner
        self._ids: dict[tuple, int] = {}
        self._codes: dict[int, CodeType] = {}

    def ids(self, raws: list, group: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
        """The site id of each distinct capture object (-1 where there is none).

        Where many are one-frame captures (the Python capture hands out a new tuple each time), they
        are grouped by (code identity, offset) with ``group`` (``timeline.passes``) and each distinct
        one is looked up once.
        """
        n = len(raws)
        if n > 16:
            try:
                one_frame = set(map(len, raws)) == {2}
            except TypeError:  # some rows have no capture
                one_frame = False
            if one_frame:
                code = np.fromiter(map(id, map(itemgetter(0), raws)), np.int64, n)
                first, inverse = group(np.stack([code, np.fromiter(map(itemgetter(1), raws), np.int64, n)]))
                return np.array([self.site_id(raws[i]) for i in first.tolist()], np.int32)[inverse]
        return np.array([self.site_id(r) for r in raws], np.int32)

    def site_id(self, raw: tuple | None) -> int:
        if not raw:
            return -1
        key = tuple(id(x) if i % 2 == 0 else x for i, x in enumerate(raw))
        sid = self._ids.get(key)
        if sid is None:
            for code in raw[::2]:
                self._codes[id(code)] = code
            site = describe(raw)
            sid = self._ids[key] = -1 if site is None else self.interner.id(site)
        return sid
