"""Whether a device's OpenCL compiler works: a tiny real build, its verdict kept on disk.

A runtime can list a device whose compiler fails every build (the PoCL bundled with pyopencl's
wheels, LLVM 14, on CPUs newer than LLVM 14 knows: ``unknown target CPU 'generic'``). Choosing the
default device, cltrace asks ``verdict(device)`` and passes such a device by. The first time per
device model and driver version this builds ``PROBE_SOURCE`` (tens of milliseconds to a second);
the verdict is then a small JSON file under ``<cache_dir>/devices/`` (folders 0700), read back for
free. A verdict file is read as hostile input: one that does not parse (nested too deep included),
names another device or probe, or has a field of the wrong type is ignored, the device probed again
and the file rewritten. A verdict in a folder or file another user owns or group/others can write
(``files.refusal``) is not read, nor written there: one warning, and the device is probed.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import sys
import tempfile
from dataclasses import dataclass
from typing import Any, Sequence

import pyopencl as cl
import pyopencl._cl as _cl

from ..timeline.tracks import device_info
from .files import cache_dir, private_dirs, refusal, warn_refused, write_atomically

# Uses what kernels use: a global pointer, a work-item id, float arithmetic.
PROBE_SOURCE = "__kernel void cltrace_probe(__global float* x) { x[get_global_id(0)] *= 2.0f; }\n"
FIX = ("install a CPU runtime that compiles (Debian/Ubuntu: apt-get install pocl-opencl-icd) "
       "or your GPU's OpenCL driver; see README, 'Set-up'")


@dataclass(frozen=True)
class Verdict:
    """Whether ``device`` (its label) built the probe; ``reason``: the compiler's first log line when not."""

    device: str
    compiles: bool
    reason: str = ""
    cached: bool = False  # read from the verdict file, not probed now

    def as_dict(self) -> dict[str, Any]:
        """The keys ``cltrace devices --json`` gives each device: ``compiles``, ``compile_error`` (None when it compiles)."""
        return {"compiles": self.compiles, "compile_error": self.reason or None}


_memo: dict[tuple[int, str], Verdict] = {}  # (device int_ptr, probe hash) -> verdict, this process


def verdict(device: Any, source: str = PROBE_SOURCE, options: Sequence[str] = ()) -> Verdict:
    """Whether ``device`` compiles ``source`` with ``options``: from this process's memory, else the
    verdict file, else a real build (whose verdict is then stored)."""
    probe = _probe_id(source, options)
    got = _memo.get((device.int_ptr, probe))
    if got is not None:
        return got
    info = device_info(device)
    path = verdict_path(device, source, options)
    got = _read(path, info.key, probe, info.label)
    if got is None:
        got = build_probe(device, source, options)
        doc = {"device_key": info.key, "probe": probe, "compiles": got.compiles, "reason": got.reason}
        refused = refusal(cache_dir(), os.path.dirname(path))
        if refused is not None:
            warn_refused("device verdict cache", refused)
        try:
            if refused is None:
                private_dirs(os.path.dirname(path))
                write_atomically(path, json.dumps(doc).encode())
        except OSError:  # a cache that cannot be written costs a probe per process, nothing else
            pass
    _memo[(device.int_ptr, probe)] = got
    return got


def verdict_path(device: Any, source: str = PROBE_SOURCE, options: Sequence[str] = ()) -> str:
    """The file keeping the verdict of this probe on this device model and driver version."""
    name = hashlib.sha256(f"{device_info(device).key}\n{_probe_id(source, options)}".encode()).hexdigest()[:40]
    return os.path.join(cache_dir(), "devices", name + ".json")


def _probe_id(source: str, options: Sequence[str]) -> str:
    return hashlib.sha256(json.dumps([source, list(options)]).encode()).hexdigest()


def _read(path: str, key: str, probe: str, label: str) -> Verdict | None:
    """The verdict stored at ``path`` for this device and probe, or None (absent, unreadable, not ours)."""
    try:
        with open(path, "rb") as fh:
            refused = refusal(cache_dir(), path, os.fstat(fh.fileno()))
            if refused is not None:
                warn_refused("device verdict cache", refused)
                return None  # probed again, and the verdict written over it (its folder is trusted)
            doc = json.loads(fh.read(65536))
    except (OSError, ValueError, RecursionError):
        return None
    if (not isinstance(doc, dict) or doc.get("device_key") != key or doc.get("probe") != probe
            or not isinstance(doc.get("compiles"), bool) or not isinstance(doc.get("reason"), str)):
        return None
    return Verdict(label, doc["compiles"], "" if doc["compiles"] else (doc["reason"] or "the build failed"), True)


def build_probe(device: Any, source: str = PROBE_SOURCE, options: Sequence[str] = ()) -> Verdict:
    """Build ``source`` on ``device`` now, in a context of its own. What the compiler prints on the
    process's stderr meanwhile is caught, so a failing compiler costs the user one line, cltrace's."""
    label = device_info(device).label
    sys.stderr.flush()
    saved = os.dup(2)
    raw = None
    with tempfile.TemporaryFile() as caught:
        os.dup2(caught.fileno(), 2)
        try:
            raw = _cl._Program(cl.Context([device]), source)
            raw._build(" ".join(options).encode(), [device])
            return Verdict(label, True)
        except cl.Error as exc:
            log = ""
            if raw is not None:  # else the context could not be made
                try:
                    log = raw.get_build_info(device, cl.program_build_info.LOG) or ""
                except cl.Error:
                    pass
            caught.seek(0)
            printed = caught.read(4096).decode("utf-8", "replace")
            return Verdict(label, False, _first_line(log) or _first_line(printed) or str(exc).strip())
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def _first_line(text: str) -> str:
    """The first non-empty line, the driver's temporary source path (PoCL's ``/…/tempfile_x.cl:``) cut."""
    line = next((line.strip() for line in text.splitlines() if line.strip()), "")
    return re.sub(r"/\S*\.cl:", "source:", line)
