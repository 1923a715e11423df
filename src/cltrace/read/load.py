"""Loading a trace file of either format: the format is told from the file's first bytes."""
from __future__ import annotations

import logging
import os
from typing import Any

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


def _check(path: str | os.PathLike[str]) -> tuple[str, str]:
    p = os.fspath(path)
    if not os.path.exists(p):
        raise TraceFileError(f"no such file: {p}")
    if os.path.isdir(p):
        raise TraceFileError(f"is a directory: {p}")
    return p, detect(p)


# Formats the scanner reads into columns (chrome_columns, perfetto_columns).
COLUMNAR = ("json", "pftrace")


def load_columns(path: str | os.PathLike[str], scanner: Any = "default") -> tuple[SpanBatch | list[Span], dict[str, Any]]:
    """Spans and metadata of a trace file, as columns (a ``SpanBatch``) where the scanner reads the file
    (cltrace's own layout), else as the ``Span`` objects ``load`` gives. Same spans either way.

    ``scanner``: the native scanner (``scan.NATIVE``, the default; None where not built or
    ``CLTRACE_NATIVE=0``), or None for the general readers. Raises TraceFileError with a one-line reason.
    """
    p, kind = _check(path)
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
                raise TraceFileError(f"cannot read {p}: {exc.strerror}") from None
            if got is not None:
                return _said(p, got)
    return _said(p, _load(p, kind))


def _said(p: str, got: Any) -> Any:
    """``got``, after one warning line where the file's compressed packets were skipped (past the budget)."""
    skipped = got[1].get("inflate_skipped")
    if skipped:
        from .inflate import describe_skipped

        log.warning("cltrace: warning: %s: %s", p, describe_skipped(skipped))
    return got


def load(path: str | os.PathLike[str]) -> tuple[list[Span], dict[str, Any]]:
    """Spans and metadata of a ``.json`` or ``.pftrace`` file, as ``Span`` objects. Raises TraceFileError
    with a one-line reason."""
    p, kind = _check(path)
    return _said(p, _load(p, kind))


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
