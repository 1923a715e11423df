"""PerfCounter: the region tree aggregated, as text or as a dict."""
from __future__ import annotations

from typing import Any

from ..record.recorder import RECORDER, Recorder
from ..timeline.stats import Stats


def format_ns(ns: float | None) -> str:
    """A duration for a table: ns, us, ms or s."""
    if ns is None:
        return "-"
    if ns >= 1e9:
        return f"{ns / 1e9:.3f}s"
    if ns >= 1e6:
        return f"{ns / 1e6:.3f}ms"
    if ns >= 1e3:
        return f"{ns / 1e3:.2f}us"
    return f"{ns:.0f}ns"


def render(tree: dict[str, Any], meta: dict[str, Any] | None = None, title: str = "cltrace report") -> str:
    """Text table of a ``Stats.as_dict()`` tree. Device columns come from device stamps only."""
    cols = ("count", "total", "mean", "min", "max", "p50", "p99")
    head = f"{'region / kernel':<44} {'src':<6}" + "".join(f"{c:>11}" for c in cols)
    lines = [title, head, "-" * len(head)]
    for row in tree.values():
        label = ("  " * row["depth"] + row["name"])[:44]
        for src in ("device", "host"):
            s = row[src]
            if s is None:
                continue
            vals = (str(s["count"]), format_ns(s["total_ns"]), format_ns(s["mean_ns"]), format_ns(s["min_ns"]),
                    format_ns(s["max_ns"]), format_ns(s["p50_ns"]), format_ns(s["p99_ns"]))
            err = f"  errors={row['errors']}" if row["errors"] else ""
            lines.append(f"{label:<44} {src:<6}" + "".join(f"{v:>11}" for v in vals) + err)
            label = ""
    if meta:
        dropped = meta.get("dropped_spans", 0)
        lines.append("")
        line = f"spans: {meta.get('recorded_spans', '?')} recorded, {dropped} dropped"
        if meta.get("memory_dropped_spans"):
            line += f", {meta['memory_dropped_spans']} not kept in memory"
        lines.append(line)
        devices = meta.get("devices") or {}
        for dev, c in (meta.get("clocks") or {}).items():
            dev = (devices.get(dev) or {}).get("label") or dev  # one line per physical device
            lines.append(f"clock {dev}: {c.get('method')} ({c.get('domain')}), "
                         f"bound ±{c.get('bound_ns')} ns, drift {c.get('drift_ns')} ns")
    return "\n".join(lines)


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

    def report(self) -> str:
        stats, meta = self._current()
        return render(stats.as_dict(), meta)

    def reset(self) -> None:
        if self._stats is None:
            self._recorder.clear()
        else:
            self._stats = Stats()
