"""Schedules on real OpenCL (PoCL): which steps are traced and written, one file per active cycle,
warm-up never written, ``on_trace_ready`` per cycle, each step its own OTLP trace (real collector),
and ``cltrace run --schedule`` / ``--steps-from``."""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

import cltrace
from cltrace.capture.schedule import parse_schedule
from cltrace.read import load
from cltrace.record.recorder import RECORDER
from otlp_collector import RotelCollector

# (schedule, steps run, manual step() calls?, {cycle: (active steps, warm-up steps)})
CASES = {
    "skip-wait-warmup-repeat": (dict(skip_first=1, wait=1, warmup=1, active=2, repeat=2), 12, False,
                                {1: ((3, 4), (2,)), 2: ((7, 8), (6,))}),
    "endless-cut-short": (dict(skip_first=0, wait=0, warmup=1, active=3, repeat=0), 10, False,
                          {1: ((1, 2, 3), (0,)), 2: ((5, 6, 7), (4,)), 3: ((9,), (8,))}),
    "no-warmup-manual": (dict(skip_first=2, wait=2, warmup=0, active=1, repeat=3), 12, True,
                         {1: ((4,), ()), 2: ((7,), ()), 3: ((10,), ())}),
}


@pytest.mark.parametrize("name", CASES)
def test_phase_of_every_step(name: str) -> None:
    kw, n, _, cycles = CASES[name]
    s = cltrace.schedule(**kw)
    active = {st: c for c, (sts, _) in cycles.items() for st in sts}
    warm = {st: c for c, (_, ws) in cycles.items() for st in ws}
    for st in range(n):
        phase, cycle = s.phase(st)
        if st in active:
            assert (phase, cycle) == ("active", active[st]), st
        elif st in warm:
            assert (phase, cycle) == ("warmup", warm[st]), st
        else:
            assert phase in ("skip", "wait", "done"), (st, phase)
    full = [max(sts) for sts, _ in cycles.values() if len(sts) == kw["active"]]  # a cycle cut short has no end
    assert [st for st in range(n) if s.ends_cycle(st)] == full


def test_schedule_text_round_trips_and_bad_text_says_why() -> None:
    s = parse_schedule("skip_first=10,wait=1,warmup=1,active=3,repeat=2")
    assert s == cltrace.schedule(10, 1, 1, 3, 2) and parse_schedule(str(s)) == s
    assert parse_schedule("active=5") == cltrace.schedule(active=5)
    for text, why in [("wait=x", "not a whole number"), ("foo=1", "KEY=N"), ("active=0", "active must be >= 1"),
                      ("wait=-1", ">= 0"), ("", "KEY=N"), ("wait=1,wait=2", "twice"), ("wait", "KEY=N")]:
        with pytest.raises(ValueError, match=why):
            parse_schedule(text)


def _step_of(spans: dict[int, Any], s: Any) -> int | None:
    """The number of the step span a span hangs under (None: outside any step)."""
    seen = 0
    while s is not None and seen < 64:
        if s.cat == "step":
            return int(s.name.split()[1])
        s = spans.get(s.parent)
        seen += 1
    return None


def _steps_in(path: str | Path) -> tuple[list[int], dict[int | None, int], dict[str, Any]]:
    """(step spans, kernels per step, metadata) of a trace file."""
    spans, meta = load(str(path))
    by_id = {s.id: s for s in spans}
    steps = sorted(int(s.name.split()[1]) for s in spans if s.cat == "step")
    kernels: dict[int | None, int] = {}
    for s in spans:
        if s.cat == "kernel":
            k = _step_of(by_id, s)
            kernels[k] = kernels.get(k, 0) + 1
    return steps, kernels, meta


def _workload(kernels: Any, queue: Any, n: int, manual: bool) -> None:
    kernels.launch_add(queue)  # outside any step: written to the main files only
    queue.finish()
    if manual:
        for _ in range(n):
            cltrace.step(queue)
            with cltrace.region("work", queue):
                kernels.launch_add(queue)
    else:
        for _ in cltrace.steps(range(n), queue):
            with cltrace.region("work", queue):
                kernels.launch_add(queue)
    queue.finish()


@pytest.mark.parametrize("name", CASES)
def test_steps_and_cycles_are_accounted_exactly(name: str, tmp_path: Path, kernels: Any, queue: Any) -> None:
    kw, n, manual, expected = CASES[name]
    got: list[tuple[int, tuple[int, ...], tuple[int, ...], list[int]]] = []

    def ready(cycle: cltrace.Cycle) -> None:
        steps = sorted(int(s.name.split()[1]) for s in cycle.spans() if s.cat == "step")
        got.append((cycle.number, cycle.steps, cycle.warmup, steps))
        cycle.write()

    outs = [tmp_path / "run.json", tmp_path / "run.pftrace"]
    with cltrace.trace(*outs, schedule=cltrace.schedule(**kw), on_trace_ready=ready, quiet=True):
        _workload(kernels, queue, n, manual)

    assert got == [(c, act, warm, list(act)) for c, (act, warm) in expected.items()]
    active = sorted(st for act, _ in expected.values() for st in act)
    warm = {st for _, ws in expected.values() for st in ws}
    for main in outs:
        steps, per_step, meta = _steps_in(main)
        assert steps == active, main
        assert per_step == {None: 1, **{st: 1 for st in active}}, main  # one launch per written step, nothing else
        sched = meta["schedule"]
        assert (sched["steps"], sched["warmup"], sched["active"], sched["cycles"]) == (n, len(warm), len(active),
                                                                                       len(expected))
        assert sched["warmup_spans_withheld"] == 3 * len(warm)  # the step, its region and its kernel
    for c, (act, _) in expected.items():
        for main in outs:
            path = main.with_name(f"run.cycle{c}{main.suffix}")
            steps, per_step, meta = _steps_in(path)
            assert steps == list(act) and per_step == {st: 1 for st in act}, path
            assert meta["cycle"]["number"] == c and meta["cycle"]["steps"] == list(act)
            assert meta["clocks"] and meta["recorded_spans"] == 3 * len(act)
    assert not list(tmp_path.glob(f"run.cycle{len(expected) + 1}.*"))
    kept = RECORDER.spans()  # warm-up is not in memory or the reports either
    assert not {s.name for s in kept if s.cat == "step"} & {f"step {w}" for w in warm}
    assert sum(1 for s in kept if s.cat == "kernel") == len(active) + 1


def test_default_handler_writes_each_format_next_to_its_output(tmp_path: Path, kernels: Any, queue: Any,
                                                               capfd: pytest.CaptureFixture[str]) -> None:
    outs = [tmp_path / "run.json", tmp_path / "run.pftrace", tmp_path / "run.speedscope.json"]
    with cltrace.trace(*outs, schedule=cltrace.schedule(wait=1, warmup=1, active=2, repeat=2)):
        for _ in cltrace.steps(range(8), queue):
            with cltrace.region("work", queue):
                kernels.launch_add(queue)
    err = capfd.readouterr().err
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == sorted(["run.json", "run.pftrace", "run.speedscope.json",
                            "run.cycle1.json", "run.cycle1.pftrace", "run.cycle1.speedscope.json",
                            "run.cycle2.json", "run.cycle2.pftrace", "run.cycle2.speedscope.json"])
    assert err.count("cltrace: wrote") == 3 and "run.cycle1.json, " in err and "run.cycle2.speedscope.json" in err
    ev = json.loads((tmp_path / "run.cycle2.json").read_text())
    threads = {e["args"]["name"] for e in ev if e.get("name") == "thread_name"}
    processes = {e["args"]["name"] for e in ev if e.get("name") == "process_name"}
    assert "MainThread" in threads and any("queue" in t for t in threads)
    assert any(p.startswith("OpenCL") for p in processes)
    steps = [e for e in ev if e.get("ph") == "X" and e.get("cat") == "step"]
    assert sorted({e["name"] for e in steps}) == ["step 6", "step 7"]
    assert {e["args"]["parent"] for e in steps} == {0}  # a root, with a host and a device span each
    assert len(steps) == 4
    ss = json.loads((tmp_path / "run.cycle1.speedscope.json").read_text())
    assert {"step", "work", "add"} <= {f["name"] for f in ss["shared"]["frames"]}


def test_device_work_belongs_to_the_step_that_launched_it(tmp_path: Path, kernels: Any, queue: Any) -> None:
    """A warm-up launch still running in an active step is not written; an active launch that runs
    on after its step ended is."""
    out = tmp_path / "run.json"
    with cltrace.trace(out, schedule=cltrace.schedule(wait=0, warmup=1, active=1, repeat=2), quiet=True):
        for i in cltrace.steps(range(4), queue):
            if i % 2 == 0:  # warm-up: a long kernel, not waited for
                kernels.launch_spin(queue, 20000)
            else:
                kernels.launch_add(queue)
                kernels.launch_spin(queue, 20000)  # runs on into the next step
    spans, _ = load(str(out))
    steps = {int(s.name.split()[1]): s for s in spans if s.cat == "step"}
    assert sorted(steps) == [1, 3]
    spins = [s for s in spans if s.name == "spin"]
    assert len(spins) == 2 and sum(s.name == "add" for s in spans) == 2
    for s in spins:
        owner = steps[_step_of({x.id: x for x in spans}, s)]
        assert owner.host_begin <= s.host_begin < owner.host_end
    assert any(s.dev_end > steps[1].host_end for s in spins if s.host_begin < steps[1].host_end), \
        "the active spin should still run after its step ended"
    first_add = min((s for s in spans if s.name == "add"), key=lambda s: s.host_begin)
    assert first_add.dev_start is not None  # it waited behind the warm-up spin, which is withheld


def test_a_failing_handler_costs_its_cycle_only(tmp_path: Path, kernels: Any, queue: Any,
                                                caplog: pytest.LogCaptureFixture) -> None:
    seen: list[int] = []

    def ready(cycle: cltrace.Cycle) -> None:
        seen.append(cycle.number)
        if cycle.number == 1:
            raise RuntimeError("disk full")

    with caplog.at_level(logging.WARNING, logger="cltrace"):
        with cltrace.trace(tmp_path / "r.json", schedule=cltrace.schedule(wait=0, warmup=0, active=1, repeat=2),
                           on_trace_ready=ready, quiet=True):
            for _ in cltrace.steps(range(3)):
                kernels.launch_add(queue)
    assert seen == [1, 2]
    assert "on_trace_ready failed for cycle 1: RuntimeError: disk full" in caplog.text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]  # a handler of one's own writes nothing else


def test_steps_without_a_schedule_are_plain_iteration(kernels: Any, queue: Any, tmp_path: Path) -> None:
    with cltrace.trace(tmp_path / "r.json", quiet=True):
        assert list(cltrace.steps(range(3))) == [0, 1, 2]
        cltrace.step()
        kernels.launch_add(queue)
    assert RECORDER.gate is None
    assert not [s for s in RECORDER.spans() if s.cat == "step"]


def test_bad_arguments_are_refused_before_tracing_starts(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="needs a schedule"):
        cltrace.start(tmp_path / "a.json", on_trace_ready=print)
    with pytest.raises(TypeError, match="cltrace.schedule"):
        cltrace.start(tmp_path / "a.json", schedule="wait=1")
    assert not cltrace.enabled() and not RECORDER.sinks
    cltrace.start(schedule=cltrace.schedule())
    with pytest.raises(ValueError, match="already running"):
        cltrace.start(schedule=cltrace.schedule())
    cltrace.stop()


# ---- OTLP: each step its own trace, with a real collector -----------------------------------

def test_each_step_is_its_own_otlp_trace(kernels: Any, queue: Any) -> None:
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    memory = InMemorySpanExporter()
    with RotelCollector() as col:
        sink = cltrace.OtlpSink(col.grpc_endpoint, protocol="grpc", close_timeout_s=60)
        readable = cltrace.OtlpSink(exporter=memory)  # the SDK's ReadableSpan path
        with cltrace.trace(sink, readable, schedule=cltrace.schedule(wait=0, warmup=1, active=3, repeat=1)):
            kernels.launch_add(queue)  # outside the steps: the run's trace
            for _ in cltrace.steps(range(5), queue):
                with cltrace.region("work", queue):
                    kernels.launch_add(queue)
        assert sink.stats()["delivered"] == 1 + 1 + 3 * 3
        spans = col.wait_for(lambda s: len(s) >= 11)
    assert len(spans) == 11
    traces: dict[str, list[dict[str, Any]]] = {}
    for s in spans:
        traces.setdefault(s["trace_id"], []).append(s)
    run = traces.pop(sink.trace_id)
    assert sorted(s["name"] for s in run) == ["add", "cltrace.run"]
    assert sorted(sorted(s["name"] for s in t) for t in traces.values()) == [["add", f"step {i}", "work"]
                                                                             for i in (1, 2, 3)]
    for t in traces.values():
        by = {s["name"]: s for s in t}
        step = next(s for n, s in by.items() if n.startswith("step"))
        assert step["parent_id"] is None
        assert by["work"]["parent_id"] == step["span_id"] and by["add"]["parent_id"] == by["work"]["span_id"]
        assert step["attributes"]["cltrace.run.trace_id"] == f"{sink.trace_id:032x}"
        assert step["attributes"]["cltrace.phase"] == "active"
    got = memory.get_finished_spans()
    groups: dict[int, set[str]] = {}
    for s in got:
        groups.setdefault(s.context.trace_id, set()).add(s.name)
    assert groups.pop(readable.trace_id) == {"add", "cltrace.run"}
    assert sorted(sorted(g) for g in groups.values()) == [["add", f"step {i}", "work"] for i in (1, 2, 3)]
    assert all(s.parent is None for s in got if s.name.startswith("step"))


# ---- the command line ------------------------------------------------------------------------

SCRIPT = """
import sys
import numpy as np
import pyopencl as cl
import pyopencl.array as cla
import cltrace

ctx = cl.create_some_context(interactive=False)
q = cl.CommandQueue(ctx)
a = cla.to_device(q, np.arange(1024, dtype=np.float32))
for i in range(int(sys.argv[1])):
    if sys.argv[2] == "step":
        cltrace.step()
        (a * 2).get()
    else:
        with cltrace.region("train_step"):
            with cltrace.region("train_step"):   # nested: not a step of its own
                (a * 2).get()
"""


def cltrace_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cltrace", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=240, env={**os.environ, "CLTRACE_CACHE_DIR": str(cwd / "cache")})


@pytest.mark.parametrize("mode, extra", [("step", []), ("region", ["--steps-from", "train_step"])])
def test_cltrace_run_with_a_schedule(tmp_path: Path, mode: str, extra: list[str]) -> None:
    (tmp_path / "prog.py").write_text(textwrap.dedent(SCRIPT))
    proc = cltrace_cli("run", "--schedule", "skip_first=1,wait=1,warmup=1,active=2,repeat=2", *extra,
                       "--out", "out/p.json", "prog.py", "12", mode, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("cltrace: wrote") == 3
    assert "no step" not in proc.stderr and "marked no step" not in proc.stderr, proc.stderr
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["p.cycle1.json", "p.cycle2.json", "p.json"]
    steps, per_step, _ = _steps_in(tmp_path / "out" / "p.json")
    assert steps == [3, 4, 7, 8]
    for c, act in ((1, [3, 4]), (2, [7, 8])):
        s, k, _ = _steps_in(tmp_path / "out" / f"p.cycle{c}.json")
        assert s == act and set(k) == set(act) and all(v == k[act[0]] > 0 for v in k.values())
    if mode == "region":
        spans, _ = load(str(tmp_path / "out" / "p.cycle1.json"))
        outer = [s for s in spans if s.name == "train_step" and s.cat == "region" and
                 next(x for x in spans if x.id == s.parent).cat == "step"]
        assert len(outer) == 2 and sum(s.name == "train_step" for s in spans) == 4


@pytest.mark.parametrize("extra, says", [
    ([], "the script marked no step, so the whole run was traced: call cltrace.step() at the top of each "
         "iteration or loop over cltrace.steps(iterable), or pass --steps-from REGION"),
    (["--steps-from", "no_such_region"], "no region 'no_such_region' ran (--steps-from no_such_region), so the "
                                         "whole run was traced: call cltrace.step()"),
])
def test_a_schedule_that_sees_no_step_says_so_at_exit(tmp_path: Path, extra: list[str], says: str) -> None:
    (tmp_path / "prog.py").write_text(textwrap.dedent("""
        import cltrace
        for i in range(3):
            with cltrace.region("train_step"):
                pass
    """))
    proc = cltrace_cli("run", "--schedule", "wait=1,active=1", *extra, "--out", "p.json", "prog.py", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines == ["cltrace: wrote p.json", f"cltrace: --schedule: {lines[1].split(': ', 2)[2]}"], proc.stderr
    assert says in lines[1], lines[1]
    spans, _ = load(str(tmp_path / "p.json"))
    assert [s.name for s in spans] == ["train_step"] * 3


@pytest.mark.parametrize("args, says", [
    (["--schedule", "wait=x"], "wait='x' is not a whole number"),
    (["--schedule", "active=0"], "active must be >= 1"),
    (["--schedule", "warmup=1,bogus=2"], "'bogus=2' is not KEY=N"),
    (["--steps-from", "train_step"], "--steps-from train_step needs --schedule"),
])
def test_bad_schedule_input_is_one_line_and_exit_2(tmp_path: Path, args: list[str], says: str) -> None:
    (tmp_path / "prog.py").write_text("raise SystemExit('must not run')\n")
    proc = cltrace_cli("run", *args, "prog.py", cwd=tmp_path)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("cltrace: error:") and says in lines[0], proc.stderr


@pytest.mark.parametrize("mode", ["projected", "markers"])
def test_a_step_on_a_queue_is_projected_like_a_region(mode: str, kernels: Any, queue: Any) -> None:
    """Projected, ``step(queue)`` enqueues nothing of its own (a marker is a command: ~10 µs of a
    training step's host time on NVIDIA's driver): its device span runs from its first command's START to
    its last's END, exactly; a step that launched nothing has a host span only. With markers it brackets
    its commands."""
    from cltrace.record import regions
    from cltrace.record.recorder import RECORDER

    regions.set_region_mode(mode)
    try:
        with cltrace.trace(quiet=True, schedule=cltrace.schedule(wait=0, warmup=0, active=3, repeat=1)):
            for i in cltrace.steps(range(3), queue):
                if i < 2:
                    kernels.launch_spin(queue, 200)
                    with cltrace.region("work", queue):
                        kernels.launch_add(queue)
            queue.finish()
    finally:
        regions.set_region_mode("auto")
    spans = RECORDER.spans()
    steps = sorted((s for s in spans if s.cat == "step"), key=lambda s: s.host_begin)
    cmds = sorted((s for s in spans if s.cat == "kernel"), key=lambda s: s.host_begin)
    assert len(steps) == 3 and len(cmds) == 4
    for k, step in enumerate(steps[:2]):
        spin, add = cmds[2 * k], cmds[2 * k + 1]
        if mode == "projected":
            assert (step.dev_start, step.dev_end) == (spin.dev_start, add.dev_end)
        else:
            assert step.dev_start <= spin.dev_start and step.dev_end >= add.dev_end
    if mode == "projected":
        assert steps[2].dev_start is None and steps[2].source == "host"
