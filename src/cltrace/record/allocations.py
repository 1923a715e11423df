"""pyopencl memory objects that report their allocation and release to the memory ledger.

``Buffer``, ``Image`` and ``SVMAllocation`` are pyopencl's own classes, subclassed: each is the
real object (kernels, copies and maps take it unchanged) and adds one slot, the serial of its
ledger entry. While tracing is on, construction records the bytes, the context and the user's
call site (``callsite.capture``: a frame walk, no line lookup); ``release()`` and garbage
collection (``__del__``) record the release, once. While tracing is off construction costs one
flag read. ``cltrace.instrument()`` installs these classes on the ``pyopencl`` module (so
``pyopencl.array``, ``create_image`` and ``csvm_empty`` allocate through them); without it, use
them directly (``cltrace.Buffer(...)``), as cltrace's own helpers do.

``MemoryPool``/``SVMPool`` (installed on ``pyopencl.tools``) count what a pool holds from the
driver, read at each call of the pool. Not seen: objects made while tracing is off, sub-buffers
and images on a buffer (they alias memory already counted), and memory pyopencl allocates in C++
without these classes.
"""
from __future__ import annotations

from typing import Any

import pyopencl as cl
import pyopencl._cl as _cl

from .. import _state
from .callsite import capture
from .recorder import RECORDER

_ledger = RECORDER.memory


def _track(context: Any, nbytes: int, kind: str) -> int:
    return _ledger.alloc(context, nbytes, kind, capture(1))


def _release(obj: Any) -> None:
    serial = obj._cltrace_mem
    if serial:
        obj._cltrace_mem = 0
        _ledger.free(serial)


def _collected(obj: Any) -> None:
    try:
        serial = obj._cltrace_mem
    except AttributeError:  # construction failed
        return
    if serial:
        _ledger.free(serial)


class Buffer(_cl.Buffer):
    """``pyopencl.Buffer`` whose allocation and release reach the memory counter while tracing."""

    __slots__ = ("_cltrace_mem",)

    def __init__(self, context: Any, flags: int, size: int = 0, hostbuf: Any = None) -> None:
        super().__init__(context, flags, size, hostbuf)
        self._cltrace_mem = _track(context, size or self.size, "Buffer") if _state.ENABLED else 0

    def release(self) -> None:
        _release(self)
        super().release()

    def __del__(self) -> None:
        _collected(self)


class Image(_cl.Image):
    """``pyopencl.Image`` (made by ``create_image``/``image_from_array``), counted as ``Buffer`` is."""

    __slots__ = ("_cltrace_mem",)

    def __init__(self, context: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(context, *args, **kwargs)
        on_buffer = kwargs.get("buffer") if "buffer" in kwargs else (args[6] if len(args) > 6 else None)
        self._cltrace_mem = _track(context, self.size, "Image") if _state.ENABLED and on_buffer is None else 0

    def release(self) -> None:
        _release(self)
        super().release()

    def __del__(self) -> None:
        _collected(self)


def _svm_release_methods(base: Any) -> dict[str, Any]:
    """The release paths of an SVM class (nanobind classes take no mixins)."""

    def release(self: Any) -> None:
        _release(self)
        base.release(self)

    def enqueue_release(self: Any, queue: Any = None, wait_for: Any = None) -> Any:
        _release(self)
        return base.enqueue_release(self, queue, wait_for)

    return {"release": release, "enqueue_release": enqueue_release, "__del__": _collected}


class SVMAllocation(_cl.SVMAllocation):
    """``pyopencl.SVMAllocation``, counted as ``Buffer`` is."""

    __slots__ = ("_cltrace_mem",)

    def __init__(self, context: Any, size: int, alignment: int, flags: int, queue: Any = None) -> None:
        super().__init__(context, size, alignment, flags, queue)
        self._cltrace_mem = _track(context, size, "SVM") if _state.ENABLED else 0


for _name, _method in _svm_release_methods(_cl.SVMAllocation).items():
    setattr(SVMAllocation, _name, _method)

_SVMArray: Any = None  # what svm_empty/csvm_empty allocate through (pyopencl with OpenCL 2.0 headers)
_svm_base = getattr(cl, "_OverriddenArrayInterfaceSVMAllocation", None)
if _svm_base is not None:
    class _SVMArray(_svm_base):  # type: ignore[no-redef]
        """pyopencl's SVM allocation behind ``svm_empty``/``csvm_empty`` arrays, counted."""

        def __init__(self, ctx: Any, size: int, alignment: int, flags: int, *, _interface: Any,
                     queue: Any = None) -> None:
            super().__init__(ctx, size, alignment, flags, _interface=_interface, queue=queue)
            self._cltrace_mem = _track(ctx, size, "SVM") if _state.ENABLED else 0

    for _name, _method in _svm_release_methods(_svm_base).items():
        setattr(_SVMArray, _name, _method)


def classes() -> list[tuple[str, Any]]:
    """(pyopencl attribute, counted class) pairs for ``instrument()`` to install."""
    out: list[tuple[str, Any]] = [("Buffer", Buffer), ("Image", Image), ("SVMAllocation", SVMAllocation)]
    if _SVMArray is not None:
        out.append(("_OverriddenArrayInterfaceSVMAllocation", _SVMArray))
    return out


def _pool_class(base: Any, kind: str) -> Any:
    """A pyopencl memory pool whose device-side level (``managed_bytes``: blocks held and in use)
    feeds the counter: growth is an allocation at the user's line, shrinking releases the latest
    growth first. The level is read at each call of the pool (allocation, ``free_held``,
    ``stop_holding``) and the rest is released when the pool is collected."""

    class Pool(base):  # type: ignore[misc, valid-type]
        __slots__ = ("_cltrace_ctx", "_cltrace_level", "_cltrace_chunks")

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._cltrace_ctx = None
            self._cltrace_level = 0
            self._cltrace_chunks: list[list[Any]] = []  # [serial, bytes, site], oldest first

        def _cltrace_sync(self, result: Any = None) -> None:
            if self._cltrace_ctx is None and result is not None:
                self._cltrace_ctx = getattr(result, "context", None)
            ctx = self._cltrace_ctx
            level = self.managed_bytes
            change = level - self._cltrace_level
            self._cltrace_level = level
            chunks = self._cltrace_chunks
            if change > 0 and ctx is not None and _state.ENABLED:
                site = capture(1)
                chunks.append([_ledger.alloc(ctx, change, kind, site), change, site])
            while change < 0 and chunks:
                serial, nbytes, site = chunks.pop()
                _ledger.free(serial)
                if nbytes > -change:  # part of this growth is still held
                    chunks.append([_ledger.alloc(ctx, nbytes + change, kind, site), nbytes + change, site])
                change += nbytes

        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            result = super().__call__(*args, **kwargs)
            self._cltrace_sync(result)
            return result

        def free_held(self) -> None:
            super().free_held()
            self._cltrace_sync()

        def stop_holding(self) -> None:
            super().stop_holding()
            self._cltrace_sync()

        def __del__(self) -> None:
            try:
                chunks = self._cltrace_chunks
            except AttributeError:
                return
            for serial, _, _ in chunks:
                _ledger.free(serial)

    if hasattr(base, "allocate"):
        def allocate(self: Any, *args: Any, **kwargs: Any) -> Any:
            result = base.allocate(self, *args, **kwargs)
            self._cltrace_sync(result)
            return result

        Pool.allocate = allocate
    Pool.__name__ = Pool.__qualname__ = base.__name__
    Pool.__doc__ = f"``pyopencl.tools.{base.__name__}``, its level counted as device memory ({kind!r})."
    return Pool


MemoryPool = _pool_class(_cl.MemoryPool, "pool")
SVMPool = _pool_class(_cl.SVMPool, "SVM pool") if hasattr(_cl, "SVMPool") else None


def pool_classes() -> list[tuple[str, Any]]:
    """(``pyopencl.tools`` attribute, counted class) pairs for ``instrument()`` to install."""
    return [(name, cls) for name, cls in (("MemoryPool", MemoryPool), ("SVMPool", SVMPool)) if cls is not None]
