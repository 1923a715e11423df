"""Tracks: the named timelines spans are placed on.

Following Perfetto's TrackEvent model, every span sits on a track with a
stable id and a human name: one per host thread, one per (device queue,
submitting thread), and one for program compile/build work.
"""
from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from typing import Any

HOST_THREAD = "thread"
DEVICE_QUEUE = "queue"
COMPILE = "compile"
COMPILE_TRACK_NAME = "OpenCL compile"

# Pseudo thread ident for raw records: the resolver places such (host-only) spans on
# the compile track instead of a host thread track. Real thread idents are never 0.
COMPILE_THREAD = 0
_IDENT_MASK = (1 << 64) - 1  # a thread key's low bits are the OS thread ident


@dataclass
class Track:
    id: int
    kind: str  # HOST_THREAD, DEVICE_QUEUE or COMPILE
    name: str
    process: str  # the process group it belongs to (host process or device)
    device: str | None = None  # device uid (``DeviceInfo.uid``) for queue tracks
    attrs: dict[str, Any] = field(default_factory=dict)
    pid: int = 0  # the host process of a host track where it is not the registry's (merged traces)


@dataclass
class DeviceInfo:
    key: str  # model identity platform|device|driver: shared by identical devices (binaries, tuned winners)
    name: str
    platform: str
    vendor: str
    driver: str
    version: str
    type: str
    index: str = ""  # "P:D": platform and device index, as `cltrace devices` lists them
    hardware_id: str = ""  # "pci:0000:1b:00.0" or "uuid:<hex>" where the driver gives one
    uid: str = ""  # one physical device: key|index[|hardware id]; keys clocks and devices in trace metadata
    label: str = ""  # display name: the name, with "#D (pci)" when its platform has more than one device


_INFOS: dict[int, DeviceInfo] = {}  # root device handle -> its info (handles live as long as the process)


def device_info(device: Any) -> DeviceInfo:
    """What identifies a device, computed once per root device: see ``DeviceInfo``."""
    info = _INFOS.get(device.int_ptr)
    if info is None:
        info = _device_info(device)
        if info.index:
            _INFOS[device.int_ptr] = info
    return info


def _device_info(device: Any) -> DeviceInfo:
    import pyopencl as cl

    from .device_id import hardware_id, platform_index

    platform = device.platform
    name = device.name.strip()
    driver = device.driver_version.strip()
    key = f"{platform.name.strip()}|{name}|{driver}"
    pi, di, count = platform_index(device)
    index = f"{pi}:{di}" if di >= 0 else ""
    hw = hardware_id(device)
    uid = "|".join(x for x in (key, index or f"handle 0x{device.int_ptr:x}", hw) if x)
    label = name
    if count > 1 or di < 0:
        label += f" #{di}" if di >= 0 else " (sub-device)"
        if hw.startswith("pci:"):
            label += f" ({hw[4:]})"
        elif hw.startswith("uuid:"):
            label += f" (uuid {hw[5:13]})"
    return DeviceInfo(
        key=key,
        name=name,
        platform=platform.name.strip(),
        vendor=device.vendor.strip(),
        driver=driver,
        version=device.version.strip(),
        type=cl.device_type.to_string(device.type),
        index=index,
        hardware_id=hw,
        uid=uid,
        label=label,
    )


class TrackRegistry:
    """Assigns track ids. Thread-safe; lookups after the first are dict hits."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tracks: dict[int, Track] = {}
        self._by_key: dict[Any, int] = {}
        self._queue_index: dict[str, int] = {}  # device uid -> queues seen so far
        self._queue_names: dict[tuple[int, int], tuple[str, int]] = {}  # (queue, device) ptr -> (device uid, index)
        self._generations: dict[int, int] = {}  # OS thread ident -> threads seen with it, minus one
        self.devices: dict[str, DeviceInfo] = {}  # by uid: one entry per physical device
        self.pid = os.getpid()

    def tracks(self) -> list[Track]:
        with self._lock:
            return list(self._tracks.values())

    def get(self, track_id: int) -> Track:
        return self._tracks[track_id]

    def _add(self, key: Any, kind: str, name: str, process: str, **kw: Any) -> int:
        with self._lock:
            tid = self._by_key.get(key)
            if tid is None:
                tid = len(self._tracks) + 1
                self._tracks[tid] = Track(tid, kind, name, process, **kw)
                self._by_key[key] = tid
            return tid

    def host_thread(self, ident: int, name: str | None = None) -> int:
        """Track of a host thread, by the thread key its records carry (see ``new_thread``)."""
        tid = self._by_key.get(("thread", ident))
        if tid is not None:
            return tid
        os_ident = ident & _IDENT_MASK
        return self._add(("thread", ident), HOST_THREAD, name or _thread_name(os_ident), "host",
                         attrs={"thread.id": os_ident})

    def new_thread(self, ident: int, name: str) -> int:
        """The key a newly started thread's records carry, and its own track.

        The OS reuses a finished thread's ident; a later thread with the same ident gets
        a key of its own (the ident plus a generation above bit 64), so it gets its own track.
        """
        with self._lock:
            gen = self._generations.get(ident)
            self._generations[ident] = 0 if gen is None else gen + 1
        key = ident if gen is None else ident + ((gen + 1) << 64)
        self._add(("thread", key), HOST_THREAD, name, "host", attrs={"thread.id": ident})
        return key

    def compile_track(self) -> int:
        return self._add(("compile",), COMPILE, COMPILE_TRACK_NAME, "host")

    def register_device(self, device: Any) -> DeviceInfo:
        info = device_info(device)
        self.devices.setdefault(info.uid, info)
        return info

    def device_queue(self, queue: Any, thread_ident: int, device_uid: str | None = None,
                     lane: str | None = None) -> int:
        """Track for work a host thread submitted to a queue.

        In-order queues execute one command at a time, so a single submitting
        thread's regions and kernels nest on it; work from other threads on
        the same queue gets its own track so slices never misnest. Out-of-order
        queues run commands concurrently: their commands go to ``lane`` tracks
        (``"regions"``, ``"1"``, ``"2"``...), each free of overlaps. Tracks are named after
        the device's label (``NVIDIA H200 #1 (0000:1b:00.0) · queue 0``), so two identical
        devices never share a name.
        """
        qptr = (queue.int_ptr, queue.device.int_ptr)  # an address may come back on another device
        key = ("queue", qptr, thread_ident, lane)
        tid = self._by_key.get(key)
        if tid is not None:
            return tid
        if device_uid is None:
            device_uid = self.register_device(queue.device).uid
        info = self.devices[device_uid]
        with self._lock:
            if qptr not in self._queue_names:
                idx = self._queue_index.get(device_uid, 0)
                self._queue_index[device_uid] = idx + 1
                self._queue_names[qptr] = (device_uid, idx)
            _, idx = self._queue_names[qptr]
            other_threads = any(k[0] == "queue" and k[1] == qptr and k[2] != thread_ident for k in self._by_key)
        name = f"{info.label} · queue {idx}"
        if other_threads:
            host = self._by_key.get(("thread", thread_ident))
            name += f" · {self._tracks[host].name if host else _thread_name(thread_ident & _IDENT_MASK)}"
        if lane is not None:
            name += f" · {lane}" if not lane.isdigit() else f" · lane {lane}"
        return self._add(key, DEVICE_QUEUE, name, f"OpenCL: {info.label}", device=device_uid,
                         attrs={"queue.index": idx, "thread.id": thread_ident & _IDENT_MASK, "queue.lane": lane})

def _thread_name(ident: int) -> str:
    for t in threading.enumerate():
        if t.ident == ident:
            return t.name
    return f"thread-{ident}"
