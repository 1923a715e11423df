"""Region paths of spans read back from a file, rebuilt from their parent links."""
from __future__ import annotations

import numpy as np

from ..timeline.batch import Tables
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


MAX_DEPTH = 256  # fill_paths follows parent links this deep


def path_names(names: np.ndarray, cats: np.ndarray | None, tables: Tables) -> np.ndarray:
    """The name each row adds to its path: its own, or "step" for every "step N" (one path element)."""
    step = tables.cats.ids.get(STEP)
    if cats is not None and step is not None and (cats == step).any():
        return np.where(cats == step, tables.names.id(STEP), names)
    return names


def child_paths(parent_paths: np.ndarray, names: np.ndarray, tables: Tables) -> np.ndarray:
    """Path ids (``tables.paths``) of rows whose parent has path ``parent_paths`` (-1: none, a root) and
    whose own element is ``names`` (``tables.names`` ids); each distinct pair made once."""
    nnames = int(names.max()) + 1 if len(names) else 1
    uniq, inv = np.unique((parent_paths.astype(np.int64) + 1) * nnames + names, return_inverse=True)
    values = tables.paths.values
    made = np.array([tables.paths.id((values[k // nnames - 1] if k >= nnames else ()) + (tables.names.values[k % nnames],))
                     for k in uniq.tolist()], np.int64)
    return made[inv.ravel()]


def path_ids(ids: np.ndarray, parents: np.ndarray, names: np.ndarray, tables: Tables,
             cats: np.ndarray | None = None) -> np.ndarray | None:
    """Interned region path (``tables.paths``) of each row, as ``fill_paths`` builds them, level by level
    over the columns (``names`` are ``tables.names`` ids). None where parent links loop or run deeper
    than ``MAX_DEPTH`` (there ``fill_paths``' answer depends on the order it meets the spans)."""
    n = len(ids)
    out = np.full(n, -1, np.int64)
    if not n:
        return out.astype(np.int32)
    names = path_names(names, cats, tables)
    order = np.argsort(ids, kind="stable")
    sid = ids[order]
    at = np.minimum(np.searchsorted(sid, parents), n - 1)
    found = sid[at] == parents
    prow = np.where(found, order[at], -1)  # the parent's row, -1 where it is not in the trace
    todo = prow < 0
    prev = np.full(n, -1, np.int64)  # a root's "parent path": none
    for _ in range(MAX_DEPTH + 1):
        rows = np.flatnonzero(todo)
        if not len(rows):
            break
        out[rows] = child_paths(prev[rows], names[rows], tables)
        # the children of the rows just done go next
        nxt = np.zeros(n, bool)
        child = prow >= 0
        ready = child & (out == -1)
        ready[ready] = out[prow[ready]] >= 0
        nxt[ready] = True
        prev[ready] = out[prow[ready]]
        todo = nxt
    if (out < 0).any():
        return None
    return out.astype(np.int32)
