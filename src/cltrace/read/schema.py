"""The run's metadata as a file states it, checked once where it is read, so the analysis, the
reports and merge can trust it.

Every field cltrace reads from the metadata has a type and a range here; a field that breaks them is a
one-line TraceFileError naming it (``metadata 'memory': 'alive'[0]: 'site' is missing``). Text anywhere in the
metadata is made printable (a lone surrogate becomes U+FFFD). Fields cltrace does not know pass as they
are (text cleaned). Notes a reader adds about the file itself (cut off, memory samples, skipped
compressed packets) are the reader's to make: the file's own copies are dropped.
"""
from __future__ import annotations

import math
from typing import Any, Callable

from ..errors import TraceFileError
from . import checks

Check = Callable[[Any, str], Any]

_MAX_DEPTH = 32  # cltrace writes metadata 4 levels deep; deeper nesting is not its own
READER_NOTES = ("truncated", "memory_samples", "inflate_skipped")


def _integer(v: Any, where: str) -> int:
    return checks.integer(v, where)


def _count(v: Any, where: str) -> int:
    v = checks.integer(v, where)
    if v < 0:
        raise TraceFileError(f"{where} is {v}, not a count (negative)")
    return v


def _number(v: Any, where: str) -> int | float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise TraceFileError(f"{where} is {checks._show(v)}, not a number")
    if isinstance(v, float) and not math.isfinite(v) or abs(v) >= 1 << 62:
        raise TraceFileError(f"{where} is {checks._show(v)}, out of range")
    return v


def _text(v: Any, where: str) -> str:
    return checks.text(v, where)


def _optional(check: Check) -> Check:
    return lambda v, where: None if v is None else check(v, where)


def _list(check: Check) -> Check:
    def run(v: Any, where: str) -> list[Any]:
        if not isinstance(v, list):
            raise TraceFileError(f"{where} is {checks._show(v)}, not a list")
        return [check(x, f"{where}[{i}]") for i, x in enumerate(v)]
    return run


def _table(check: Check) -> Check:
    """An object of any keys, each value checked by ``check``."""
    def run(v: Any, where: str) -> dict[str, Any]:
        return {k: check(x, f"{where} of {k!r:.40}") for k, x in checks.mapping(v, where).items()}
    return run


def _object(fields: dict[str, tuple[Check, bool]]) -> Check:
    """An object whose known ``fields`` (check, required) are checked; other keys pass as they are."""
    def run(v: Any, where: str) -> dict[str, Any]:
        out = dict(checks.mapping(v, where))
        for key, (check, required) in fields.items():
            if key in out:
                out[key] = check(out[key], f"{where} {key!r}" if where == "metadata" else f"{where}: {key!r}")
            elif required:
                raise TraceFileError(f"{where}: {key!r} is missing")
        return out
    return run


def _opt(check: Check) -> tuple[Check, bool]:
    return _optional(check), False


_OPT_TEXT = _opt(_text)
_OPT_COUNT = _opt(_count)
_OPT_NUMBER = _opt(_number)

_CLOCK = _object({"method": _OPT_TEXT, "domain": _OPT_TEXT, "offset_ns": _OPT_NUMBER, "bound_ns": _OPT_NUMBER,
                  "drift_ns": _OPT_NUMBER, "drift_ns_per_s": _OPT_NUMBER, "points": _OPT_COUNT,
                  "rejected": _OPT_COUNT, "placement_ns": _OPT_NUMBER, "resolution_ns": _OPT_NUMBER})
_DEVICE = _object({k: _OPT_TEXT for k in ("key", "name", "platform", "vendor", "driver", "version", "type",
                                           "index", "hardware_id", "uid", "label")})
_CONTEXT = _object({"label": (_text, True), "devices": _opt(_list(_text)), "live_bytes": _OPT_COUNT,
                    "peak_bytes": _OPT_COUNT, "peak_ns": _opt(_integer), "allocations": _OPT_COUNT,
                    "releases": _OPT_COUNT})
_ALIVE = _object({"context": (_text, True), "kind": (_text, True), "site": (_optional(_text), True),
                  "file": _OPT_TEXT, "line": _opt(_integer), "function": _OPT_TEXT, "count": (_count, True),
                  "bytes": (_count, True)})
_MEMORY = _object({"contexts": _opt(_table(_CONTEXT)), "alive": _opt(_list(_ALIVE)), "alive_sites": _OPT_COUNT,
                   "samples_dropped": _OPT_COUNT})
_HOST = _object({"name": _OPT_TEXT, "boot_id": _OPT_TEXT, "clock": _OPT_TEXT})
_TRACK = _object({"name": _OPT_TEXT, "process": _OPT_TEXT, "pid": _OPT_COUNT})
_PROCESS = _object({"name": _OPT_TEXT})

_METADATA = _object({
    "cltrace.version": _OPT_TEXT, "start_ns": (_integer, False), "start_unix_ns": (_integer, False),
    "pid": _OPT_COUNT, "host": _opt(_HOST), "dropped_spans": (_count, False),
    "memory_dropped_spans": _OPT_COUNT, "recorded_spans": (_count, False), "capacity": _OPT_COUNT,
    "overflow": _OPT_TEXT, "clocks": _opt(_table(_CLOCK)), "devices": _opt(_table(_DEVICE)),
    "memory": _opt(_MEMORY), "tracks": _opt(_table(_TRACK)), "process": _opt(_PROCESS),
})


def _printable(v: Any, depth: int = 0) -> Any:
    """``v`` with every text in it (keys too) printable; nesting deeper than cltrace writes is refused."""
    if isinstance(v, str):
        return checks.text(v, "text")
    if depth > _MAX_DEPTH and isinstance(v, (dict, list)):
        raise TraceFileError(f"the cltrace.metadata is nested more than {_MAX_DEPTH} levels deep; "
                             "cltrace writes 4: not a cltrace trace")
    if isinstance(v, dict):
        return {_printable(k, depth) if isinstance(k, str) else k: _printable(x, depth + 1) for k, x in v.items()}
    if isinstance(v, list):
        return [_printable(x, depth + 1) for x in v]
    return v


def metadata(meta: Any) -> dict[str, Any]:
    """The run's metadata as its file states it: checked, printable, without the reader's own notes."""
    meta = _printable(checks.mapping(meta, "the cltrace.metadata"))
    for key in READER_NOTES:
        meta.pop(key, None)
    return _METADATA(meta, "metadata")
