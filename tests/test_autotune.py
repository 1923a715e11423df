"""The autotuner on real OpenCL (PoCL here): candidates, failures, structure, persistence, spans, CLI."""
from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
import textwrap
from typing import Any

import numpy as np
import pyopencl as cl
import pytest

import cltrace
from cltrace.record.regions import category_region
from cltrace.programs import tunedb
from cltrace.tune import AutotuneResult, Autotuner, Config, DeviceLimits, KernelTemplate, Trial, autotune
from cltrace.programs.compiler import device_key
from cltrace.tune.kernels.matmul import MATMUL, MatmulProblem
from cltrace.tune.result import preferred
from cltrace.read import load

TILES = [(1, 1), (4, 2), (8, 1)]


@pytest.fixture(autouse=True)
def cache_dir(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each test gets its own program cache and tune DB."""
    d = str(tmp_path / "cache")
    monkeypatch.setenv("CLTRACE_CACHE_DIR", d)
    return d


@pytest.fixture
def tuner(queue: Any) -> Autotuner:
    return Autotuner(queue, n_warmup=1, n=3, progress=False, cutoff=None)


@pytest.fixture
def problem(queue: Any) -> MatmulProblem:
    return MatmulProblem(queue, 24, 40, 20)


def _check(problem: MatmulProblem) -> dict[str, Any]:
    return {"output": problem.c, "reference": problem.reference}


# ---- candidates ------------------------------------------------------------------------

def test_generated_candidates_respect_the_device_limits(tuner: Autotuner, queue: Any) -> None:
    dev = queue.device
    sp = tuner.space(MATMUL)
    lim = tuner.limits_for(MATMUL)
    assert sp["workgroup"][0] is None and len(sp["workgroup"]) > 1
    for wg in sp["workgroup"][1:]:
        assert len(wg) == 2
        assert math.prod(wg) <= min(dev.max_work_group_size, lim.kernel_work_group_size)
        assert all(w <= m for w, m in zip(wg, dev.max_work_item_sizes))
        assert math.prod(wg) % lim.preferred_multiple == 0
    assert lim.preferred_multiple == cl.Kernel(MATMUL.compile(MATMUL.default, context=queue.context,
                                                              device=dev).program, "matmul").get_work_group_info(
        cl.kernel_work_group_info.PREFERRED_WORK_GROUP_SIZE_MULTIPLE, dev)
    widest = max(4, dev.preferred_vector_width_float)
    assert {t[0] for t in sp["tile"]} == {w for w in (1, 2, 4, 8, 16) if w <= widest}
    assert sp["unroll"] and all(16 % u == 0 for u in sp["unroll"])
    grid = tuner.candidates(MATMUL)
    assert len(grid) == len(sp["workgroup"]) * len(sp["tile"]) * len(sp["unroll"])
    assert len(set(grid)) == len(grid)


def test_candidates_follow_small_limits() -> None:
    small = DeviceLimits("fake|dev|1", "dev", max_work_group_size=64, max_work_item_sizes=(2, 64, 1),
                         local_mem_size=1024, preferred_vector_width=1, preferred_multiple=8)
    # 8 and 32 work-items (x at most 2), 128 is over the maximum.
    assert small.workgroup_candidates(2) == [None, (2, 4), (2, 16)]
    assert small.tile_candidates(2)[:3] == [(1, 1), (1, 2), (1, 4)]
    assert max(t[0] for t in small.tile_candidates(2)) == 4
    args = (np.int32(64), np.int32(64), np.int32(64), None, None, None)
    # local memory over the device's: the staged variant of a 2x16 group with 4x4 tiles needs 4*16*(64+8) B.
    reason = MATMUL.fit(args, Config((2, 16), (4, 4), 1), small)
    assert reason and "local memory" in reason and "1024" in reason
    assert "max_work_group_size" in MATMUL.fit(args, Config((16, 8), (1, 1), 1), small)
    assert "max_work_item_sizes[0]" in MATMUL.fit(args, Config((4, 2), (1, 1), 1), small)
    assert "does not divide TILE_K" in MATMUL.fit(args, Config((2, 4), (1, 1), 3), small)
    assert MATMUL.fit(args, Config(None, (4, 4), 3), small) is None


def test_callable_space_generates_workgroups_only(tuner: Autotuner) -> None:
    sp = tuner.space(lambda config, *a: None)
    assert sp["tile"] == [None] and sp["unroll"] == [None]
    assert sp["workgroup"] == tuner.limits.workgroup_candidates(2)


# ---- failures ----------------------------------------------------------------------------

def test_failed_trials_are_recorded_and_the_sweep_goes_on(tuner: Autotuner, problem: MatmulProblem) -> None:
    res = tuner.tune(MATMUL, problem.args, workgroup_sizes=[None, (4096, 2)], tile_sizes=[(3, 1), (4, 2)],
                     unroll_factors=[1], baseline=False, persist=False, **_check(problem))
    by = {(t.config.workgroup, t.config.tile): t for t in res.measurements}
    assert len(res.measurements) == 4
    bad_build = by[(None, (3, 1))]
    assert (bad_build.status, bad_build.stage) == ("failed", "build")
    assert "TILE_X must be 1, 2, 4, 8 or 16" in bad_build.reason
    for tile in [(3, 1), (4, 2)]:
        big = by[((4096, 2), tile)]
        assert (big.status, big.stage) == ("failed", "limits")
        assert "exceeds max_work_group_size" in big.reason
    ok = by[(None, (4, 2))]
    assert ok.ok and len(ok.times_ns) == 3 and all(t > 0 for t in ok.times_ns)
    # the only candidate that ran is confirmed against the default, which it must clearly beat
    assert res.best_config == (ok.config if res.real_win else MATMUL.default)
    assert [t.config for t in res.failures()] == [c for c in (t.config for t in res.measurements) if c != ok.config]


def _vector_add(ctx: Any) -> Any:
    return cl.Program(ctx, """
        __kernel void add(__global const float *a, __global const float *b, __global float *c, const int bug) {
            int i = get_global_id(0);
            c[i] = a[i] + b[i] + (float)bug;
        }""").build().add


def test_launch_failures_and_wrong_results_fail_their_trial(tuner: Autotuner, queue: Any) -> None:
    n = 10
    knl = _vector_add(queue.context)
    mf = cl.mem_flags
    a_h = np.arange(n, dtype=np.float32)
    a = cl.Buffer(queue.context, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=a_h)
    c = cl.Buffer(queue.context, mf.READ_WRITE, 4 * n)

    def run(config: Config, a: Any, c: Any) -> Any:
        bug = np.int32(1 if config.unroll == 2 else 0)  # this "variant" computes the wrong thing
        return knl(queue, (n,), config.workgroup, a, a, c, bug)

    res = tuner.tune(run, (a, c), workgroup_sizes=[(4,), None], unroll_factors=[1, 2],
                     output=c, reference=2 * a_h)
    st = {(t.config.workgroup, t.config.unroll): (t.status, t.stage) for t in res.measurements}
    # 10 work-items do not split into groups of 4: the driver refuses the launch.
    assert st[((4,), 1)] == st[((4,), 2)] == ("failed", "launch")
    assert "INVALID_WORK_GROUP_SIZE" in res.measurements[0].reason
    assert st[(None, 1)] == ("ok", None)
    assert st[(None, 2)] == ("failed", "check")
    wrong = res.trial(Config(None, None, 2))
    assert "wrong result" in wrong.reason and len(wrong.times_ns) == 3
    assert res.best_config == Config(None, None, 1)
    assert res.persisted is None  # callables are not persisted


def test_cutoff_stops_a_slow_trial_after_one_timed_run(queue: Any, kernels: Any) -> None:
    def spin(config: Config) -> Any:
        return kernels.launch_spin(queue, iters=20 if config.unroll == 1 else 20_000)

    res = Autotuner(queue, n_warmup=1, n=5, progress=False, cutoff=4.0).tune(spin, (), [None], unroll_factors=[1, 2])
    fast, slow = res.measurements
    assert fast.ok and len(fast.times_ns) == 5
    assert slow.ok and len(slow.times_ns) == 1 and slow.mean_ns > 4 * fast.mean_ns
    full = Autotuner(queue, n_warmup=1, n=5, progress=False, cutoff=None).tune(spin, (), [None], unroll_factors=[1, 2])
    assert [len(t.times_ns) for t in full.measurements] == [5, 5]


FILL = """
#ifndef TILE_X
#define TILE_X 1
#endif
__kernel void fill(__global float *x, const int n) {
    const int i = get_global_id(0);
    for (int t = 0; t < TILE_X; ++t) {
        const int j = i * TILE_X + t;
        if (j < n) x[j] = (float)j;
    }
}
"""


def test_a_custom_1d_template(tuner: Autotuner, queue: Any) -> None:
    import pyopencl.array as cla

    fill = KernelTemplate("fill", FILL, lambda args, c: (math.ceil(int(args[1]) / c.tile[0]),), dims=1,
                          default=Config(None, (1,), None))
    x = cla.empty(queue, 12, np.float32)
    res = tuner.tune(fill, (x.data, np.int32(12)), [None, (4,), (5,)], [(1,), (2,), (3,)], [None],
                     output=x, persist=False)  # no reference: the first successful trial's output is it
    st = {(t.config.workgroup, t.config.tile): t for t in res.measurements}
    assert len(st) == 9 and res.baseline == Config(None, (1,), None)
    assert "not divisible" in st[((4,), (2,))].reason and st[((4,), (2,))].stage == "limits"
    assert "not divisible" in st[((5,), (1,))].reason
    for ok in [(None, (1,)), (None, (2,)), (None, (3,)), ((4,), (1,)), ((4,), (3,))]:
        assert st[ok].ok, st[ok]
    assert np.array_equal(x.get(), np.arange(12, dtype=np.float32))


def test_progress_bar_on_request(tuner: Autotuner, problem: MatmulProblem,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    tuner.tune(MATMUL, problem.args, [None], [(4, 2)], [1], persist=False, progress=True)
    assert "autotune matmul" in capsys.readouterr().err
    tuner.tune(MATMUL, problem.args, [None], [(1, 1), (4, 2)], [1, 2], strategy="coordinate", persist=False,
               progress=True)
    assert "0/3" in capsys.readouterr().err  # the bar knows how many trials a coordinate pass runs
    tuner.tune(MATMUL, problem.args, [None], [(4, 2)], [1], persist=False)  # stderr is not a terminal
    assert "autotune matmul" not in capsys.readouterr().err


def test_region_categories_are_checked() -> None:
    cltrace.start()
    with pytest.raises(ValueError, match="cat must be one of"):
        category_region("x", None, None, "kernel")


def test_a_callable_must_return_events(tuner: Autotuner) -> None:
    with pytest.raises(TypeError, match="cl.Event"):
        tuner.tune(lambda config: 42, (), workgroup_sizes=[None])
    with pytest.raises(TypeError, match="KernelTemplate or a callable"):
        tuner.tune("matmul", ())


# ---- structure -------------------------------------------------------------------------------

def test_grid_result_is_deterministic_in_structure_and_frozen(tuner: Autotuner, problem: MatmulProblem) -> None:
    kw = dict(workgroup_sizes=[None], tile_sizes=TILES, unroll_factors=[1, 2], persist=False, **_check(problem))
    r1 = tuner.tune(MATMUL, problem.args, **kw)
    r2 = tuner.tune(MATMUL, problem.args, **kw)
    configs = [t.config for t in r1.measurements]
    assert configs == [t.config for t in r2.measurements]
    assert configs == [Config(None, t, u) for t in TILES for u in (1, 2)]
    assert configs[0] == MATMUL.default == r1.baseline  # the baseline is part of the grid here
    assert all(t.ok for t in r1.measurements)
    ranked = r1.ranked()
    assert [t.median_ns for t in ranked] == sorted(t.median_ns for t in r1.measurements)
    conf = r1.confirmation  # the five most preferred and the default, re-measured in interleaved rounds
    order = {c: i for i, c in enumerate(configs)}
    top = [t.config for t in preferred([t for t in ranked if t.config != MATMUL.default], order, 0.05)][:5]
    assert [t.config for t in conf.trials] == top + [MATMUL.default]
    assert all(len(t.times_ns) == conf.rounds * conf.runs for t in conf.trials)
    assert r1.best_config in [t.config for t in conf.trials]
    for obj, attr in ((r1, "best_config"), (r1.measurements[0], "mean_ns"), (r1.best_config, "tile")):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(obj, attr, None)
    assert isinstance(r1.measurements, tuple)
    t = r1.measurements[0]
    assert t.mean_ns == pytest.approx(sum(t.times_ns) / len(t.times_ns))
    assert t.std_ns == pytest.approx(float(np.std(t.times_ns, ddof=1)))
    assert (t.p10_ns, t.median_ns, t.p90_ns) == pytest.approx(tuple(np.percentile(t.times_ns, [10, 50, 90])))
    assert dict(r1.best_config) == {"workgroup": None, "tile": r1.best_config.tile, "unroll": r1.best_config.unroll}
    json.dumps(r1.as_dict())


def test_staged_variants_are_right_on_ragged_sizes(tuner: Autotuner, problem: MatmulProblem) -> None:
    # N=40 is not a multiple of the 16-column block of the 4x4 tiles, K=20 not of TILE_K=16.
    res = tuner.tune(MATMUL, problem.args, [(4, 2)], [(4, 4), (1, 3)], [4], baseline=False,
                     persist=False, **_check(problem))
    assert [t.status for t in res.measurements] == ["ok"] * 2, res.table()


def test_baseline_is_added_when_not_in_the_grid(tuner: Autotuner, problem: MatmulProblem) -> None:
    res = tuner.tune(MATMUL, problem.args, [None], [(4, 2)], [1], persist=False, **_check(problem))
    assert [t.config for t in res.measurements] == [MATMUL.default, Config(None, (4, 2), 1)]
    conf = res.confirmation  # the speed-up comes from the interleaved rounds, medians over medians
    assert res.speedup() == pytest.approx(conf.trial(MATMUL.default).median_ns
                                          / conf.trial(res.best_config).median_ns)


def test_coordinate_search_moves_one_parameter_at_a_time(tuner: Autotuner, problem: MatmulProblem) -> None:
    res = tuner.tune(MATMUL, problem.args, [None], TILES, [1, 2], strategy="coordinate", persist=False,
                     **_check(problem))
    configs = [t.config for t in res.measurements]
    assert configs[0] == MATMUL.default
    assert len(configs) == len(set(configs)) == 4  # 3 tiles, then the 2nd unroll factor
    assert [c.unroll for c in configs[:3]] == [1, 1, 1]
    assert configs[3].unroll == 2
    order = {c: i for i, c in enumerate(tuner.candidates(MATMUL, [None], TILES, [1, 2]))}
    best_tile = preferred(res.measurements[:3], order)[0].config.tile  # within noise of the fastest: sweep order
    assert configs[3].tile == best_tile


def test_table_lists_ranked_and_failed_trials(tuner: Autotuner, problem: MatmulProblem) -> None:
    res = tuner.tune(MATMUL, problem.args, [None], [(1, 1), (4, 2), (5, 1)], [1], persist=False,
                     **_check(problem))
    text = res.table()
    lines = text.splitlines()
    assert "2 ok, 1 failed" in lines[0] and "shape=24x40x20" in lines[0]
    assert "GFLOP/s" in lines[1] and "vs base" in lines[1]
    ranked = [ln for ln in lines if ln.strip()[:1].isdigit()]
    assert len(ranked) == 2 and "median" in lines[1] and "p10" in lines[1] and "p90" in lines[1]
    assert any(ln.endswith("<- default") for ln in ranked)
    if res.real_win:
        assert any(ln.endswith("<- winner") and "4x2" in ln for ln in ranked)
    assert "confirmation: 5 interleaved rounds x 3 launches" in text
    assert res.verdict and res.verdict in text
    assert "failed:" in text and "[build]" in text and "tile=5x1" in text


def test_plot_writes_an_image(tuner: Autotuner, problem: MatmulProblem, tmp_path: Any) -> None:
    pytest.importorskip("matplotlib")
    res = tuner.tune(MATMUL, problem.args, [None], [(1, 1), (4, 2)], [1], persist=False)
    path = res.plot(str(tmp_path / "sweep.png"))
    with open(path, "rb") as fh:
        assert fh.read(8) == b"\x89PNG\r\n\x1a\n"


def test_plot_without_matplotlib_says_how_to_get_it(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    res = AutotuneResult(Config(None, (1, 1), 1), (Trial.measured(Config(None, (1, 1), 1), [5, 7]),), "k", "dev")
    with pytest.raises(ImportError, match=r"cltrace\[plot\]"):
        res.plot(str(tmp_path / "x.png"))


# ---- persistence -----------------------------------------------------------------------------

TUNE_SCRIPT = """
import json, cltrace
from cltrace.tune.kernels.matmul import MATMUL, MatmulProblem
q = cltrace.profiling_queue()
p = MatmulProblem(q, 24, 40, 20)
r = cltrace.autotune(MATMUL, p.args, [None], [(1, 1), (8, 4)], [1], n_warmup=1, n=2, queue=q,
                     output=p.c, reference=p.reference, progress=False)
print(json.dumps({"best": r.best_config.as_dict(), "path": r.persisted}))
"""

USE_SCRIPT = """
import json, numpy as np, cltrace
from cltrace.tune.kernels.matmul import MATMUL, MatmulProblem
q = cltrace.profiling_queue()
p = MatmulProblem(q, 24, 40, 20)
prg = MATMUL.compile(context=q.context, args=p.args)
MATMUL.launch(prg, q, p.args).wait()
print(json.dumps({"tuned": prg.tuned, "options": prg.options, "right": bool(np.array_equal(p.result(), p.reference))}))
"""


def _py(script: str, env: dict[str, str]) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_winner_is_applied_in_another_process(cache_dir: str) -> None:
    env = {**os.environ, "CLTRACE_CACHE_DIR": cache_dir}
    env.pop("CLTRACE", None)
    tuned = _py(TUNE_SCRIPT, env)
    best = Config.from_dict(tuned["best"])
    assert tuned["path"] and os.path.exists(tuned["path"])
    used = _py(USE_SCRIPT, env)
    assert used["tuned"]["params"] == best.as_dict()
    assert used["tuned"]["defines"] == {"TILE_X": best.tile[0], "TILE_Y": best.tile[1], "UNROLL": best.unroll}
    assert f"-DTILE_X={best.tile[0]}" in used["options"]
    assert used["right"]


def test_another_device_key_does_not_see_the_winner(queue: Any, cache_dir: str) -> None:
    key = device_key(queue.device)
    platform, name, driver = key.split("|")
    other = f"{platform}|{name}|{driver}-other"
    cfg = {"defines": {"TILE_X": 4, "TILE_Y": 2, "UNROLL": 1}, "local_size": None,
           "params": Config(None, (4, 2), 1).as_dict(), "kernel": "matmul"}
    tunedb.store(MATMUL.source_hash, MATMUL.options, other, cfg)
    assert tunedb.lookup(MATMUL.source_hash, MATMUL.options, other) == cfg
    assert tunedb.lookup(MATMUL.source_hash, MATMUL.options, key) is None
    prg = cltrace.compile(MATMUL.source, MATMUL.options, context=queue.context)
    assert prg.tuned is None and not any(o.startswith("-DTILE_X") for o in prg.options)
    assert MATMUL.config_of(prg) == MATMUL.default
    assert Autotuner(queue, progress=False).best(MATMUL) is None
    # The same entry under this device's own key is applied.
    tunedb.store(MATMUL.source_hash, MATMUL.options, key, cfg)
    prg = cltrace.compile(MATMUL.source, MATMUL.options, context=queue.context)
    assert prg.tuned == cfg and "-DTILE_X=4" in prg.options


def test_best_is_remembered_and_read_back_from_the_tune_db(queue: Any, problem: MatmulProblem) -> None:
    first = Autotuner(queue, n_warmup=1, n=2, progress=False)
    assert first.best(MATMUL) is None
    res = first.tune(MATMUL, problem.args, [None], [(1, 1), (4, 2)], [1], **_check(problem))
    shape = (24, 40, 20)
    assert res.shape_key == shape
    assert first.best(MATMUL, shape) == first.best(MATMUL) == res.best_config
    assert first.result(MATMUL, shape) is res
    again = first.measure(MATMUL, problem.args, res.best_config, **_check(problem))
    assert again.ok and again.config == res.best_config and len(again.times_ns) == 2
    second = Autotuner(queue, progress=False)  # a fresh tuner: only the tune DB knows, and only a real win
    stored = res.best_config if res.real_win else None
    assert (res.persisted is not None) == bool(res.real_win)
    assert second.best(MATMUL, shape) == stored
    assert second.best(MATMUL) == stored
    assert second.best(MATMUL, (1, 2, 3)) is None


# ---- spans ---------------------------------------------------------------------------------------

def test_trials_are_spans_with_their_compile_and_launch_spans(tuner: Autotuner, problem: MatmulProblem,
                                                              tmp_path: Any, chrome: Any) -> None:
    path = str(tmp_path / "tune.json")
    with cltrace.trace(path):
        res = tuner.tune(MATMUL, problem.args, [None], [(4, 2), (3, 1)], [1], persist=False, **_check(problem))
    spans, _ = load(path)
    by_id = {s.id: s for s in spans}
    tops = [s for s in spans if s.cat == "autotune"]
    assert len(tops) == 1 and tops[0].name == "autotune matmul" and tops[0].source == "device"
    trials = [s for s in spans if s.cat == "trial"]
    assert [s.name for s in sorted(trials, key=lambda s: s.host_begin)] == [
        f"trial {t.config.label()}" for t in res.measurements]
    assert all(s.parent == tops[0].id for s in trials)
    for s in trials:
        kids = [c for c in spans if c.parent == s.id]
        compiles = [c for c in kids if c.cat == "compile"]
        assert len(compiles) == 1
        if "tile=3x1" in s.name:
            assert compiles[0].status == "error"
            assert not [c for c in kids if c.cat == "kernel"]
            builds = [c for c in spans if c.parent == compiles[0].id and c.cat == "build"]
            assert builds and builds[0].status == "error"
        else:
            launches = [c for c in kids if c.cat == "kernel"]
            assert len(launches) == 1 + 3 and all(c.source == "device" and c.name == "matmul" for c in launches)
    tr = chrome.read(path)
    trial_args = [e["args"] for e in tr.slices if e["cat"] == "trial" and e["pid"] == tr.host_pid]
    assert {a["status"] for a in trial_args} == {"ok", "failed"}
    assert all("tile" in a and "unroll" in a and "workgroup" in a for a in trial_args)
    assert not tr.misnested()
    assert not tr.children_outside_parents()
    assert by_id[trials[0].parent].path == ("autotune matmul",)


def test_tracing_off_records_nothing(tuner: Autotuner, problem: MatmulProblem) -> None:
    from cltrace.record.recorder import RECORDER

    tuner.tune(MATMUL, problem.args, [None], [(4, 2)], [1], persist=False)
    assert RECORDER.spans() == []


# ---- the one-shot function and the CLI --------------------------------------------------------------

def test_autotune_function_matches_the_seed_signature(queue: Any, problem: MatmulProblem) -> None:
    res = autotune(MATMUL, problem.args, workgroup_sizes=[None], tile_sizes=[(4, 2)], unroll_factors=[1],
                   n_warmup=1, n=2, queue=queue, progress=False, persist=False)
    assert res.best_config is not None and len(res.measurements) == 2
    assert all(len(t.times_ns) == 2 for t in res.measurements)


COMPAT_SCRIPT = """
import json, pkgutil, importlib
import cltrace, cltrace.tune as tuning
for m in pkgutil.walk_packages(cltrace.__path__, "cltrace."):
    if not m.name.startswith(("cltrace.export.otlp", "cltrace.__main__")):
        importlib.import_module(m.name)
print(json.dumps({"function": cltrace.autotune is tuning.autotune,
                  "names": [n for n in ("Autotuner", "AutotuneResult", "Config", "KernelTemplate", "Trial")
                            if getattr(cltrace, n) is getattr(tuning, n)]}))
"""


def test_cltrace_autotune_stays_the_function_whatever_is_imported() -> None:
    got = _py(COMPAT_SCRIPT, dict(os.environ))
    assert got["function"], "cltrace.autotune is no longer the autotune function"
    assert got["names"] == ["Autotuner", "AutotuneResult", "Config", "KernelTemplate", "Trial"]


@pytest.mark.timing
def test_cli_tune(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    from cltrace.cli.commands import main

    trace_path, json_path = str(tmp_path / "t.json"), str(tmp_path / "r.json")
    rc = main(["tune", "--size", "40x24x20", "--workgroups", "auto", "--tiles", "1x1,4x2,8x4", "--unroll", "1",
               "--runs", "2", "--warmup", "1", "--out", trace_path, "--json", json_path, "--no-progress"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "untuned default  wg=auto tile=1x1 unroll=1" in out
    assert "tuned best" in out and "GFLOP/s" in out and "winner stored:" in out
    with open(json_path) as fh:
        doc = json.load(fh)
    assert len(doc["measurements"]) == 3 and doc["best_config"] is not None
    spans, _ = load(trace_path)
    assert sum(s.cat == "trial" for s in spans) == 3


def test_cli_rejects_bad_sizes() -> None:
    from cltrace.cli.commands import main

    with pytest.raises(SystemExit):
        main(["tune", "--size", "0x4"])
