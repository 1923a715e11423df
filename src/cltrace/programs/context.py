"""cltrace's shared OpenCL objects: one context per device, one profiling queue per context.

``compile`` builds in ``default_context(device)`` when given no context, and a
launch without a queue goes to ``default_queue(program.context)``, so programs
and launches made without explicit objects meet on the same context and queue.
``device_key`` is the platform|device|driver identity that keys program binaries and tune DB
entries: a device *model*, so identical devices share them (traces name each physical device
by ``tracks.device_info(device).uid`` instead).
"""
from __future__ import annotations

import os
import threading
from typing import Any, Callable

import pyopencl as cl

from ..record.queues import PROFILING, default_device
from ..timeline.tracks import device_info

_lock = threading.Lock()
_default_dev: dict[tuple[str | None, str | None], Any] = {}  # (CLTRACE_DEVICE, PYOPENCL_CTX) -> device
_contexts: dict[int, Any] = {}  # device int_ptr -> shared context
_queues: dict[tuple[int, int], tuple[Any, Any]] = {}  # (context, device) int_ptr -> (context, profiling queue)
_device_keys: dict[int, str] = {}  # device int_ptr -> tracks.device_info(device).key


def _default_device() -> Any:
    env = (os.environ.get("CLTRACE_DEVICE"), os.environ.get("PYOPENCL_CTX"))
    dev = _default_dev.get(env)
    if dev is None:
        dev = _default_dev[env] = default_device()
    return dev


def _once(table: dict[Any, Any], key: Any, make: Callable[[], Any]) -> Any:
    """``table[key]``, made by ``make()`` under the lock the first time (once across threads)."""
    value = table.get(key)
    if value is None:
        with _lock:
            value = table.get(key)
            if value is None:
                value = table[key] = make()
    return value


def default_context(device: Any = None) -> Any:
    """One shared context per device (cltrace's default device when None)."""
    if device is None:
        device = _default_device()
    return _once(_contexts, device.int_ptr, lambda: cl.Context([device]))


def default_queue(context: Any = None, device: Any = None) -> Any:
    """The shared in-order profiling queue of a context on one of its devices (default: its first;
    the default context when None)."""
    if context is None:
        context = default_context()
    if device is None:
        device = context.devices[0]
    # The entry holds its context, so a live entry's context address cannot be reused.
    return _once(_queues, (context.int_ptr, device.int_ptr),
                 lambda: (context, cl.CommandQueue(context, device, properties=PROFILING)))[1]


def device_key(device: Any) -> str:
    """Platform|device|driver identity of a device model (cached per device)."""
    key = _device_keys.get(device.int_ptr)
    if key is None:
        key = _device_keys[device.int_ptr] = device_info(device).key
    return key
