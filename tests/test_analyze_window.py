"""Windows of ``analyze``, ``summary`` and ``diff``: the steady state by default for ``analyze``
(start-up and builds left out, said in the headline), steps, a time range, a region's occurrences.

Real PoCL traces made here: a loop of scheduled steps after a long start-up, with a build in set-up
and one mid-loop; the interval arithmetic the window rests on against a brute-force grid."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyopencl as cl
import pytest

import cltrace
from cltrace.analyzers.diff import diff
from cltrace.analyzers.intervals import intersect, subtract, union
from cltrace.analyzers.model import TraceData
from cltrace.analyzers.summary import summarize
from cltrace.read import load_columns

from conftest import KERNEL_SOURCE

N = 4096
STARTUP_S = 0.3
STEPS = 6
PAUSE_S = 0.3


def _loop(path: Path, q: Any, steps: bool) -> None:
    """Start-up (an upload, a sleep, a build), then STEPS iterations of ``fwd`` (spin) and add, each finished;
    a second build and a pause after iteration 3's work."""
    ctx = q.context
    buf = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, 4 * N)
    other = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, 4 * N)
    cltrace.instrument()
    sched = cltrace.schedule(wait=0, warmup=0, active=100) if steps else None
    cltrace.start(str(path), schedule=sched, quiet=True)
    try:
        cl.enqueue_copy(q, buf, np.ones(N, np.float32))  # the data up first
        time.sleep(STARTUP_S)  # then imports, data loading: no device work
        prg = cl.Program(ctx, KERNEL_SOURCE).build()
        spin, add = cl.Kernel(prg, "spin"), cl.Kernel(prg, "add")
        it = cltrace.steps(range(STEPS), q) if steps else range(STEPS)
        for i in it:
            with cltrace.region("iteration" if not steps else "body", q):
                with cltrace.region("fwd", q):
                    spin(q, (N,), None, buf, np.int32(250))
                add(q, (N,), None, buf, other)
                q.finish()
                if i == 3:
                    cl.Program(ctx, KERNEL_SOURCE + "\n// mid-loop\n").build()
                    time.sleep(PAUSE_S)  # host work: the device idle, outside fwd
    finally:
        cltrace.stop()
        cltrace.uninstrument()


@pytest.fixture(scope="module")
def traces(tmp_path_factory: Any, queue: Any) -> dict[str, str]:
    d = tmp_path_factory.mktemp("window")
    out = {"steps": d / "steps.pftrace", "steps_json": d / "steps.json", "plain": d / "plain.pftrace"}
    _loop(out["steps"], queue, steps=True)
    _loop(out["steps_json"], queue, steps=True)
    _loop(out["plain"], queue, steps=False)
    cltrace.RECORDER.clear()
    return {k: str(v) for k, v in out.items()}


def _td(path: str) -> TraceData:
    spans, meta = load_columns(path)
    return TraceData(spans, meta)


def _steps(td: TraceData) -> list[int]:
    rows = np.flatnonzero(td.cat_mask("step"))
    return sorted(rows.tolist(), key=lambda i: td.host_begin[i])


def _kernels_in(td: TraceData, begin: int, end: int, name: str | None = None) -> np.ndarray:
    k = td.cat_mask("kernel") & td.on_device & (td.host_begin >= begin) & (td.host_begin < end)
    if name is not None:
        k &= td.name == td.names.index(name)
    return np.flatnonzero(k)


def _adds_up(a: Any) -> None:
    for u in a.devices + a.queues:
        assert u["busy_ns"] + sum(u["idle"].values()) == u["wall_ns"] == a.wall["wall_ns"]


@pytest.mark.parametrize("which", ["steps", "steps_json"])
def test_the_default_is_the_steady_state_and_the_headline_says_so(traces: dict[str, str], which: str) -> None:
    path = traces[which]
    td = _td(path)
    steps = _steps(td)
    first, last = td.attr(steps[0], "step"), td.attr(steps[-1], "step")
    whole = cltrace.analyze(path, window=None)
    a = cltrace.analyze(path)
    assert whole.window["kind"] == "whole" and a.window["kind"] == "steady"
    assert a.window["label"] == f"steps {first + 1}-{last}"
    # the start-up (its sleep) is not idle device time of the steady state
    assert a.wall["wall_ns"] < whole.wall["wall_ns"] - STARTUP_S * 1e9
    assert a.window["start_ns"] >= STARTUP_S * 1e9 and a.window["builds_ns"] > 0
    # busy: exactly the device time of the commands launched in steps 2.. (one in-order queue)
    k = _kernels_in(td, int(td.host_begin[steps[1]]), int(td.host_end[steps[-1]]))
    assert a.devices[0]["busy_ns"] == int((td.dev_end[k] - td.dev_start[k]).sum())
    assert a.devices[0]["busy_pct"] > whole.devices[0]["busy_pct"]
    _adds_up(a)
    _adds_up(whole)
    # the mid-loop build's host time is not in the time analysed
    b = np.flatnonzero(td.builds & (td.host_begin > td.host_begin[steps[1]]))
    assert len(b)
    assert a.wall["wall_ns"] <= int(td.host_end[steps[-1]] - td.host_begin[steps[1]]) - int(
        (td.host_end[b] - td.host_begin[b]).max())
    counts = {r["name"]: r["count"] for r in a.kernels}
    assert counts == {"spin": STEPS - 1, "add": STEPS - 1}
    # every build of the run is still there for the build findings, set-up included
    assert {r["path"] for r in a.regions if r["cat"] in ("compile", "build")}
    text = a.report(width=200).splitlines()
    assert text[1].startswith(f"{a.spans} spans over ") and f"steps {first + 1}-{last}: steady state" in text[1]
    assert "left out" in text[1] and "--whole for the whole run" in text[1]
    assert "over the window's wall time" in a.report(width=200)


def test_without_steps_the_steady_state_starts_at_the_first_launchs_region(traces: dict[str, str]) -> None:
    path = traces["plain"]
    td = _td(path)
    whole, a = cltrace.analyze(path, window=None), cltrace.analyze(path)
    it = np.flatnonzero(td.name == td.names.index("iteration"))
    assert a.window["label"].endswith("(region 'iteration' of the first kernel launch) to the end")
    assert a.wall["t0_ns"] == int(td.host_begin[it].min())
    assert a.wall["wall_ns"] < whole.wall["wall_ns"] - STARTUP_S * 1e9
    rows = {(r["path"], r["source"]): r for r in a.regions}
    assert rows[("iteration", "host")]["count"] == STEPS  # the first iteration counts whole
    assert {r["name"]: r["count"] for r in a.kernels} == {"spin": STEPS, "add": STEPS}
    _adds_up(a)


def test_steps_time_range_and_region_windows(traces: dict[str, str]) -> None:
    path = traces["steps"]
    td = _td(path)
    steps = _steps(td)
    n2, n3 = td.attr(steps[2], "step"), td.attr(steps[3], "step")
    a = cltrace.analyze(path, window=f"{n2}:{n3}")
    assert a.window["label"] == f"steps {n2}-{n3}"
    assert {r["name"]: r["count"] for r in a.kernels} == {"spin": 2, "add": 2}
    _adds_up(a)
    # the same two steps as a time range, in ms since the first span
    ms = [(int(td.host_begin[steps[2]]) - td.t0) / 1e6, (int(td.host_end[steps[3]]) - td.t0) / 1e6]
    t = cltrace.analyze(path, window=cltrace.Window(start_ms=ms[0], end_ms=ms[1]))
    assert {r["name"]: r["count"] for r in t.kernels} == {"spin": 2, "add": 2}
    assert t.window["kind"] == "time"
    _adds_up(t)
    # only the time inside fwd's occurrences: its kernels, no other; the device busy all of it
    r = cltrace.analyze(path, window=cltrace.Window(region="fwd"))
    assert {k["name"] for k in r.kernels} == {"spin"} and r.kernels[0]["count"] == STEPS
    assert r.window["label"] == f"inside region 'fwd' ({STEPS} occurrences)"
    assert r.devices[0]["busy_pct"] > 99.0
    _adds_up(r)
    # the pause between two fwd occurrences is not in that window: no idle gap there; in steps 3-4 it is
    assert r.finding("long-idle-gaps") is None
    gap = cltrace.analyze(path, window=f"{td.attr(steps[3], 'step')}:{td.attr(steps[4], 'step')}")
    assert gap.finding("long-idle-gaps")["evidence"]["longest_ns"] >= PAUSE_S * 1e9
    # combined: fwd inside two steps
    both = cltrace.analyze(path, window=cltrace.Window(steps=(n2, n3), region="body/fwd"))
    assert both.kernels[0]["count"] == 2 and both.window["kind"] == "steps+region"


def test_a_window_the_trace_does_not_have_says_what_it_has(traces: dict[str, str]) -> None:
    with pytest.raises(cltrace.WindowError, match=r"no step 99 in the trace \(its steps: steps 0-5\)"):
        cltrace.analyze(traces["steps"], window="99")
    with pytest.raises(cltrace.WindowError, match=r"no region 'nope' in the trace \(its regions: body, fwd\)"):
        cltrace.analyze(traces["steps"], window=cltrace.Window(region="nope"))
    with pytest.raises(cltrace.WindowError, match="marks no steps"):
        cltrace.analyze(traces["plain"], window="1:2")
    with pytest.raises(ValueError, match="ends .* before it starts"):
        cltrace.Window(start_ms=5, end_ms=1)


def test_summary_and_diff_take_the_window_on_both_sides(traces: dict[str, str]) -> None:
    path = traces["steps"]
    stats, meta = summarize(path, "2:3")
    tree = stats.as_dict()
    assert tree["step"]["host"]["count"] == 2 and tree["step/body/fwd/spin"]["device"]["count"] == 2
    assert meta["window"]["label"] == "steps 2-3"
    assert summarize(path)[0].as_dict()["step"]["host"]["count"] == STEPS
    rows = diff(path, traces["steps_json"], 10.0, window="2:4")
    total = next(r for r in rows if r.kind == "total")
    assert total.per == "step" and total.count_a == total.count_b == 3
    assert next(r for r in rows if r.name == "spin").count_a == 3
    with pytest.raises(cltrace.WindowError, match="marks no steps"):
        diff(path, traces["plain"], 10.0, window="2:4")


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CLTRACE", "OTEL_"))}
    env["CLTRACE_NATIVE"] = os.environ.get("CLTRACE_NATIVE", "1")
    return subprocess.run([sys.executable, "-m", "cltrace", *args], capture_output=True, text=True, env=env,
                          timeout=120)


def test_cli_windows_and_their_errors(traces: dict[str, str], tmp_path: Path) -> None:
    path = traces["steps"]
    r = _cli("analyze", path)
    assert r.returncode == 0, r.stderr
    assert "steps 1-5: steady state" in r.stdout.splitlines()[1]
    r = _cli("analyze", path, "--whole", "--json")
    assert json.loads(r.stdout)["window"]["kind"] == "whole"
    r = _cli("analyze", path, "--region", "fwd", "--json")
    assert json.loads(r.stdout)["window"]["kind"] == "region"
    r = _cli("summary", path, "--steps", "2:3")
    assert r.returncode == 0 and r.stdout.splitlines()[0].endswith("steps 2-3"), r.stdout
    r = _cli("diff", path, traces["steps_json"], "--steps", "2:4", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["window_a"]["label"] == d["window_b"]["label"] == "steps 2-4"
    r = _cli("diff", path, traces["steps_json"], "--steady")
    assert r.returncode == 0 and "(steps 1-5: steady state" in r.stdout.splitlines()[0], r.stdout
    for args, said in [(("analyze", path, "--steps", "99"), "no step 99 in the trace"),
                       (("analyze", path, "--steps", "x"), "give A:B"),
                       (("analyze", path, "--steps", "2", "--whole"), "--whole is a window of its own"),
                       (("analyze", path, "--from", "-3"), "milliseconds since"),
                       (("summary", path, "--region", "nope"), "no region 'nope'"),
                       (("analyze", "--store", str(tmp_path / "store"), "--steps", "2:3"), "--store answers over whole runs")]:
        r = _cli(*args)
        assert r.returncode == 2 and not r.stdout, (args, r.stdout, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1 and said in r.stderr, (args, r.stderr)


def _grid(s: np.ndarray, e: np.ndarray, n: int) -> np.ndarray:
    g = np.zeros(n, bool)
    for a, b in zip(s.tolist(), e.tolist()):
        g[a:b] = True
    return g


def test_interval_intersection_and_difference_match_a_grid() -> None:
    rng = np.random.default_rng(7)
    for _ in range(300):
        sets = []
        for _ in range(2):
            k = int(rng.integers(0, 8))
            a = rng.integers(0, 60, k)
            s, e, _ = union(a.astype(np.int64), (a + rng.integers(0, 15, k)).astype(np.int64))
            keep = e > s
            sets.append((s[keep], e[keep]))
        (as_, ae), (bs, be) = sets
        ga, gb = _grid(as_, ae, 80), _grid(bs, be, 80)
        for (s, e), want in ((intersect(as_, ae, bs, be), ga & gb), (subtract(as_, ae, bs, be), ga & ~gb)):
            assert (_grid(s, e, 80) == want).all()
            assert (np.diff(s) > 0).all() and (e > s).all() and (s[1:] >= e[:-1]).all()
