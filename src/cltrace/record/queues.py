"""Choosing the default device and making queues that can be profiled."""
from __future__ import annotations

import os
from typing import Any

import pyopencl as cl

from ..errors import ProfilingNotEnabledError

PROFILING = cl.command_queue_properties.PROFILING_ENABLE

_default_queue: Any = None


def has_profiling(queue: Any) -> bool:
    """Whether a queue was created with PROFILING_ENABLE.

    Asked of the driver each time (as cheap as a dict lookup): a cache keyed on
    ``int_ptr`` goes stale when a freed queue's address is reused.
    """
    return bool(queue.properties & PROFILING)


def require_profiling(queue: Any, what: str) -> None:
    if not has_profiling(queue):
        raise ProfilingNotEnabledError(what)


def _select(spec: str) -> Any:
    """Pick a device by ``CLTRACE_DEVICE``: ``"gpu"``, ``"cpu"``, ``"P:D"`` indices, or a name part."""
    platforms = cl.get_platforms()
    devices = [(p, d) for p in platforms for d in p.get_devices()]
    s = spec.strip()
    if s.lower() in ("gpu", "cpu", "accelerator"):
        want = getattr(cl.device_type, s.upper())
        for _, d in devices:
            if d.type & want:
                return d
        raise LookupError(f"CLTRACE_DEVICE={spec!r}: no {s} device among {[d.name for _, d in devices]}")
    if ":" in s and all(part.isdigit() for part in s.split(":", 1)):
        pi, di = (int(x) for x in s.split(":", 1))
        try:
            return platforms[pi].get_devices()[di]
        except IndexError:
            raise LookupError(f"CLTRACE_DEVICE={spec!r}: no such platform:device index") from None
    for p, d in devices:
        if s.lower() in d.name.lower() or s.lower() in p.name.lower():
            return d
    raise LookupError(f"CLTRACE_DEVICE={spec!r} matches none of {[d.name for _, d in devices]}")


def default_device() -> Any:
    """The device cltrace uses when none is given.

    ``CLTRACE_DEVICE`` wins, then ``PYOPENCL_CTX``; otherwise the first GPU, else the first CPU.
    """
    spec = os.environ.get("CLTRACE_DEVICE")
    if spec:
        return _select(spec)
    if os.environ.get("PYOPENCL_CTX"):
        return cl.create_some_context(interactive=False).devices[0]
    devices = [d for p in cl.get_platforms() for d in p.get_devices()]
    if not devices:
        raise LookupError("no OpenCL device found (is an ICD installed? pip install pocl-binary-distribution)")
    for want in (cl.device_type.GPU, cl.device_type.CPU):
        for d in devices:
            if d.type & want:
                return d
    return devices[0]


def profiling_queue(context: Any = None, device: Any = None, out_of_order: bool = False) -> Any:
    """A command queue with PROFILING_ENABLE, on the default device if none is given."""
    if context is None:
        device = device or default_device()
        context = cl.Context([device])
    elif device is None:
        device = context.devices[0]
    props = PROFILING
    if out_of_order:
        props |= cl.command_queue_properties.OUT_OF_ORDER_EXEC_MODE_ENABLE
    return cl.CommandQueue(context, device, properties=props)


def set_queue(queue: Any) -> None:
    """Make ``queue`` the active queue used by regions and ``timing`` when none is passed."""
    global _default_queue
    if queue is not None:
        require_profiling(queue, "cltrace.set_queue")
    _default_queue = queue


def active_queue() -> Any:
    """The queue set by ``set_queue``, or None."""
    return _default_queue
