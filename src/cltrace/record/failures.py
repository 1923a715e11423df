"""Failed launches: an error that says which launch failed and what to change.

Runs on the error path only: launch sites (``cltrace.launch``, ``Kernel`` launchers, the
``instrument()`` hooks) catch ``cl.Error`` around the enqueue and raise what
``regions.failed_launch`` returns (it also records the failed span): an error of the same
pyopencl class and status code (so ``except cl.LogicError`` and ``exc.code`` still work)
whose message names the kernel, its global and local sizes and the likely fix.
"""
from __future__ import annotations

from typing import Any

import pyopencl as cl

_status = cl.status_code


def sizes(v: Any) -> list[int] | None:
    """A global/local size as a list of ints (None stays None; anything unreadable gives None)."""
    if v is None:
        return None
    try:
        return [int(x) for x in v]
    except TypeError:
        try:
            return [int(v)]
        except (TypeError, ValueError):
            return None
    except ValueError:
        return None


def _hint(code: int, kernel: Any, queue: Any, gs: list[int] | None, ls: list[int] | None) -> str:
    """What to change, for the status codes a launch's sizes or arguments cause."""
    try:
        dev = queue.device
    except Exception:
        dev = None
    if code == _status.INVALID_WORK_GROUP_SIZE:
        limit = ""
        try:
            n = kernel.get_work_group_info(cl.kernel_work_group_info.WORK_GROUP_SIZE, dev)
            limit = f" (at most {n} work-items for this kernel on {dev.name.strip()})"
        except Exception:
            pass
        return ("local_size must divide global_size in every dimension and its product must fit the "
                f"kernel's work-group limit{limit}; pass local_size=None to let the driver choose")
    if code == _status.INVALID_WORK_ITEM_SIZE:
        try:
            return f"each local_size dimension must be at most the device's max_work_item_sizes {list(dev.max_work_item_sizes)}"
        except Exception:
            return "a local_size dimension exceeds the device's max_work_item_sizes"
    if code == _status.INVALID_GLOBAL_WORK_SIZE:
        return "every global_size dimension must be positive and fit the device"
    if code == _status.INVALID_KERNEL_ARGS:
        return "set every kernel argument (one per kernel parameter) before launching"
    if code == _status.INVALID_WORK_DIMENSION:
        return "global_size and local_size must have the same number of dimensions, 1 to 3"
    return ""


def named_error(exc: Exception, name: str, gs: list[int] | None, ls: list[int] | None,
                kernel: Any = None, queue: Any = None) -> Exception:
    """``exc`` again, as the same pyopencl error class and code, with a message naming the launch."""
    if getattr(exc, "cltrace_launch", None):  # named already by an inner launch site
        return exc
    where = f"kernel {name!r} (global_size {tuple(gs) if gs else gs}, local_size {tuple(ls) if ls else None})"
    try:
        rec = exc.args[0]
        code = rec.code()
        hint = _hint(code, kernel, queue, gs, ls)
        what = rec.what()  # pyopencl's own detail (e.g. which argument), kept first
        msg = f"{what + '; ' if what else ''}{where}{': ' + hint if hint else ''}"
        new = type(exc)(cl._cl._ErrorRecord(routine=rec.routine(), code=code, msg=msg))
    except Exception:  # an error without pyopencl's record: keep it, with a note
        exc.add_note(f"cltrace: in {where}")
        new = exc
    new.cltrace_launch = where  # type: ignore[attr-defined]
    return new
