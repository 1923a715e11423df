"""Choosing the default device (one whose compiler works) and making queues that can be profiled."""
from __future__ import annotations

import logging
import os
import sys
from typing import Any, Callable, Sequence

import pyopencl as cl

from ..errors import DeviceError, ProfilingNotEnabledError
from . import probe

PROFILING = cl.command_queue_properties.PROFILING_ENABLE
log = logging.getLogger("cltrace")

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


class NoSuchDevice(LookupError):
    """``CLTRACE_DEVICE`` names no device of this machine (the message says which there are)."""


def _select(spec: str) -> list[Any]:
    """The devices ``CLTRACE_DEVICE`` names, in order: ``"gpu"``, ``"cpu"``, ``"accelerator"`` (each of
    that type), ``"P:D"`` indices (that one), or a part of a device's or platform's name; ``NoSuchDevice``
    where it names none."""
    platforms = cl.get_platforms()
    devices = [(p, d) for p in platforms for d in p.get_devices()]
    s = spec.strip()
    if s.lower() in ("gpu", "cpu", "accelerator"):
        want = getattr(cl.device_type, s.upper())
        found = [d for _, d in devices if d.type & want]
        if not found:
            raise NoSuchDevice(f"CLTRACE_DEVICE={spec!r}: no {s} device among {[d.name for _, d in devices]}")
        return found
    if ":" in s and all(part.isdigit() for part in s.split(":", 1)):
        pi, di = (int(x) for x in s.split(":", 1))
        try:
            return [platforms[pi].get_devices()[di]]
        except IndexError:
            raise NoSuchDevice(f"CLTRACE_DEVICE={spec!r}: no such platform:device index") from None
    found = [d for p, d in devices if s.lower() in d.name.lower() or s.lower() in p.name.lower()]
    if not found:
        raise NoSuchDevice(f"CLTRACE_DEVICE={spec!r} matches none of {[d.name for _, d in devices]}")
    return found


def default_device() -> Any:
    """The device cltrace uses when none is given.

    ``CLTRACE_DEVICE`` wins, then ``PYOPENCL_CTX``; otherwise the first GPU, else the first CPU, else
    any device, passing by each one whose compiler fails (``probe.verdict``: a tiny real build the
    first time per device and driver, a cached verdict after). Raises ``DeviceError`` naming the
    device, the compiler's reason and the fix where no device can build, or where the device the
    environment chose cannot. A ``CLTRACE_DEVICE`` that names no device at all is a bad setting like
    any other: one warning, and the choice goes on as if it were unset (the command line, which
    checks it before any work, exits 2 instead: ``strict``).
    """
    return _default_device(strict=False)


def _default_device(strict: bool) -> Any:
    spec = os.environ.get("CLTRACE_DEVICE")
    if spec:
        try:
            chosen = _select(spec)
        except NoSuchDevice as exc:
            if strict:
                raise
            if spec not in _bad_specs:
                _bad_specs.add(spec)
                log.warning("cltrace: %s; using the default device (set CLTRACE_DEVICE to gpu, cpu, P:D or "
                            "part of a device name: `cltrace devices` lists them)", exc)
        else:
            return _chosen(chosen, f"CLTRACE_DEVICE={spec!r}")
    if os.environ.get("PYOPENCL_CTX"):
        return _chosen(cl.create_some_context(interactive=False).devices[:1],
                       f"PYOPENCL_CTX={os.environ['PYOPENCL_CTX']!r}")
    try:
        devices = [d for p in cl.get_platforms() for d in p.get_devices()]
    except cl.Error as exc:
        raise DeviceError(f"no OpenCL platform found ({exc}); {probe.FIX}") from None  # as `cltrace devices`
    if not devices:
        raise DeviceError(f"no OpenCL device found; {probe.FIX}")
    rank = {cl.device_type.GPU: 0, cl.device_type.CPU: 1}
    return choose(sorted(devices, key=lambda d: min((r for t, r in rank.items() if d.type & t), default=2)))


def choose(candidates: Sequence[Any], verdict: Callable[[Any], probe.Verdict] = probe.verdict) -> Any:
    """The first of ``candidates`` whose compiler builds (``verdict(device).compiles``). Each one passed
    by is named on stderr with the compiler's reason when its probe ran (once per machine, driver and
    probe: later processes read the kept verdict quietly, ``cltrace devices`` shows it); none: ``DeviceError``."""
    failed: list[probe.Verdict] = []
    for device in candidates:
        v = verdict(device)
        if not v.compiles:
            failed.append(v)
            continue
        for f in failed:
            if f.device not in _skipped and not f.cached:
                _skipped.add(f.device)
                print(f"cltrace: skipping {f.device}: its OpenCL compiler fails ({f.reason}); "
                      f"using {v.device}", file=sys.stderr, flush=True)
        return device
    if not failed:
        raise DeviceError(f"no OpenCL device found; {probe.FIX}")
    others = f" (and {len(failed) - 1} other device(s) likewise)" if len(failed) > 1 else ""
    raise DeviceError(f"no OpenCL device here can compile: {failed[0].device}: {failed[0].reason}{others}; "
                      f"{probe.FIX}")


_skipped: set[str] = set()  # devices already named as skipped in this process
_bad_specs: set[str] = set()  # CLTRACE_DEVICE values already warned about in this process


def checked_default_device() -> Any:
    """``default_device()``, except that a ``CLTRACE_DEVICE`` naming no device raises ``NoSuchDevice``
    (the command line says so and exits 2 before any work, as for every mistake in its settings)."""
    return _default_device(strict=True)


def _chosen(candidates: Sequence[Any], chosen_by: str) -> Any:
    """The first of the devices the environment chose whose compiler builds; where none does,
    DeviceError saying so: never a device the user did not ask for."""
    try:
        return choose(candidates)
    except DeviceError:
        v = probe.verdict(candidates[0])
        also = f", as do the {len(candidates) - 1} other device(s) it matches" if len(candidates) > 1 else ""
        raise DeviceError(f"{chosen_by} chose {v.device}, whose OpenCL compiler fails ({v.reason}){also}; choose "
                          f"another device (`cltrace devices` shows which compile) or {probe.FIX}") from None


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
