"""``cltrace run --steps-from REGION``: each outermost occurrence of a named region is a step, for
a script that does not call ``cltrace.step()``.

While installed, the regions ``timing_region``/``region`` make (and regions used as decorators)
come from ``_StepRegion``: before an outermost ``REGION`` opens, a step begins (its phase sets
the tracing flag), and after it closes the step ends; the region itself is recorded only when
its step is traced. Every other name goes straight to the real region. Only this mode pays the
one extra call per region; ``uninstall`` puts the real type back.
"""
from __future__ import annotations

import functools
from typing import Any, Callable

from .. import _state
from ..capture import stepper
from ..record import regions
from ..timeline.spans import REGION

_saved: tuple[Any, Any] | None = None


def install(name: str) -> None:
    """Make each outermost region called ``name`` a step of the running schedule."""
    global _saved
    if _saved is not None:
        uninstall()
    real = regions._RegionType
    depth = [0]

    class _StepRegion:
        __slots__ = ("_args", "_inner", "_outer")

        def __init__(self, rname: str, queue: Any = None, attrs: dict[str, Any] | None = None,
                     cat: str = REGION) -> None:
            self._args = (rname, queue, attrs, cat)

        def __enter__(self) -> Any:
            rname, queue, attrs, cat = self._args
            self._outer = False
            if rname == name:
                if depth[0] == 0 and (s := stepper.current()) is not None:
                    s.begin_step()
                    self._outer = True
                depth[0] += 1
            self._inner = inner = real(rname, queue, attrs, cat) if _state.ENABLED else regions.NOOP
            return inner.__enter__()

        def __exit__(self, et: Any, ev: Any, tb: Any) -> Any:
            try:
                return self._inner.__exit__(et, ev, tb)
            finally:
                if self._args[0] == name:
                    depth[0] -= 1
                    s = stepper.current()
                    if self._outer and s is not None:
                        s.end_step()

        def set(self, key: str, value: Any) -> None:
            self._inner.set(key, value)

        def __call__(self, fn: Callable[..., Any]) -> Callable[..., Any]:
            args = self._args

            @functools.wraps(fn)
            def wrapper(*a: Any, **k: Any) -> Any:
                with _StepRegion(*args):
                    return fn(*a, **k)

            return wrapper

    _saved = (regions._NativeRegion, regions._RegionType)
    regions._NativeRegion = regions._RegionType = _StepRegion


def uninstall() -> None:
    global _saved
    if _saved is not None:
        regions._NativeRegion, regions._RegionType = _saved
        _saved = None
