"""The region report (``PerfCounter.report()``, ``cltrace summary``) and the text tables under it:
a tree sorted by total time per level, self and total, shares of parent and run, one unit per
time column, names never cut, a command's host row labelled as its enqueue cost, devices by name."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from typing import Any

import numpy as np
import pytest

import cltrace
from cltrace.analyzers.report import footer, region_rows, render
from cltrace.analyzers.summary import summarize
from cltrace.analyzers.text import Column, fmt_ns, table, unit_for

LONG = "a_region_name_long_enough_that_an_old_fixed_width_column_would_have_cut_it_off"


def _record(queue: Any, kernels: Any) -> None:
    cltrace.start()
    for _ in range(3):
        with cltrace.region("outer", queue):
            with cltrace.region("small", queue):  # runs first, takes less
                kernels.launch_add(queue)
            with cltrace.region(LONG, queue):
                kernels.launch_spin(queue, 3000)
    queue.finish()
    cltrace.stop()


def test_tree_sorted_by_total_with_self_and_shares(queue: Any, kernels: Any) -> None:
    _record(queue, kernels)
    rows = region_rows(cltrace.PerfCounter().as_dict())
    dev = [r for r in rows if r["source"] == "device"]
    assert [r["name"] for r in dev] == ["outer", LONG, "spin", "small", "add"]  # big before small
    outer = dev[0]
    kids = [r for r in dev if r["depth"] == 1]
    assert outer["self_ns"] == outer["total_ns"] - sum(k["total_ns"] for k in kids)
    assert outer["run_pct"] == 100.0 and outer["parent_pct"] is None
    for k in kids:
        assert k["parent_pct"] == np.float64(100.0 * k["total_ns"] / outer["total_ns"])
    spin = next(r for r in rows if r["name"] == "spin" and r["source"] == "host")
    assert spin["label"] == "enqueue"
    assert next(r for r in rows if r["name"] == "outer" and r["source"] == "host")["label"] == "host"


def test_a_kernel_under_a_region_without_a_queue_shares_the_runs_device_time(queue: Any, kernels: Any,
                                                                             tmp_path: Any) -> None:
    """The README's decorator (a region with no queue) around launches, then a region with one: the
    kernels under the host-only region are top-level device time, so every % run is at most 100 and
    the outermost device rows add up to 100 (the kernel's row read 1500 % when only regions with a
    queue counted as the run's device time)."""
    @cltrace.region("train_step")
    def train_step() -> None:
        kernels.launch_spin(queue, 2000)

    path = tmp_path / "deco.json"
    with cltrace.trace(str(path)):
        for _ in range(4):
            train_step()
        with cltrace.region("eval", queue):
            kernels.launch_add(queue)
        queue.finish()
    for tree in (cltrace.PerfCounter().as_dict(), summarize(path)[0].as_dict()):
        rows = region_rows(tree)
        dev = {r["path"]: r for r in rows if r["source"] == "device"}
        assert set(dev) == {"train_step/spin", "eval", "eval/add"}
        assert all(r["run_pct"] is not None and 0 <= r["run_pct"] <= 100.0 for r in rows), rows
        assert dev["train_step/spin"]["run_pct"] + dev["eval"]["run_pct"] == np.float64(100.0)
        assert dev["train_step/spin"]["run_pct"] > dev["eval"]["run_pct"]
    out = subprocess.run([sys.executable, "-m", "cltrace", "summary", str(path)], capture_output=True, text=True,
                         timeout=120, env={**os.environ, "COLUMNS": "200"}).stdout
    head = out.splitlines()[1].split("  ")
    at = [h.strip() for h in head if h.strip()].index("% run")
    spin = next(ln for ln in out.splitlines() if ln.strip().startswith("spin"))
    assert 50.0 < float(spin.split()[at]) <= 100.0, out


def test_report_text_one_unit_per_column_and_names_whole(queue: Any, kernels: Any) -> None:
    _record(queue, kernels)
    text = cltrace.PerfCounter().report()
    lines = text.splitlines()
    head = lines[1]
    units = re.findall(r"(total|self|mean|p50|p99|max) (ns|us|ms|s)\b", head)
    assert [u[0] for u in units] == ["total", "self", "mean", "p50", "p99", "max"]
    body = [ln for ln in lines[3:] if ln.split()[:1] and ln.split()[0] in ("device", "enqueue", "host")
            or any(ln.strip().startswith(n) for n in ("outer", "small", "spin", "add", LONG))]
    assert any(LONG in ln for ln in body)
    for ln in body:  # values carry no unit: the header has it
        assert not re.search(r"\d(ns|us|ms|s)\b", ln), ln
    assert "enqueue" in text
    dev_name = cltrace.default_device().name.strip()
    clock = next(ln for ln in lines if ln.startswith("clock "))
    assert clock.startswith(f"clock {dev_name}:") and "|" not in clock
    assert re.search(r"drift -?[\d.]+ ns/s", clock)
    assert re.search(r"\b1 calibration$|\b\d+ calibrations$", clock) and "1 calibrations" not in clock


def test_footer_names_devices_and_counts_calibrations_in_english() -> None:
    meta = {"recorded_spans": 3, "dropped_spans": 0,
            "devices": {"P|Dev X|1.0": {"name": "Dev X"}},
            "clocks": {"P|Dev X|1.0": {"method": "m", "domain": "monotonic", "bound_ns": 5, "drift_ns": 2,
                                       "drift_ns_per_s": 1.5, "points": 1},
                       "Q|Dev Y|2": {"method": "m", "domain": "monotonic", "bound_ns": 5, "drift_ns": 2,
                                     "drift_ns_per_s": 0.0, "points": 4}}}
    lines = footer(meta)
    assert lines[1] == "clock Dev X: m (monotonic), bound ±5 ns, drift 1.5 ns/s, 1 calibration"
    assert lines[2] == "clock Dev Y: m (monotonic), bound ±5 ns, drift 0.0 ns/s, 4 calibrations"


def test_table_drops_columns_not_names_when_narrow() -> None:
    cols = [Column("name"), Column("count", keep=9), Column("total", time=True, keep=8),
            Column("p99", time=True, keep=1)]
    rows = [(LONG, 3, 1_500_000, 2_000_000), ("short", 1, 250, 300)]
    wide = table(cols, rows, width=500)
    assert wide[0].split() == ["name", "count", "total", "us", "p99", "us"]
    assert wide[1].split()[2:] == ["1500.0", "2000.0"] and wide[2].split()[2:] == ["0.2", "0.3"]
    narrow = table(cols, rows, width=len(LONG) + 12)
    assert LONG in narrow[1] and "p99" not in narrow[0] and "count" in narrow[0]
    tiny = table(cols, rows, width=10)
    assert tiny[1].strip() == LONG  # the name stays whole even when nothing else fits


def test_units_and_single_durations() -> None:
    assert unit_for([5.0, 900.0]) == ("ns", 1.0)
    assert unit_for([120_000.0]) == ("us", 1e3)
    assert unit_for([2e11]) == ("s", 1e9)
    assert fmt_ns(2_300_000) == "2.30 ms" and fmt_ns(17) == "17 ns" and fmt_ns(None) == "-"


def test_columns_compared_side_by_side_share_one_unit() -> None:
    """``total A`` beside ``total B`` (and a summary's total beside self, p50 beside p99) read in one unit,
    from the largest value among them; a column of no group keeps its own."""
    cols = [Column("name"), Column("A", time=True, unit="t"), Column("B", time=True, unit="t"),
            Column("alone", time=True)]
    rows = [("k", 24_840_800, 250_000_000, 900), ("j", 53_199, 53_700, 800)]
    head, *body = table(cols, rows, width=500)
    assert head.split() == ["name", "A", "ms", "B", "ms", "alone", "ns"]
    assert body[0].split() == ["k", "24.8", "250.0", "900"] and body[1].split() == ["j", "0.1", "0.1", "800"]


def test_diff_and_summary_tables_name_one_unit_per_compared_pair() -> None:
    """The issue's example: A's total 24.8 ms was shown in us beside B's 1.45 s in ms."""
    from cltrace.analyzers.diff import DiffRow, render_diff

    row = DiffRow("kernel", "slow_pad", "device", "call", 10, 10, 24_840_800, 1_452_700_000, 53_199.0, 145_000_000.0,
                  60_000.0, 150_000_000.0, 24_840_800, 1_452_700_000, 1_427_859_200, 1_427_859_200, 272461.7,
                  5747.0, "regression", "because", True)
    head = render_diff([row], "a", "b", 10.0, width=1000).splitlines()[3]
    for name in ("total", "p50", "p99"):
        pair = re.search(rf"{name} A (\w+) +{name} B (\w+)", head)
        assert pair and pair[1] == pair[2], (name, head)
    assert re.search(r"total A ms +total B ms +self change ms", head), head
    tree = {"r": {"name": "r", "cat": "region", "depth": 0, "errors": 0, "host": None,
                  "device": {"count": 2, "total_ns": 300_000_000, "mean_ns": 150_000_000, "p50_ns": 150_000_000,
                             "p99_ns": 150_000_000, "max_ns": 150_000_000}},
            "r/k": {"name": "k", "cat": "kernel", "depth": 1, "errors": 0, "host": None,
                    "device": {"count": 200, "total_ns": 60_000, "mean_ns": 300, "p50_ns": 300, "p99_ns": 900,
                               "max_ns": 900}}}
    head = render(tree).splitlines()[1].split()
    assert head[head.index("total") + 1] == head[head.index("self") + 1] == "ms", head
    assert {head[head.index(c) + 1] for c in ("mean", "p50", "p99", "max")} == {"ms"}, head


def _node(name: str, depth: int, count: int, total: int, cat: str = "region") -> dict[str, Any]:
    mean = total // count
    return {"name": name, "cat": cat, "depth": depth, "errors": 0, "device": None,
            "host": {"count": count, "total_ns": total, "mean_ns": mean, "p50_ns": mean, "p99_ns": mean,
                     "max_ns": mean}}


SORT_TREE = {"a": _node("a", 0, 1, 100_000), "a/x": _node("x", 1, 50, 90_000), "a/y": _node("y", 1, 1, 5_000),
             "b": _node("b", 0, 10, 50_000), "b/z": _node("z", 1, 1000, 1_000)}


@pytest.mark.parametrize("sort_by, order", [
    ("total", ["a", "a/x", "a/y", "b", "b/z"]),
    ("count", ["b", "b/z", "a", "a/x", "a/y"]),
    ("self", ["b", "b/z", "a", "a/x", "a/y"]),  # a's self 5 us, b's 49 us
    ("mean", ["a", "a/y", "a/x", "b", "b/z"]),
])
def test_report_sorts_each_level_by_the_key_asked(sort_by: str, order: list[str]) -> None:
    assert [r["path"] for r in region_rows(SORT_TREE, sort_by)] == order
    text = render(SORT_TREE, sort_by=sort_by)
    names = [ln.split()[0] for ln in text.splitlines()[3:8]]
    assert names == [p.rpartition("/")[2] for p in order] and f"each level by {sort_by}" in text


def test_report_row_limit_keeps_the_largest_and_the_regions_around_them() -> None:
    rows = region_rows(SORT_TREE, "count", row_limit=2)  # z (1000 calls) and x (50), under b and a
    assert [r["path"] for r in rows] == ["b", "b/z", "a", "a/x"]
    text = render(SORT_TREE, sort_by="count", row_limit=2)
    assert "(1 more region or command: the 2 largest by count are shown, with the regions around them)" in text
    assert region_rows(SORT_TREE, row_limit=5) == region_rows(SORT_TREE) == region_rows(SORT_TREE, row_limit=0)
    with pytest.raises(ValueError, match="sort_by must be one of total, self"):
        region_rows(SORT_TREE, "cuda_time_total")
    with pytest.raises(ValueError, match="row_limit"):
        region_rows(SORT_TREE, row_limit=-1)


def test_perf_counter_and_summary_take_a_sort_key_and_a_row_limit(tmp_path: Any) -> None:
    path = tmp_path / "host.json"
    with cltrace.trace(path, quiet=True):
        for i in range(3):
            with cltrace.region("step"):
                with cltrace.region("many"):
                    pass
                for _ in range(5):
                    with cltrace.region("often"):
                        pass
    text = cltrace.PerfCounter().report(sort_by="count", row_limit=1)
    lines = text.splitlines()
    assert [ln.split()[0] for ln in lines[3:5]] == ["step", "often"] and "many" not in text
    out = subprocess.run([sys.executable, "-m", "cltrace", "summary", str(path), "--sort", "count", "--top", "1"],
                         capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "200"})
    assert out.returncode == 0, out.stderr
    assert [ln.split()[0] for ln in out.stdout.splitlines()[3:5]] == ["step", "often"]
    assert "many" not in out.stdout and "1 more region or command" in out.stdout


def test_devices_command_writes_drift_per_second_and_counts_calibrations(tmp_path: Any) -> None:
    out = subprocess.run([sys.executable, "-m", "cltrace", "devices", "--samples", "8"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120).stdout
    clock = next(ln for ln in out.splitlines() if "clock:" in ln)
    assert re.search(r"over (1 calibration|\d+ calibrations) \(drift -?[\d.]+ ns/s\)", clock), clock
