"""Chrome JSON event lines of a batch: integer columns and small text tables in, bytes out.

``chrome.py`` prepares a batch per *distinct* value (one event head per name and category, one
``"pid":..,"tid":..,"ts":`` per track, one text per attrs dict and per error) and gives each row
indices into those tables; ``encode_python`` (the loop below) then writes every row's lines.

Per row: the host slice (``X``); with a device slice, the device ``X`` event too, and unless the
row is a region, the flow pair (``s`` on the host track, ``f`` on the device track) between them.
Times are microseconds with exactly three decimals (negative ones with a leading minus).

The C side (``cltrace._ext.chrome``, ``Batch``) writes a whole ``SpanBatch`` without that preparation:
``scan`` reads the id columns once and reports the keys (tracks, name and category, call site) that lookup
tables do not map to text yet, ``fill`` writes the rows' lines straight into the writer's buffer, without
the GIL. The text is the same; ``chrome.py`` uses it where built (``NATIVE``), and the Python path for a
batch whose track ids do not suit lookup tables (not a registry's: 2**22 and up) or with
``CLTRACE_NATIVE=0``. ``PATH`` says which runs ("native" or "python").
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple

import numpy as np

from .._native import choose, extension


# Rows of the int64 matrix ``ints`` (shape (len(INTS), n)): times already relative to the trace
# start where the file shows them so ("ts", "dur", "dev_ts", "dev_dur"); the rest as written.
INTS = ("id", "parent", "ts", "dur", "queued", "submit", "dev_ts", "dev_dur", "raw_start", "raw_end")
# Rows of the int32 matrix ``idx`` (shape (len(IDX), n)): indices into the Tables, and the flags.
IDX = ("head", "host", "device", "attrs", "error", "flags")
DEVICE = 1  # flag: the row has a device slice
NO_FLOW = 2  # flag: no flow between its slices (regions)


class Tables(NamedTuple):
    """Pre-encoded UTF-8 text the rows index into."""

    heads: list[bytes]  # '{"ph":"X","cat":"..","name":"..",' per (name, category)
    flow_s: list[bytes]  # '{"ph":"s",...,"id":' per head
    flow_f: list[bytes]  # '{"ph":"f","bp":"e",...,"id":' per head
    hosts: list[bytes]  # '"pid":..,"tid":..,"ts":' per host track
    devices: list[bytes]  # the same per device track (b"" for none)
    attrs: list[bytes]  # ',"key": value, ...' per attrs dict (b"" for none)
    errors: list[bytes]  # ',"status":"error","error":".."' per failed row (b"" for ok rows)


Encoder = Callable[[np.ndarray, np.ndarray, Tables, int, int], bytes]


class Batch(NamedTuple):
    """The C extension's batch path (``cltrace._ext.chrome``'s ``scan`` and ``fill``; see ``export/_chrome.c``)."""

    scan: Callable[..., tuple[list[tuple[int, int, int]], list[Any], int, int]]
    fill: Callable[..., tuple[int, int]]


# Misses ``scan`` reports, by kind: a host track, a device track, a (name, category) key, a call site + 1.
HOST_TRACK, DEVICE_TRACK, HEAD, SITE = range(4)

_MS = tuple(f"{i:03d}" for i in range(1000))


def _us(ns: int) -> str:
    """Nanoseconds -> microseconds with exactly three decimals, as text (no float rounding)."""
    if ns < 0:
        ns = -ns
        return f"-{ns // 1000}.{_MS[ns % 1000]}"
    return f"{ns // 1000}.{_MS[ns % 1000]}"


def encode_python(ints: np.ndarray, idx: np.ndarray, tables: Tables, start: int, stop: int) -> bytes:
    """Lines of rows ``start:stop``, each ending in ``",\\n"``: the pure-Python encoder."""
    heads, flow_s, flow_f, hosts, devices, attrs, errors = ([t.decode() for t in col] for col in tables)
    ms = _MS
    us = _us
    out: list[str] = []
    app = out.append
    rows = zip(*ints[:, start:stop].tolist(), *idx[:, start:stop].tolist())
    # One f-string per row kind, each under 30 parts (CPython joins longer ones through a list). A
    # device row's span id is written three times: converted to text once.
    for sid, par, hb, hd, q, sub, ds, dd, rs, re_, h, th, dv, a, e, fl in rows:
        xh = heads[h]
        hh = hosts[th]
        ts = f"{hb // 1000}.{ms[hb % 1000]}" if hb >= 0 else us(hb)
        dur = f"{hd // 1000}.{ms[hd % 1000]}" if hd >= 0 else us(hd)
        if not fl & DEVICE:
            app(f'{xh}{hh}{ts},"dur":{dur},"args":{{"span":{sid},"parent":{par},"source":"host"{errors[e]}{attrs[a]}}}}},\n')
            continue
        sid = str(sid)
        args = (f'{{"span":{sid},"parent":{par},"source":"device","queued_host_ns":{q},"submit_host_ns":{sub},'
                f'"device.start":{rs},"device.end":{re_}{errors[e]}{attrs[a]}}}')
        dh = devices[dv]
        dts = f"{ds // 1000}.{ms[ds % 1000]}" if ds >= 0 else us(ds)
        ddur = f"{dd // 1000}.{ms[dd % 1000]}" if dd >= 0 else us(dd)
        if fl & NO_FLOW:
            app(f'{xh}{hh}{ts},"dur":{dur},"args":{args}}},\n{xh}{dh}{dts},"dur":{ddur},"args":{args}}},\n')
        else:
            app(f'{xh}{hh}{ts},"dur":{dur},"args":{args}}},\n{xh}{dh}{dts},"dur":{ddur},"args":{args}}},\n'
                f'{flow_s[h]}{sid},{hh}{ts}}},\n{flow_f[h]}{sid},{dh}{dts}}},\n')
    return "".join(out).encode()


def _load_native() -> Batch:
    chrome = extension("chrome")
    return Batch(chrome.scan, chrome.fill)


_CHOICE = choose("the Chrome JSON encoder", _load_native)
NATIVE: Batch | None = _CHOICE.native  # the C batch path, or None
WHY: str = _CHOICE.why  # why NATIVE is None ("" when it is active)
PATH: str = _CHOICE.path
DETAIL: str = _CHOICE.detail

__all__ = ["INTS", "IDX", "DEVICE", "NO_FLOW", "Tables", "Batch", "NATIVE", "encode_python", "PATH", "DETAIL"]
