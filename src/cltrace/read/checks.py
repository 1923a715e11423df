"""Field checks shared by the readers: a wrongly typed field is a one-line TraceFileError, never a
traceback from deep inside the summary; and the note a reader leaves on a file that was cut off."""
from __future__ import annotations

import math
from typing import Any

from ..errors import TraceFileError
from ..timeline.spans import BUILD, COMPILE, TRANSFER

LIMIT_NS = _LIMIT_NS = 1 << 62  # times and durations beyond ~146 years are not stamps


def _show(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


def integer(v: Any, what: str) -> int:
    """``v`` as an int (an integral float is accepted, bool is not)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise TraceFileError(f"{what} is {_show(v)}, not an integer")
    if isinstance(v, float):
        if not v.is_integer():
            raise TraceFileError(f"{what} is {_show(v)}, not an integer")
        v = int(v)
    if abs(v) >= _LIMIT_NS:
        raise TraceFileError(f"{what} is {_show(v)}, out of range")
    return v


def optional_integer(v: Any, what: str) -> int | None:
    return None if v is None else integer(v, what)


def micros_to_ns(v: Any, what: str) -> int:
    """A Chrome ``ts``/``dur`` (microseconds, a number or numeric text) as integer nanoseconds."""
    if isinstance(v, str):
        try:
            v = float(v)
        except ValueError:
            raise TraceFileError(f"{what} is {_show(v)}, not a number") from None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise TraceFileError(f"{what} is {_show(v)}, not a number")
    if abs(v) * 1000 >= _LIMIT_NS:
        raise TraceFileError(f"{what} is {_show(v)}, out of range")
    return round(v * 1000)


def text(v: Any, what: str) -> str:
    """``v`` as printable text (a lone surrogate from a ``\\ud800`` escape becomes U+FFFD)."""
    if not isinstance(v, str):
        raise TraceFileError(f"{what} is {_show(v)}, not a string")
    try:
        v.encode("utf-8")
    except UnicodeEncodeError:
        v = "".join("\ufffd" if "\ud800" <= c <= "\udfff" else c for c in v)
    return v


def mapping(v: Any, what: str) -> dict[str, Any]:
    if not isinstance(v, dict):
        raise TraceFileError(f"{what} is {_show(v)}, not an object")
    return v


def _shallow(v: Any) -> Any:
    """A list or object of texts (a launch shape, a list of devices) with each text printable; deeper
    values are printed by ``repr``, which escapes a lone surrogate itself."""
    if isinstance(v, list):
        return [text(x, "text") if isinstance(x, str) else x for x in v]
    if isinstance(v, dict):
        return {text(k, "text") if isinstance(k, str) else k: text(x, "text") if isinstance(x, str) else x
                for k, x in v.items()}
    return v


def is_count(v: Any) -> bool:
    """Whether ``v`` is a count the analysis can sum (a transfer's ``bytes``): a non-negative int in range."""
    return v is None or (type(v) is int and 0 <= v < _LIMIT_NS)


def _is_key(v: Any) -> bool:
    """Whether ``v`` can key a group (a build's source hash, options, device): a scalar."""
    return v is None or isinstance(v, (str, int, float))


_BUILD_KEYS = {"source_hash": _is_key, "options": _is_key, "device": _is_key}
# The attributes the analysis computes from, by span category, and what each must be.
_OWN: dict[str, dict[str, Any]] = {TRANSFER: {"bytes": is_count}, COMPILE: _BUILD_KEYS, BUILD: _BUILD_KEYS}
_WHAT = {is_count: "a count", _is_key: "a text or a number"}


def plain(a: dict[str, Any]) -> bool:
    """Whether the attributes the analysis computes from are what it takes them for, whatever the span's
    category (the columns readers, which do not know it per attribute set, leave the rest to the
    general reader)."""
    return all(fits(a.get(k)) for own in _OWN.values() for k, fits in own.items())


def attrs(a: dict[str, Any], where: str, cat: str | None = None) -> dict[str, Any]:
    """A span's attributes, their text printable (a lone surrogate becomes U+FFFD); the ones the analysis
    computes from for the span's category checked (a transfer's ``bytes`` a count, a build's source hash,
    options and device scalars). A region's own attributes may be anything."""
    own = _OWN.get(cat or "", {})
    out = {}
    for k, v in a.items():
        if isinstance(k, str):
            k = text(k, where)
        fits = own.get(k)
        if fits is not None and not fits(v):
            raise TraceFileError(f"{where}: {k!r} is {_show(v)}, not {_WHAT[fits]}")
        if isinstance(v, str):
            v = text(v, f"{where}: {k!r:.40}")
        elif isinstance(v, (list, dict)):
            v = _shallow(v)
        out[k] = v
    return out


def cut_off(meta: dict[str, Any], read_bytes: int, file_bytes: int, events: int, skipped: int, unit: str) -> None:
    """Note in ``meta["truncated"]`` that the file ends before the run closed it, and how much was read."""
    meta["truncated"] = {"read_bytes": read_bytes, "file_bytes": file_bytes, unit: events, "skipped": skipped}


def describe_cut(info: dict[str, Any]) -> str:
    """One line for a ``meta["truncated"]`` note: what was readable and what was not."""
    unit = "events" if "events" in info else "packets"
    n = info.get(unit, 0)
    line = (f"the file is cut off (the traced run did not close it): summarised the {n:,} {unit} readable "
            f"in its first {info['read_bytes']:,} of {info['file_bytes']:,} bytes")
    if info.get("skipped"):
        line += f"; {info['skipped']:,} unreadable {'lines' if unit == 'events' else 'packets'} skipped"
    return line
