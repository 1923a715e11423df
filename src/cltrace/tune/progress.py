"""The optional tqdm progress bar of a sweep, showing the best trial so far."""
from __future__ import annotations

import sys
from typing import Any

from ..analyzers.report import format_ns
from .result import Trial


def progress_bar(show: bool, total: int, desc: str) -> Any:
    """A tqdm bar on stderr for ``total`` trials, or None when not shown."""
    if not show:
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="trial", file=sys.stderr, leave=False, dynamic_ncols=True)


def tick(bar: Any, best: Trial | None) -> None:
    """Advance ``bar`` by one trial and show the best so far."""
    if bar is None:
        return
    if best is not None:
        bar.set_postfix_str(f"best {best.config.label()} {format_ns(best.median_ns)}", refresh=False)
    bar.update(1)
