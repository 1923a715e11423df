"""How every trace format names and numbers its processes, so that each shows the same tree.

The host process is named after the program as a process list shows it (``python3 train.py
--epochs 3``); each OpenCL device is a process of its own (``OpenCL: <device>``) whose threads
are its queues, with a pid that follows from the device's place in the registry.
"""
from __future__ import annotations

import os
import sys
from typing import Any

DEVICE_PID_BASE = 1_000_000
_MAX_NAME = 256


def program_name() -> str:
    """``<interpreter> <argv...>``, as ``ps`` shows a Python program (``python3 train.py``)."""
    orig = getattr(sys, "orig_argv", None) or [sys.executable or "python"]
    exe = os.path.basename(orig[0]) or "python"
    args = [a for a in sys.argv if a]
    name = " ".join([exe, *args])
    return name if len(name) <= _MAX_NAME else name[:_MAX_NAME - 1] + "…"


def device_pid(registry: Any, device_key: str) -> int:
    """The pid a device's process gets: 1000001 for the first device the recorder registered, and so on."""
    keys = list(registry.devices)
    return DEVICE_PID_BASE + 1 + (keys.index(device_key) if device_key in keys else len(keys))
