"""Loading a trace file of either format: the format is told from the file's first bytes."""
from __future__ import annotations

import contextlib
import logging
import os
from typing import Any, Iterator

from ..errors import TraceFileError
from ..timeline.batch import SpanBatch
from ..timeline.spans import Span
from .chrome import load_chrome

log = logging.getLogger("cltrace")


def detect(path: str) -> str:
    with open(path, "rb") as fh:
        head = fh.read(64)
    if not head:
        raise TraceFileError("file is empty")
    first = head.lstrip()[:1]
    if first in (b"[", b"{"):
        return "json"
    if head[:1] == b"\x0a":  # protobuf field 1 (Trace.packet), length-delimited
        return "pftrace"
    raise TraceFileError("not a trace file (neither Chrome JSON nor Perfetto protobuf)")


def _check(p: str) -> str:
    if not os.path.exists(p):
        raise TraceFileError("no such file")
    if os.path.isdir(p):
        raise TraceFileError("is a directory")
    try:
        return detect(p)
    except OSError as exc:
        raise TraceFileError(f"cannot read it: {exc.strerror or exc}") from None


@contextlib.contextmanager
def _named(p: str) -> Iterator[None]:
    """A reader's ``TraceFileError`` names the file it is about: ``x.json: file is empty``."""
    try:
        yield
    except TraceFileError as exc:
        if str(exc).startswith(f"{p}: "):
            raise
        raise TraceFileError(f"{p}: {exc}") from None


# Formats the scanner reads into columns (chrome_columns, perfetto_columns).
COLUMNAR = ("json", "pftrace")


def load_columns(path: str | os.PathLike[str], scanner: Any = "default") -> tuple[SpanBatch | list[Span], dict[str, Any]]:
    """Spans and metadata of a trace file, as columns (a ``SpanBatch``) where the scanner reads the file
    (cltrace's own layout), else as the ``Span`` objects ``load`` gives. Same spans either way.

    ``scanner``: the native scanner (``scan.NATIVE``, the default; None where not built or
    ``CLTRACE_NATIVE=0``), or None for the general readers. Raises TraceFileError with a one-line reason.
    """
    p = os.fspath(path)
    with _named(p):
        kind = _check(p)
        return _said(p, kind, _columns(p, kind, scanner))


def _columns(p: str, kind: str, scanner: Any) -> tuple[SpanBatch | list[Span], dict[str, Any]]:
    if scanner == "default":
        from .scan import NATIVE as scanner
    if scanner is not None and kind in COLUMNAR:
        try:
            if kind == "json":
                from .chrome_columns import load_chrome_columns as fast
            else:
                from .perfetto_columns import load_pftrace_columns as fast
        except ModuleNotFoundError as exc:
            if not (exc.name or "").startswith("perfetto"):
                raise
        else:
            try:
                got = fast(p, scanner)
            except OSError as exc:
                raise TraceFileError(f"cannot read it: {exc.strerror}") from None
            if got is not None:
                return got
    return _load(p, kind)


def _said(p: str, kind: str, got: Any) -> Any:
    """``got``, after one warning line where the file's compressed packets were skipped (past the budget),
    or where a Chrome JSON holds nothing cltrace wrote (another tool's trace reads as no spans; a
    .pftrace of another tool is refused by its reader)."""
    spans, meta = got
    skipped = meta.get("inflate_skipped")
    if skipped:
        from .inflate import describe_skipped

        log.warning("cltrace: warning: %s: %s", p, describe_skipped(skipped))
    if kind == "json" and not len(spans) and "cltrace.version" not in meta:
        log.warning("cltrace: warning: %s: not written by cltrace (no cltrace span or metadata in it, or cut off "
                    "before them), read as an empty trace; cltrace reads the .json/.pftrace files it writes", p)
    return got


def load(path: str | os.PathLike[str]) -> tuple[list[Span], dict[str, Any]]:
    """Spans and metadata of a ``.json`` or ``.pftrace`` file, as ``Span`` objects. Raises TraceFileError
    with a one-line reason."""
    p = os.fspath(path)
    with _named(p):
        kind = _check(p)
        return _said(p, kind, _load(p, kind))


def _load(p: str, kind: str) -> tuple[list[Span], dict[str, Any]]:
    if kind == "json":
        return load_chrome(p)
    try:
        from .perfetto import load_pftrace
    except ModuleNotFoundError as exc:  # a broken install of anything else must not read as this
        if not (exc.name or "").startswith("perfetto"):
            raise
        raise TraceFileError("reading .pftrace needs the perfetto package (pip install perfetto)") from None
    return load_pftrace(p)
