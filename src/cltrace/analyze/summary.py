"""The region/kernel statistics of a trace file (``cltrace summary``)."""
from __future__ import annotations

import os
from typing import Any

from ..read import load
from ..timeline.stats import Stats


def summarize(path: str | os.PathLike[str]) -> tuple[Stats, dict[str, Any]]:
    spans, meta = load(path)
    stats = Stats()
    stats.add(sorted(spans, key=lambda s: s.host_begin))
    return stats, meta
