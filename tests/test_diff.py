"""``cltrace diff --fail-above`` as a CI gate, on real PoCL runs made here: identical runs pass (the
demo and a scheduled loop, ten pairs), a kernel made twice as slow for real fails naming it, a new
kernel is counted by its time (a renamed one nets out, a removed one is no regression), one
outlier launch moves no verdict, the text and ``--json`` say the same; and the rule on samples."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pyopencl as cl
import pytest

import cltrace
from cltrace.analyzers import gate
from cltrace.analyzers.diff import diff, regressions
from cltrace.analyzers.model import TraceData
from cltrace.analyzers.samples import RowSamples
from cltrace.cli.demo import run_demo
from cltrace.read import load_columns

SOURCE = """
__kernel void spin(__global float *a, const int iters) {
    int i = get_global_id(0);
    float x = a[i];
    for (int k = 0; k < iters; ++k) x = x * 0.999f + 0.5f;
    a[i] = x;
}
__kernel void spin_renamed(__global float *a, const int iters) {
    int i = get_global_id(0);
    float x = a[i];
    for (int k = 0; k < iters; ++k) x = x * 0.999f + 0.5f;
    a[i] = x;
}
__kernel void add1(__global float *a) { a[get_global_id(0)] += 1.0f; }
"""
pytestmark = pytest.mark.timing  # every verdict here rides on real runs' durations on a shared CPU

N = 4096
STEPS = 12
ITERS = 1500


class Loop:
    """A training-like loop: per step one spin kernel (most of the device time) and one small add."""

    def __init__(self) -> None:
        self.ctx = cl.Context([cltrace.default_device()])
        self.q = cltrace.profiling_queue(self.ctx)
        prg = cl.Program(self.ctx, SOURCE).build()
        self.k = {name: cl.Kernel(prg, name) for name in ("spin", "spin_renamed", "add1")}
        self.buf = cl.Buffer(self.ctx, cl.mem_flags.READ_WRITE, 4 * N)

    def record(self, path: Path, iters: int = ITERS, spin: str = "spin", extra: str | None = None,
               steps: bool = True) -> Path:
        """``STEPS`` active steps after one warm-up step (without ``steps``, no schedule: nothing
        marks them); ``extra``: a kernel only this run launches."""
        q = self.q
        schedule = cltrace.schedule(wait=0, warmup=1, active=STEPS) if steps else None
        with cltrace.trace(str(path), quiet=True, schedule=schedule):
            for _ in cltrace.steps(range(STEPS + 1), q):
                cltrace.launch(self.k[spin], q, (N,), None, self.buf, np.int32(iters))
                cltrace.launch(self.k["add1"], q, (N,), None, self.buf)
                if extra:
                    cltrace.launch(self.k[extra], q, (N,), None, self.buf, np.int32(iters))
            q.finish()
        return path


@pytest.fixture(scope="module")
def runs(tmp_path_factory: Any) -> dict[str, Any]:
    d = tmp_path_factory.mktemp("diff")
    loop = Loop()
    out: dict[str, Any] = {"same": [loop.record(d / f"same{i}.pftrace") for i in range(7)]}
    out["slow"] = loop.record(d / "slow.pftrace", iters=ITERS * 2)  # spin twice as slow, for real: past any drift here
    out["new"] = loop.record(d / "new.pftrace", extra="spin_renamed")  # a new kernel as long as spin
    out["no_steps"] = loop.record(d / "no_steps.pftrace", steps=False)
    out["demo"] = [Path(run_demo(out_dir=str(d / f"demo{i}"), steps=12, formats=("pftrace",)).paths[0])
                   for i in range(5)]
    out["again"] = {"same": lambda i: loop.record(d / f"again{i}.pftrace"),
                    "demo": lambda i: Path(run_demo(out_dir=str(d / f"again_demo{i}"), steps=12,
                                                    formats=("pftrace",)).paths[0])}
    cltrace.RECORDER.clear()
    return out


def cli(*args: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cltrace", "diff", *map(str, args)], capture_output=True, text=True,
                          timeout=120, env=dict(os.environ, COLUMNS="400"))


def test_identical_runs_pass_the_gate(runs: dict[str, Any]) -> None:
    """Ten pairs of identical runs, each run against the next (four of the demo, six of the loop)
    pass at 50 %, and one demo pair on the command line. The device here is PoCL on the same two
    cores as the test: now and then a whole run is slower than the one before (CI saw a demo region
    +62 % at its median, beyond both runs' spread), which no gate can tell from a slowdown. So a pair
    that fails is recorded again, once, as a benchmark gate re-runs a suspect comparison; the fresh
    pair must pass. One launch's outlier is tested at 10 %
    below, on one run's own trace; a real slowdown at 10 %, and 20 % on samples."""
    retried: list[str] = []
    passed: list[tuple[Path, Path]] = []
    for group in ("demo", "same"):
        for i, (a, b) in enumerate(zip(runs[group], runs[group][1:])):
            rows = diff(a, b, 50.0)
            if regressions(rows):
                retried.append(f"{group} {i}: " + "; ".join(f"{r.name} {r.reason}" for r in regressions(rows)))
                a, b = runs["again"][group](2 * i), runs["again"][group](2 * i + 1)
                rows = diff(a, b, 50.0)
            assert not regressions(rows), (retried, [(r.name, r.reason) for r in regressions(rows)])
            assert rows[0].kind == "total" and rows[0].per == "step" and rows[0].gated
            passed.append((a, b))
    cltrace.RECORDER.clear()
    p = cli(*passed[0], "--fail-above", "50")  # a demo pair the gate passed above: the command line agrees
    assert p.returncode == 0, p.stdout + p.stderr
    assert "0 regression(s) above 50%" in p.stdout


def test_a_run_without_steps_is_compared_as_a_whole_run(runs: dict[str, Any]) -> None:
    """One run marks steps, the other does not (no schedule): rows whose samples are not alike (per
    step, per launch) compare the two runs' totals, one sample each, not a new and a removed row."""
    rows = diff(runs["same"][0], runs["no_steps"], 25.0)
    total = [r for r in rows if r.kind == "total"]
    assert len(total) == 1 and total[0].per == "run" and total[0].count_a and total[0].count_b
    assert total[0].verdict in ("ok", "regression", "faster") and "1 sample" in total[0].reason  # noise decides which
    assert next(r for r in rows if r.name == "spin").per == "run"  # per step against per launch: whole runs
    assert not {r.verdict for r in rows if r.kind != "region"} & {"new", "removed"}  # the step spans are A's only


def test_one_outlier_launch_is_no_regression(runs: dict[str, Any]) -> None:
    """B is A with one spin launch 60x longer (a preempted launch): the mean moves by several times,
    which failed the gate; the median per step hardly moves, so nothing regresses."""
    a, b = TraceData(*load_columns(runs["same"][0])), TraceData(*load_columns(runs["same"][0]))
    spin = np.flatnonzero(np.array(b.names)[b.name] == "spin")
    b.dev_end[spin[5]] += 60 * (b.dev_end[spin[5]] - b.dev_start[spin[5]])
    rows = {r.name: r for r in diff(a, b, 10.0)}
    # the median is the same steps' but one, which may pass the middle: a neighbour's value
    assert rows["spin"].mean_change_pct > 100 and abs(rows["spin"].change_pct) < 10
    assert not regressions(list(rows.values())), [(r.name, r.reason) for r in rows.values()]
    assert rows["spin"].verdict == "ok" and "outliers" in rows["spin"].reason


def test_a_kernel_made_slower_for_real_fails_naming_it(runs: dict[str, Any]) -> None:
    p = cli(runs["same"][0], runs["slow"], "--fail-above", "10")
    assert p.returncode == 1, p.stdout + p.stderr
    listed = p.stdout.split("regression(s) above 10%")[1]
    assert "kernel spin: p50 +" in listed and "beyond both runs' p25-p75" in listed, p.stdout
    assert "add1" not in listed
    doc = json.loads(cli(runs["same"][0], runs["slow"], "--fail-above", "10", "--json").stdout)
    spin = next(r for r in doc["rows"] if r["name"] == "spin")
    assert spin["verdict"] == "regression" and spin["regressed"] and spin["per"] == "step"
    assert spin["change_pct"] > 10
    total = doc["rows"][0]
    assert total["kind"] == "total" and total["regressed"]  # the run's device time per step too


def test_a_new_kernel_is_counted_by_its_time(runs: dict[str, Any]) -> None:
    """A kernel only B launches, as long as the rest of the step: a regression (it passed before:
    a new kernel was never one). The same run with its kernel renamed nets out; removed work is
    not slower."""
    p = cli(runs["same"][0], runs["new"], "--fail-above", "10")
    assert p.returncode == 1, p.stdout + p.stderr
    assert "kernel spin_renamed: new in B:" in p.stdout.split("regression(s) above 10%")[1]
    a, b = TraceData(*load_columns(runs["same"][0])), TraceData(*load_columns(runs["same"][0]))
    b.names = ["spin_renamed" if n == "spin" else n for n in b.names]  # the same run, its kernel renamed
    renamed = diff(a, b, 10.0)
    assert not regressions(renamed), [(r.name, r.reason) for r in regressions(renamed)]
    verdicts = {r.name: (r.verdict, r.reason) for r in renamed}
    assert verdicts["spin_renamed"][0] == "new" and "new less removed rows +0.0%" in verdicts["spin_renamed"][1]
    assert verdicts["spin"][0] == "removed" and verdicts["spin"][1].startswith("not in B:")
    back = diff(runs["new"], runs["same"][0], 10.0)  # the kernel removed: not a regression
    assert "spin_renamed" not in [r.name for r in regressions(back)]  # (spin itself drifts on a loaded CPU device)
    assert next(r for r in back if r.name == "spin_renamed").verdict == "removed"


def test_text_and_json_give_each_row_the_same_verdict_and_reason(runs: dict[str, Any]) -> None:
    args = (runs["demo"][0], runs["slow"], "--fail-above", "10", "--top", "0")
    text, doc = cli(*args).stdout, json.loads(cli(*args, "--json").stdout)
    assert doc["threshold_pct"] == 10.0 and doc["gate"] is True
    lines = text.splitlines()
    for r in doc["rows"]:
        line = next(ln for ln in lines[4:] if ln.startswith({"kernel": "kernel ", "total": "total: "}.get(r["kind"], "")
                                                          + r["name"] + " "))
        assert r["verdict"] in line.split() and line.rstrip().endswith(r["reason"]), (line, r)
    assert doc["regressions"] == [r["name"] for r in doc["rows"] if r["regressed"]]
    assert text.split("regression(s) above 10%")[0].endswith(f"{len(doc['regressions'])} ")


def _row(vals: list[float]) -> RowSamples:
    v = np.sort(np.array(vals, np.float64))
    return RowSamples(len(v), int(v.sum()), int(v.sum()), v, "call")


def test_the_rule_on_samples() -> None:
    rng = np.random.default_rng(1)
    base = list(37_000 + rng.normal(0, 800, 60))
    outlier = base[:-1] + [2_206_000.0]  # one launch 60x slower: the mean +100 %, the median unmoved
    v = gate.matched(_row(base), _row(outlier), 10.0, 10 * int(sum(base)), "device")
    assert v.verdict == "ok" and "outliers" in v.reason
    slower = [x * 1.2 for x in base]
    v = gate.matched(_row(base), _row(slower), 10.0, 10 * int(sum(base)), "device")
    assert v.regressed and v.reason.startswith("p50 +20.0%, mean +20.0% (> 10%)")
    assert gate.matched(_row(slower), _row(base), 10.0, 10 * int(sum(base)), "device").verdict == "faster"
    wide = list(rng.uniform(10_000, 90_000, 60))  # a spread wider than the change: not a regression
    v = gate.matched(_row(wide), _row([x * 1.15 for x in wide]), 10.0, 10 ** 7, "device")
    assert not v.regressed and v.reason.endswith("but within the runs' p25-p75 spread")
    small = gate.matched(_row(base), _row(slower), 10.0, 1000 * int(sum(base)), "device")
    assert small.verdict == "small" and not small.regressed  # under 1 % of the run's time: listed only
    once = gate.matched(_row([5e6]), _row([7e6]), 10.0, 10 ** 7, "device")  # one sample: the time it adds
    assert once.regressed and "adds 2.00 ms, +20.0% of A's device time" in once.reason
    assert not gate.matched(_row([5e6]), _row([7e6]), 10.0, 10 ** 8, "device").regressed
    host = gate.matched(_row([5e6]), _row([9e6]), 10.0, 10 ** 7, "wall")  # host time once: no measurement
    assert host.verdict == "listed" and not host.gated
    assert gate.new(_row([3e6]), 1.0, 10.0, 10 ** 7, 3e6, "device").regressed
    assert not gate.new(_row([3e6]), 1.0, 10.0, 10 ** 7, 0.0, "device").regressed  # offset by removed kernels
    assert not gate.new(_row([5e5]), 1.0, 10.0, 10 ** 7, 5e5, "device").regressed
