"""Reading events' profiling stamps in bulk (interim pyopencl implementation; the native one replaces it)."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

PATH = "python"


def handles(events: Sequence[Any]) -> list[Any]:
    return list(events)


def read(evs: Sequence[Any]) -> tuple[np.ndarray, np.ndarray]:
    n = len(evs)
    status = np.zeros(n, np.int32)
    out = np.zeros((n, 4), np.int64)
    for i, ev in enumerate(evs):
        try:
            st = ev.command_execution_status
        except Exception as exc:
            status[i] = getattr(exc, "code", -1) or -1
            continue
        if st != 0:
            status[i] = st
            continue
        try:
            p = ev.profile
            out[i] = (p.queued, p.submit, p.start, p.end)
        except Exception as exc:
            code = getattr(getattr(exc, "args", [None])[0], "code", None)
            status[i] = code if isinstance(code, int) and code < 0 else -7
    return status, out


def wait(evs: Sequence[Any]) -> None:
    if not len(evs):
        return
    import pyopencl as cl

    try:
        cl.wait_for_events(list(evs))
    except Exception:
        for ev in evs:
            try:
                ev.wait()
            except Exception:
                pass


def describe(code: int) -> str:
    """An OpenCL status or error code as its name."""
    try:
        import pyopencl as cl

        for name in dir(cl.status_code):
            if not name.startswith("_") and getattr(cl.status_code, name) == code:
                return f"{name} ({code})"
    except Exception:
        pass
    return f"OpenCL error {code}"
