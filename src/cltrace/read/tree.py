"""Region paths of spans read back from a file, rebuilt from their parent links."""
from __future__ import annotations

from ..timeline.spans import STEP, Span


def fill_paths(spans: dict[int, Span]) -> None:
    def path(s: Span, depth: int = 0) -> tuple[str, ...]:
        if s.path:
            return s.path
        parent = spans.get(s.parent)
        own = STEP if s.cat == STEP else s.name  # every "step N" is one path, as when recorded
        s.path = (path(parent, depth + 1) if parent is not None and depth < 256 else ()) + (own,)
        return s.path

    for s in spans.values():
        path(s)
