"""Which host clock a trace's times are on, so traces of several processes can share one timeline.

Host times are ``perf_counter_ns`` (CLOCK_MONOTONIC on Linux): one clock for every process of one
boot of one machine, so their traces line up exactly. Across machines (or boots) only the Unix
time recorded next to the trace's start relates them (``start_unix_ns - start_ns``), as well as
the machines' wall clocks agree.
"""
from __future__ import annotations

import functools
import platform
import time
from typing import Any


@functools.lru_cache(maxsize=1)
def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="utf-8") as fh:  # hex; utf-8 is loaded already
            return fh.read().strip()
    except OSError:
        return ""


def identity() -> dict[str, Any]:
    """``{"name", "boot_id", "clock"}`` of this host: traces with equal non-empty ``boot_id`` (and
    ``name``) share one host clock. ``boot_id`` is empty where the system does not give one."""
    return {"name": platform.node(), "boot_id": _boot_id(),
            "clock": time.get_clock_info("perf_counter").implementation}


def same_clock(a: Any, b: Any) -> bool:
    """Whether two ``identity()`` records (as read back from files) name one host clock."""
    if not isinstance(a, dict) or not isinstance(b, dict):
        return False
    return bool(a.get("boot_id")) and a.get("boot_id") == b.get("boot_id") and a.get("name") == b.get("name")
