"""Per process of a merged trace (``cltrace merge``, ``cltrace run`` with children): each process's
spans, kernel and transfer device time, device busy time and host time blocked, side by side, as
HTA's per-rank tables: which process is slow, and whether it computes, copies or waits.

A row belongs to the process of its host thread's track (the merge names each process's tracks
after it); its device placement is that process's command. Busy is the union of its commands'
device intervals, blocked the union of its blocking host calls, over its own wall time (first of
its spans to last). A trace of one process has no table.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ..timeline.spans import KERNEL, TRANSFER
from .intervals import union
from .model import TraceData

CUT = " (cut off)"  # merge's mark on the name of a process whose file was cut off


def processes(td: TraceData) -> list[dict[str, Any]]:
    """One row per process of a merged trace, in the merge's order; [] for a trace of one process."""
    merged = (td.meta.get("merged") or {}).get("processes") if isinstance(td.meta.get("merged"), dict) else None
    if not isinstance(merged, list) or len(merged) < 2 or not td.n:
        return []
    tracks = td.meta.get("tracks") or {}
    threads = np.unique(td.thread)
    owner = {int(t): str((tracks.get(str(int(t))) or {}).get("process") or "") for t in threads.tolist()}
    work, blocking = td.work, td.blocking()
    kernel, transfer = td.cat_mask(KERNEL), td.cat_mask(TRANSFER)
    dur = np.where(td.on_device, td.dev_end - td.dev_start, 0)
    out = []
    for p in merged:
        if not isinstance(p, dict):
            continue
        name = str(p.get("name") or "")
        base = name[:-len(CUT)] if name.endswith(CUT) else name
        mine_threads = [t for t, n in owner.items() if n == base]
        rows = np.isin(td.thread, mine_threads)
        if not rows.any():
            continue
        t0 = int(np.where(td.on_device[rows], np.minimum(td.host_begin[rows], td.dev_start[rows]),
                          td.host_begin[rows]).min())
        t1 = int(np.maximum(td.host_end[rows], td.dev_end[rows]).max())
        bs, be, _ = union(td.dev_start[rows & work], td.dev_end[rows & work])
        hs, he, _ = union(td.host_begin[rows & blocking], td.host_end[rows & blocking])
        wall = t1 - t0
        busy = int((be - bs).sum())
        out.append({"pid": p.get("pid"), "name": name, "file": p.get("file"), "spans": int(rows.sum()),
                    "kernels": int((rows & kernel & td.on_device).sum()),
                    "kernel_ns": int(dur[rows & kernel].sum()), "transfer_ns": int(dur[rows & transfer].sum()),
                    "busy_ns": busy, "busy_pct": round(100.0 * busy / wall, 3) if wall else 0.0,
                    "blocked_ns": int((he - hs).sum()), "wall_ns": wall})
    return out
