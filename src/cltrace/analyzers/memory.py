"""Device memory: the peak of live bytes per context, when it happened, and what is still alive.

The peak and its time come from the counter samples the trace holds (``memory_samples``, read back
from the file's counter tracks, or the recorder's ledger in memory), so they can be found in the
timeline; the region open at that moment says what the program was doing. What was still allocated
when the trace was closed, grouped by the user's allocating line, comes from the run's metadata
(``memory``). Where samples were dropped (a run past the ledger's cap) the peak is the ledger's.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ..timeline.spans import REGION_CATS
from .model import TraceData


def memory(td: TraceData) -> dict[str, Any]:
    """The memory section of the analysis (empty when the trace saw no allocation)."""
    meta = td.meta.get("memory") if isinstance(td.meta.get("memory"), dict) else {}
    samples: dict[str, list] = td.meta.get("memory_samples") or {}
    figures = {c.get("label"): c for c in (meta.get("contexts") or {}).values() if isinstance(c, dict)}
    dropped = int(meta.get("samples_dropped") or 0)
    contexts = []
    for label in sorted(set(samples) | set(figures), key=_label_order):
        fig = figures.get(label, {})
        pts = samples.get(label) or []
        row: dict[str, Any] = {"context": label, "devices": fig.get("devices", []),
                               "allocations": fig.get("allocations"), "releases": fig.get("releases"),
                               "samples": len(pts)}
        if pts and not dropped:
            values = [v for _, v in pts]
            i = int(np.argmax(values))  # the first time the peak was reached
            row.update(peak_bytes=values[i], peak_ns=int(pts[i][0]), end_bytes=values[-1])
            row["peak_at_ns"] = row["peak_ns"] - td.origin if td.spans else None
            row["during"] = _open_region(td, row["peak_ns"])
        else:  # the ledger's own figures; its clock is not the file's, so no time
            row.update(peak_bytes=fig.get("peak_bytes"), peak_ns=None, end_bytes=fig.get("live_bytes"),
                       peak_at_ns=None, during=None)
        contexts.append(row)
    if not contexts:
        return {}
    return {"contexts": contexts, "alive": list(meta.get("alive") or []),
            "alive_sites": int(meta.get("alive_sites") or 0), "samples_dropped": dropped}


def _label_order(label: str) -> tuple[int, str]:
    tail = label.rsplit(" ", 1)[-1]
    return (int(tail), label) if tail.isdigit() else (1 << 30, label)


def _open_region(td: TraceData, t: int) -> str | None:
    """The innermost region open on the host at ``t`` ("train / step"), or None."""
    regions = td.cat_mask(*REGION_CATS) & (td.host_begin <= t) & (td.host_end >= t)
    rows = np.flatnonzero(regions)
    if not len(rows):
        return None
    best = max(rows.tolist(), key=lambda i: (len(td.spans[i].path), td.host_begin[i]))
    sp = td.spans[best]
    return " / ".join(sp.path) if sp.path else sp.name
