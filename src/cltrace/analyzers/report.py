"""The region report (``PerfCounter.report()``, ``cltrace summary``): the region tree with self
and total time, % of parent and of run, each level sorted by total time (or another key, with a
row limit, as PyTorch's ``key_averages().table(sort_by=, row_limit=)``).

Each region has a device row (from device stamps: the time between its bracketing markers) and
a host row (wall time on its thread). A command launched inside a region sits under it; its second
row is the host's *enqueue* cost, not its run time. Self time is total minus the children's totals
of the same kind: for a region's device row, the device time its commands do not account for.
"""
from __future__ import annotations

from typing import Any

from ..record.recorder import RECORDER, Recorder
from ..timeline.spans import BUILD, COMPILE, REGION_CATS
from ..timeline.stats import Stats
from .text import Column, plural, table

SOURCES = ("device", "host")


def format_ns(ns: float | None) -> str:
    """A single duration: ns, us, ms or s (the tuner's table; report tables use one unit per column)."""
    if ns is None:
        return "-"
    if ns >= 1e9:
        return f"{ns / 1e9:.3f}s"
    if ns >= 1e6:
        return f"{ns / 1e6:.3f}ms"
    if ns >= 1e3:
        return f"{ns / 1e3:.2f}us"
    return f"{ns:.0f}ns"


SORT_KEYS = ("total", "self", "count", "mean", "p50", "p99", "max")


def region_rows(tree: dict[str, Any], sort_by: str = "total", row_limit: int | None = None) -> list[dict[str, Any]]:
    """The tree as rows in display order: each level sorted by ``sort_by`` (one of ``SORT_KEYS``, largest
    first; of device time where the node has it, host time otherwise), with self time and shares of
    parent and run per source. A share of run is of the time of its kind in the nodes that have it and
    no ancestor with it. ``row_limit``: only the ``row_limit`` regions and commands largest by
    ``sort_by``, with the regions around them (so the tree still reads); None or 0: all."""
    if sort_by not in SORT_KEYS:
        raise ValueError(f"sort_by must be one of {', '.join(SORT_KEYS)}, not {sort_by!r}")
    if row_limit is not None and row_limit < 0:
        raise ValueError(f"row_limit must be a whole number >= 0 (0 or None: all rows), not {row_limit!r}")
    children: dict[str, list[str]] = {}
    roots: list[str] = []
    for path, row in tree.items():
        parent = path.rpartition("/")[0] if row["depth"] else ""
        (children.setdefault(parent, []) if parent in tree else roots).append(path)

    def total(path: str, src: str) -> float | None:
        s = tree[path][src]
        return None if s is None else s["total_ns"]

    def self_of(path: str, src: str) -> float:
        sub = [total(k, src) for k in children.get(path, [])]
        return tree[path][src]["total_ns"] - sum(v for v in sub if v is not None)

    def key(path: str) -> tuple[float, str]:
        src = "device" if tree[path]["device"] is not None else "host"
        if tree[path][src] is None:
            return (0.0, path)
        v = self_of(path, src) if sort_by == "self" else tree[path][src].get(
            "count" if sort_by == "count" else f"{sort_by}_ns")
        return (-(v or 0), path)

    def outermost(path: str, src: str) -> bool:
        """Whether the node has time of this kind and no ancestor has."""
        if tree[path][src] is None:
            return False
        for _ in range(tree[path]["depth"]):
            path = path.rpartition("/")[0]
            if path in tree and tree[path][src] is not None:
                return False
        return True

    shown: set[str] | None = None
    if row_limit and len(tree) > row_limit:
        shown = set()
        for path in sorted(tree, key=key)[:row_limit]:
            while path in tree and path not in shown:  # the node and the regions around it
                shown.add(path)
                path = path.rpartition("/")[0] if tree[path]["depth"] else ""

    # the run's time of each kind: its outermost nodes' (a kernel under a region without a queue is
    # top-level device time), so every share is of time that contains the row's and none passes 100
    run = {src: sum(total(p, src) or 0 for p in tree if outermost(p, src)) for src in SOURCES}
    out: list[dict[str, Any]] = []

    def visit(path: str, parent: str | None, shift: int) -> None:
        row = tree[path]
        kids = children.get(path, [])
        # a node whose parent is not in the tree (left out of a window) is a root named by its path
        name, depth = (path, 0) if parent is None and row["depth"] else (row["name"], row["depth"] - shift)
        for src in SOURCES:
            s = row[src]
            if s is None:
                continue
            ptot = total(parent, src) if parent else None
            out.append({"path": path, "name": name, "cat": row["cat"], "depth": depth,
                        "source": src, "label": _label(row["cat"], src), "count": s["count"],
                        "total_ns": s["total_ns"], "self_ns": self_of(path, src) if kids else s["total_ns"],
                        "parent_pct": 100.0 * s["total_ns"] / ptot if ptot else None,
                        "run_pct": 100.0 * s["total_ns"] / run[src] if run[src] else None,
                        "mean_ns": s["mean_ns"], "p50_ns": s["p50_ns"], "p99_ns": s["p99_ns"],
                        "max_ns": s["max_ns"], "errors": row["errors"]})
        for k in sorted(kids, key=key):
            if shown is None or k in shown:
                visit(k, path, shift)

    for r in sorted(roots, key=key):
        if shown is None or r in shown:
            visit(r, None, tree[r]["depth"])
    return out


def _label(cat: str, src: str) -> str:
    if src == "device":
        return "device"
    if cat in REGION_CATS or cat in (COMPILE, BUILD):
        return "host"
    return "enqueue"  # a command's host row: what the host paid to issue it


def _pct(v: float | None) -> str | None:
    return None if v is None else f"{v:.1f}"


def render(tree: dict[str, Any], meta: dict[str, Any] | None = None, title: str = "cltrace report",
           width: int | None = 1 << 30, sort_by: str = "total", row_limit: int | None = None) -> str:
    """The region tree of a ``Stats.as_dict()`` as text; ``width=None`` fits the terminal. ``sort_by`` and
    ``row_limit`` as ``region_rows`` takes them."""
    rows = region_rows(tree, sort_by, row_limit)
    cols = (Column("region / kernel", keep=9), Column("src", keep=9, left=True), Column("count", keep=8),
            Column("total", time=True, keep=9, unit="sum"), Column("self", time=True, keep=7, unit="sum"),
            Column("% parent", keep=6), Column("% run", keep=7), Column("mean", time=True, keep=5, unit="call"),
            Column("p50", time=True, keep=3, unit="call"), Column("p99", time=True, keep=4, unit="call"),
            Column("max", time=True, keep=2, unit="call"), Column("", keep=1, left=True))
    data = []
    last = None
    for r in rows:
        name = "" if r["path"] == last else "  " * r["depth"] + r["name"]
        last = r["path"]
        data.append((name, r["label"], r["count"], r["total_ns"], r["self_ns"], _pct(r["parent_pct"]),
                     _pct(r["run_pct"]), r["mean_ns"], r["p50_ns"], r["p99_ns"], r["max_ns"],
                     f"errors={r['errors']}" if r["errors"] and name else ""))
    lines = [title]
    body = table(cols, data, width=width)
    lines.append(body[0])
    lines.append("-" * len(body[0]))
    lines.extend(body[1:])
    left = len(tree) - len({r["path"] for r in rows})
    if left:
        lines.append(f"({plural(left, 'more region or command', 'more regions or commands')}: the {row_limit} "
                     f"largest by {sort_by} are shown, with the regions around them)")
    lines.append(f"each level by {sort_by}; self: total minus its children's; % run: of the run's time of that "
                 "kind (its outermost rows); enqueue: host time to issue a command")
    if meta:
        lines.append("")
        lines.extend(footer(meta))
    return "\n".join(lines)


def device_name(key: str, meta: dict[str, Any]) -> str:
    """A device's name from its key in the metadata: its label (unique per physical device), else its name."""
    info = (meta.get("devices") or {}).get(key)
    if isinstance(info, dict) and (info.get("label") or info.get("name")):
        return str(info.get("label") or info["name"])
    parts = key.split("|")
    return parts[1] if len(parts) == 3 else key


def footer(meta: dict[str, Any]) -> list[str]:
    """Recording facts: spans kept and dropped, and each device's clock mapping."""
    dropped = meta.get("dropped_spans", 0)
    line = f"spans: {meta.get('recorded_spans', '?')} recorded, {dropped} dropped"
    if meta.get("memory_dropped_spans"):
        line += f", {meta['memory_dropped_spans']} not kept in memory"
    lines = [line]
    for key, c in (meta.get("clocks") or {}).items():
        if not isinstance(c, dict):
            continue
        rate = c.get("drift_ns_per_s")
        drift = f"drift {rate} ns/s" if rate is not None else f"drift {c.get('drift_ns')} ns over the run"
        points = c.get("points")
        cal = f", {plural(int(points), 'calibration')}" if isinstance(points, int) else ""
        lines.append(f"clock {device_name(key, meta)}: {c.get('method')} ({c.get('domain')}), "
                     f"bound ±{c.get('bound_ns')} ns, {drift}{cal}")
    return lines


class PerfCounter:
    """Aggregated region/kernel times of a recorder (the global one by default).

    ``report()`` returns the tree as text; ``as_dict()`` as data: for each path
    ``"forward/matmul"``, count/total/mean/min/max/p50/p99 of device and host time (ns).
    """

    def __init__(self, recorder: Recorder | None = None, stats: Stats | None = None,
                 meta: dict[str, Any] | None = None) -> None:
        self._recorder = recorder if recorder is not None or stats is not None else RECORDER
        self._stats = stats
        self._meta = meta

    def _current(self) -> tuple[Stats, dict[str, Any] | None]:
        if self._stats is not None:
            return self._stats, self._meta
        rec = self._recorder
        rec.flush(block=True)
        return rec.stats, rec.metadata()

    def as_dict(self) -> dict[str, Any]:
        return self._current()[0].as_dict()

    def report(self, sort_by: str = "total", row_limit: int | None = None) -> str:
        """The region tree as text, each level ordered by ``sort_by`` (``SORT_KEYS``: total, self, count,
        mean, p50, p99, max; largest first). ``row_limit``: only the ``row_limit`` regions and commands
        largest by it, with the regions around them (as PyTorch's ``table(sort_by=, row_limit=)``)."""
        stats, meta = self._current()
        return render(stats.as_dict(), meta, sort_by=sort_by, row_limit=row_limit)

    def reset(self) -> None:
        if self._stats is None:
            self._recorder.clear()
        else:
            self._stats = Stats()
