"""The analysis as text, one screen: utilisation, processes (merged traces), findings, top kernels,
launches, transfer bandwidth, top regions, memory."""
from __future__ import annotations

import os
from typing import Any

from .text import Column, fmt_bytes, fmt_ns, plural, table, terminal_width

Analysis = Any  # an analysis.Analysis (not imported: the facade imports this module)

KERNEL_SORT = {"total": "total_ns", "mean": "mean_ns", "count": "count", "p99": "p99_ns"}


def _pct(part: float, whole: float) -> str:
    return f"{100.0 * part / whole:.1f}" if whole else "-"


def _use_rows(uses: list[dict[str, Any]]) -> list[tuple]:
    return [(u["name"], u["commands"], u["busy_ns"], f"{u['busy_pct']:.1f}", u["idle_ns"],
             u["idle"]["host_bound_ns"], u["idle"]["host_blocked_ns"], u["idle"]["other_ns"],
             u.get("transfer_kernel_overlap_ns")) for u in uses]


def utilisation_lines(a: Analysis, width: int) -> list[str]:
    wall = a.wall["wall_ns"]
    cols = [Column("device / queue", keep=9), Column("commands", keep=3),
            Column("busy", time=True, keep=8, unit="wall"), Column("busy %", keep=9),
            Column("idle", time=True, keep=7, unit="wall"), Column("host-bound", time=True, keep=6, unit="wall"),
            Column("host-blocked", time=True, keep=6, unit="wall"), Column("other", time=True, keep=5, unit="wall")]
    rows = _use_rows(a.devices)
    if len(a.queues) > len(a.devices):
        rows += [("  " + r[0],) + r[1:] for r in _use_rows(a.queues)]
    if any(r[-1] is not None for r in rows):
        cols.append(Column("xfer||kernel", time=True, keep=4, unit="wall"))
    else:
        rows = [r[:-1] for r in rows]
    over = "the run's wall time" if _window(a).get("kind", "whole") == "whole" else "the window's wall time"
    return [f"Device utilisation over {over} ({fmt_ns(wall)}); idle = host-bound (queue empty)",
            "  + host-blocked (host inside finish, wait or a blocking copy) + other (queued, not started):",
            *table(cols, rows, width=width, indent="  ")]


def _window(a: Analysis) -> dict[str, Any]:
    return getattr(a, "window", None) or {}


def window_line(a: Analysis) -> str:
    """What the report covers, in words: the whole run, or the window and what it leaves out."""
    w = _window(a)
    label = w.get("label") or "the whole run"
    return f"{plural(a.spans, 'span')} over {fmt_ns(a.wall['wall_ns'])}, {label}" + (
        f": {w['note']}" if w.get("note") else "")


def headline(a: Analysis) -> list[str]:
    """Where the time went, in a sentence per device: busy share, the top kernel, the idle's main cause."""
    out = []
    causes = {"host_bound_ns": "host-bound: the queue was empty, the host not enqueueing",
              "host_blocked_ns": "host-blocked: the host sat in blocking calls",
              "other_ns": "queued work not yet started"}
    for d in a.devices:
        line = f"{d['name']}: busy {d['busy_pct']:.0f}% of the wall time"
        ks = [k for k in a.kernels if k.get("device", d["name"]) == d["name"]]
        if ks:
            top = max(ks, key=lambda k: k["total_ns"])
            line += f"; {top['name']} takes {top['device_pct']:.0f}% of the device time"
        out.append(line)
        if d["idle_ns"]:
            cause, ns = max(d["idle"].items(), key=lambda kv: kv[1])
            out.append(f"  idle {fmt_ns(d['idle_ns'])}, mostly {causes[cause]} ({fmt_ns(ns)})")
    return out


def finding_lines(a: Analysis, width: int) -> list[str]:
    if not a.findings:
        return ["Findings: none of the rules fired (see `cltrace analyze --json` for their thresholds)."]
    out = [f"Findings, most time at stake first ({len(a.findings)}):"]
    for n, f in enumerate(a.findings, 1):
        out.append(f" {n}. {f['title']} [{f['rule']}], {fmt_ns(f['cost_ns'])} at stake")
        out.append(f"    {f['summary']}")
        worst = f["instances"][:3]
        if worst:
            out.append("    worst: " + "; ".join(
                f"{i['name']} at {i['at_s']:.6f} s ({fmt_ns(i['dur_ns'])})" for i in worst))
        out.append(f"    -> {f['suggestion']}")
    return out


def _short_site(site: str | None) -> str:
    """A call site with its path relative to the working directory where that is shorter."""
    if not site or site == "-":
        return "-"
    try:
        rel = os.path.relpath(site)
    except ValueError:  # another drive (Windows)
        return site
    return rel if len(rel) < len(site) else site


def kernel_lines(a: Analysis, width: int, sort: str = "total", top: int | None = 10) -> list[str]:
    """The kernel table; one per device where the trace has more than one (``% device`` is of that device)."""
    if not a.kernels:
        return ["Kernels: none with device times."]
    devices = sorted({r.get("device", "") for r in a.kernels})
    if len(devices) == 1:
        return _kernel_table(a.kernels, width, sort, top, "")
    out: list[str] = []
    for d in devices:
        out += _kernel_table([r for r in a.kernels if r.get("device", "") == d], width, sort, top, f" on {d}")
    return out


def _kernel_table(kernels: list[dict], width: int, sort: str, top: int | None, where: str) -> list[str]:
    key = KERNEL_SORT[sort]
    rows = sorted(kernels, key=lambda r: (-r[key], r["name"]))
    shown = rows[:top] if top else rows
    by_shape = any(r.get("shape") for r in rows)
    by_site = any(r.get("site") for r in rows)
    cols = [Column("kernel", keep=9)] + ([Column("launch shape", keep=8, left=True)] if by_shape else []) + (
        [Column("call site", keep=12, left=True)] if by_site else []) + [
        Column("count", keep=8), Column("total", time=True, keep=9, unit="sum"),
        Column("self", time=True, keep=4, unit="sum"), Column("% device", keep=8),
        Column("first", time=True, keep=6, unit="call"), Column("mean", time=True, keep=7, unit="call"),
        Column("p50", time=True, keep=5, unit="call"), Column("p99", time=True, keep=5, unit="call")]
    data = [(r["name"],) + ((r["shape"],) if by_shape else ()) + ((_short_site(r["site"]),) if by_site else ()) +
            (r["count"], r["total_ns"], r["self_ns"], f"{r['device_pct']:.1f}", r["first_ns"], r["mean_ns"],
             r["p50_ns"], r["p99_ns"]) for r in shown]
    more = f", {len(rows) - len(shown)} more" if len(rows) > len(shown) else ""
    return [f"Kernels{where} by {sort} (device time; first launch apart, mean/p50/p99 after it{more}):",
            *table(cols, data, width=width, indent="  ")]


def launch_lines(a: Analysis, width: int) -> list[str]:
    la = a.launches
    if not la["count"]:
        return []
    out = [f"Launches: {la['count']} kernels, {la['launch_bound']} ({la['launch_bound_pct']:.0f}%) launch-bound "
           f"(device time < host enqueue); enqueue {fmt_ns(la['enqueue_ns'])} vs device {fmt_ns(la['device_ns'])} "
           f"in all"]
    for name, d in la["queue_depth"].items():
        out.append(f"  queue depth {name}: max {d['max']}, mean {d['mean']:.2f} commands in flight")
    return out


def region_lines(a: Analysis, width: int, depth: int = 1) -> list[str]:
    rows = [r for r in a.regions if r["depth"] <= depth]
    if not rows:
        return []
    cols = [Column("region", keep=9), Column("src", keep=9, left=True), Column("count", keep=7),
            Column("total", time=True, keep=9, unit="sum"), Column("self", time=True, keep=8, unit="sum"),
            Column("% parent", keep=5), Column("% run", keep=6), Column("p50", time=True, keep=4, unit="call"),
            Column("p99", time=True, keep=3, unit="call")]
    data, last = [], None
    for r in rows:
        name = "" if r["path"] == last else "  " * r["depth"] + r["name"]
        last = r["path"]
        data.append((name, r["label"], r["count"], r["total_ns"], r["self_ns"],
                     None if r["parent_pct"] is None else f"{r['parent_pct']:.1f}",
                     None if r["run_pct"] is None else f"{r['run_pct']:.1f}", r["p50_ns"], r["p99_ns"]))
    return [f"Regions, top {depth + 1} levels (full tree: cltrace summary):", *table(cols, data, width=width,
                                                                                   indent="  ")]


def memory_lines(a: Analysis, width: int, top: int = 5) -> list[str]:
    """Peak live device bytes per context, when, and the allocation sites of what is still alive."""
    mem = getattr(a, "memory", None) or {}
    if not mem.get("contexts"):
        return []
    out = ["Device memory (live bytes of the buffers, images and SVM the trace saw allocated):"]
    for c in mem["contexts"]:
        devices = f" ({', '.join(c['devices'])})" if c.get("devices") else ""
        line = f"  {c['context']}{devices}: peak {fmt_bytes(c['peak_bytes'])}"
        if c.get("peak_at_ns") is not None:
            line += f" at +{c['peak_at_ns'] / 1e9:.6f} s"
        if c.get("during"):
            line += f" in {c['during']}"
        line += f"; {fmt_bytes(c['end_bytes'])} live at the end"
        if c.get("allocations") is not None:
            line += f" ({plural(c['allocations'], 'allocation')}, {plural(c['releases'] or 0, 'release')})"
        out.append(line)
    alive = mem.get("alive") or []
    if alive:
        total = sum(x["bytes"] for x in alive)
        out.append(f"  still allocated at the end, by allocating line ({fmt_bytes(total)}"
                   f"{', top ' + str(top) if len(alive) > top else ''}):")
        cols = [Column("bytes", keep=9), Column("count", keep=5), Column("kind", keep=6, left=True),
                Column("context", keep=4, left=True), Column("allocated at", keep=8, left=True)]
        rows = [(fmt_bytes(x["bytes"]), x["count"], x["kind"], x["context"], x["site"] or "?") for x in alive[:top]]
        out += table(cols, rows, width=width, indent="    ")
        out.append("    -> release what is no longer needed (.release() or drop the last reference), "
                   "or keep it on purpose")
    if mem.get("samples_dropped"):
        out.append(f"  ({plural(mem['samples_dropped'], 'sample')} past the ledger's cap not kept: "
                   "peaks are the ledger's, without a time)")
    return out


def transfer_lines(a: Analysis, width: int) -> list[str]:
    """Bytes, device time and GB/s per direction (and device, where there are several)."""
    rows = getattr(a, "transfers", None) or []
    if not rows:
        return []
    several = len({r["device"] for r in rows}) > 1
    cols = [Column("direction", keep=9)] + ([Column("device", keep=8, left=True)] if several else []) + [
        Column("count", keep=7), Column("bytes", keep=8), Column("device time", time=True, keep=8),
        Column("GB/s", keep=9), Column("mean size", keep=4)]
    data = [(r["direction"],) + ((r["device"],) if several else ()) + (
        r["count"], fmt_bytes(r["bytes"]), r["device_ns"], "-" if r["gb_per_s"] is None else f"{r['gb_per_s']:.2f}",
        fmt_bytes(r["bytes"] // max(r["count"] - r["unsized"], 1)) if r["count"] > r["unsized"] else "-")
        for r in rows]
    unsized = sum(r["unsized"] for r in rows)
    note = f"; {plural(unsized, 'transfer')} of unknown size left out of GB/s" if unsized else ""
    return [f"Transfers: bandwidth over the copies' device time (GB/s = 10^9 B/s){note}:",
            *table(cols, data, width=width, indent="  ")]


def process_lines(a: Analysis, width: int) -> list[str]:
    """The per-process table of a merged trace."""
    rows = getattr(a, "processes", None) or []
    if not rows:
        return []
    cols = [Column("process", keep=9), Column("pid", keep=9), Column("spans", keep=3), Column("kernels", keep=4),
            Column("kernel", time=True, keep=7, unit="t"), Column("transfer", time=True, keep=6, unit="t"),
            Column("busy", time=True, keep=8, unit="t"), Column("busy %", keep=8),
            Column("blocked", time=True, keep=7, unit="t"), Column("wall", time=True, keep=5, unit="t")]
    data = [(r["name"], r["pid"], r["spans"], r["kernels"], r["kernel_ns"], r["transfer_ns"], r["busy_ns"],
             f"{r['busy_pct']:.1f}", r["blocked_ns"], r["wall_ns"]) for r in rows]
    return [f"Processes ({len(rows)}, merged): device time of each one's commands, busy (its commands' union) over "
            "its own wall time, blocked: its host in blocking calls:", *table(cols, data, width=width, indent="  ")]


def render_analysis(a: Analysis, width: int | None = None, sort: str = "total", top: int | None = 10) -> str:
    width = width or terminal_width()
    parts = [[f"cltrace analyze: {a.source}", window_line(a) + ("" if a.devices else "; no device work"),
              *headline(a)],
             utilisation_lines(a, width) if a.devices else [],
             process_lines(a, width), finding_lines(a, width), kernel_lines(a, width, sort, top),
             launch_lines(a, width), transfer_lines(a, width), region_lines(a, width), memory_lines(a, width)]
    clocks = [f"clock {c['device']}: {c.get('method')}, bound ±{c.get('bound_ns')} ns, "
              f"drift {c.get('drift_ns_per_s')} ns/s, {plural(int(c.get('points') or 0), 'calibration')}"
              for c in a.clocks]
    if clocks:
        parts.append(clocks)
    return "\n\n".join("\n".join(p) for p in parts if p)
