"""Which physical device a ``cl.Device`` is: its platform/device index and a hardware identifier.

Two identical GPUs have the same name, vendor and driver; only their position and their
hardware tell them apart. The hardware identifier is the PCI address where the driver
gives one (``cl_khr_pci_bus_info``, or NVIDIA's ``cl_nv_device_attribute_query``), else
the device UUID (``cl_khr_device_uuid``), else nothing (the index alone then names it).
pyopencl has no names for the two KHR queries, so they go to ``clGetDeviceInfo``
directly, through the OpenCL library pyopencl loaded; only for devices that list the
extension.
"""
from __future__ import annotations

import ctypes
import logging
import struct
from typing import Any

from .stamps import opencl_library

log = logging.getLogger("cltrace")

CL_DEVICE_PCI_BUS_INFO_KHR = 0x410F  # struct {cl_uint domain, bus, device, function}
CL_DEVICE_UUID_KHR = 0x106A  # cl_uchar[16]

_get_info: Any = None  # clGetDeviceInfo, or False where no OpenCL library could be loaded


def raw_device_info(device: Any, param: int, size: int) -> bytes | None:
    """``clGetDeviceInfo(device, param)`` as ``size`` bytes; None if the driver refuses it."""
    global _get_info
    if _get_info is None:
        _get_info = False
        path = opencl_library()
        try:
            fn = ctypes.CDLL(path).clGetDeviceInfo if path else None
        except (OSError, AttributeError) as exc:
            log.debug("cltrace: cannot load clGetDeviceInfo from %s: %s", path, exc)
            fn = None
        if fn is not None:
            fn.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_size_t, ctypes.c_void_p,
                           ctypes.POINTER(ctypes.c_size_t)]
            fn.restype = ctypes.c_int32
            _get_info = fn
    if not _get_info:
        return None
    buf = ctypes.create_string_buffer(size)
    got = ctypes.c_size_t(0)
    if _get_info(ctypes.c_void_p(device.int_ptr), param, size, buf, ctypes.byref(got)) != 0 or got.value != size:
        return None
    return buf.raw


def pci_address(domain: int, bus: int, dev: int, function: int) -> str:
    """The usual ``DDDD:BB:DD.F`` spelling (as ``nvidia-smi`` and ``lspci -D`` print it)."""
    return f"{domain:04x}:{bus:02x}:{dev:02x}.{function:x}"


def decode_pci_bus_info(raw: bytes) -> str:
    """``cl_device_pci_bus_info_khr`` bytes -> PCI address."""
    return pci_address(*struct.unpack("=4I", raw))


def decode_uuid(raw: bytes) -> str:
    """16 UUID bytes -> ``8-4-4-4-12`` hex."""
    h = raw.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def _nv_pci(device: Any) -> str | None:
    import pyopencl as cl

    bus = device.get_info(cl.device_info.PCI_BUS_ID_NV)
    slot = device.get_info(cl.device_info.PCI_SLOT_ID_NV)
    try:
        domain = device.get_info(cl.device_info.PCI_DOMAIN_ID_NV)
    except cl.Error:  # older drivers: no domain query
        domain = 0
    return pci_address(domain, bus & 0xFF, (slot >> 3) & 0x1F, slot & 7)


def hardware_id(device: Any) -> str:
    """``pci:DDDD:BB:DD.F``, ``uuid:…`` or "" (the driver offers neither)."""
    try:
        ext = device.extensions.split()
    except Exception:
        return ""
    if "cl_khr_pci_bus_info" in ext:
        raw = raw_device_info(device, CL_DEVICE_PCI_BUS_INFO_KHR, 16)
        if raw is not None:
            return "pci:" + decode_pci_bus_info(raw)
    if "cl_nv_device_attribute_query" in ext:
        try:
            return "pci:" + _nv_pci(device)
        except Exception as exc:  # an attribute the driver does not give: try the next source
            log.debug("cltrace: NVIDIA PCI query failed on %s: %s", device.name, exc)
    if "cl_khr_device_uuid" in ext:
        raw = raw_device_info(device, CL_DEVICE_UUID_KHR, 16)
        if raw is not None and any(raw):
            return "uuid:" + decode_uuid(raw)
    return ""


def platform_index(device: Any) -> tuple[int, int, int]:
    """(platform index, device index, devices on that platform); device index -1 for a sub-device."""
    import pyopencl as cl

    plat = device.platform
    platforms = cl.get_platforms()
    pi = next((i for i, p in enumerate(platforms) if p.int_ptr == plat.int_ptr), -1)
    try:
        devices = plat.get_devices()
    except cl.Error:
        devices = []
    di = next((i for i, d in enumerate(devices) if d.int_ptr == device.int_ptr), -1)
    return pi, di, len(devices)
