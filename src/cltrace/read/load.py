"""Loading a trace file of either format: the format is told from the file's first bytes."""
from __future__ import annotations

import os
from typing import Any

from ..errors import TraceFileError
from ..timeline.spans import Span
from .chrome import load_chrome


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


def load(path: str | os.PathLike[str]) -> tuple[list[Span], dict[str, Any]]:
    """Spans and metadata of a ``.json`` or ``.pftrace`` file. Raises TraceFileError with a one-line reason."""
    p = os.fspath(path)
    if not os.path.exists(p):
        raise TraceFileError(f"no such file: {p}")
    if os.path.isdir(p):
        raise TraceFileError(f"is a directory: {p}")
    kind = detect(p)
    if kind == "json":
        return load_chrome(p)
    try:
        from .perfetto import load_pftrace
    except ModuleNotFoundError as exc:  # a broken install of anything else must not read as this
        if not (exc.name or "").startswith("perfetto"):
            raise
        raise TraceFileError("reading .pftrace needs the perfetto package (pip install perfetto)") from None
    return load_pftrace(p)
