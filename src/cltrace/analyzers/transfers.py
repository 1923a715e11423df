"""Transfer bandwidth: bytes moved per direction (host to device, device to host, device to device)
over the copies' own device time, in GB/s (10^9 bytes a second), per device.

Device time, not host time: what the copy engine took once the copy started, as HTA's memory
bandwidth does; the host's enqueue and any wait are the launch and idle questions' business. The
direction is the span's ``direction`` attribute (``cltrace.copy`` and ``cltrace run`` record it),
else read from its name (``copy HtoD``, ``x h2d``); maps, migrations and unnamed copies are
"other". Copies whose size is unknown count, but add neither bytes nor time to the bandwidth.
"""
from __future__ import annotations

import re
from typing import Any

import numpy as np

from ..timeline.spans import TRANSFER
from .model import TraceData

DIRECTIONS = ("HtoD", "DtoH", "DtoD", "HtoH", "other")
_WORDS = {"htod": "HtoD", "h2d": "HtoD", "dtoh": "DtoH", "d2h": "DtoH", "dtod": "DtoD", "d2d": "DtoD",
          "htoh": "HtoH", "h2h": "HtoH"}


def direction_of(name: str, attr: Any) -> str:
    """The direction of a transfer span: its attribute, else a word of its name, else "other"."""
    if attr in DIRECTIONS:
        return str(attr)
    for word in re.split(r"[^0-9a-z]+", name.lower()):
        if word in _WORDS:
            return _WORDS[word]
    return "other"


def transfers(td: TraceData) -> list[dict[str, Any]]:
    """One row per device and direction: count, bytes, device time, GB/s; in direction order."""
    idx = np.flatnonzero(td.cat_mask(TRANSFER) & td.on_device)
    if not len(idx):
        return []
    groups: dict[tuple[str, str], dict[str, Any]] = {}
    dur = (td.dev_end[idx] - td.dev_start[idx]).tolist()
    for i, ns in zip(idx.tolist(), dur):
        q = td.queues.get(int(td.track[i]))
        device = q.device if q is not None else f"queue track {int(td.track[i])}"
        key = (device, direction_of(td.names[td.name[i]], td.attr(i, "direction")))
        g = groups.setdefault(key, {"device": device, "direction": key[1], "count": 0, "bytes": 0, "device_ns": 0,
                                    "sized_ns": 0, "unsized": 0})
        g["count"] += 1
        g["device_ns"] += ns
        n = td.attr(i, "bytes")
        if isinstance(n, int) and not isinstance(n, bool) and n >= 0:
            g["bytes"] += n
            g["sized_ns"] += ns
        else:
            g["unsized"] += 1
    for g in groups.values():
        g["gb_per_s"] = round(g["bytes"] / g["sized_ns"], 3) if g["sized_ns"] > 0 and g["bytes"] else None
    return sorted(groups.values(), key=lambda g: (g["device"], DIRECTIONS.index(g["direction"])))
