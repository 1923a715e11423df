"""Winners a noisy run cannot overturn: medians with p10/p90, interleaved confirmation rounds
with the untuned default, only a real win stored with its figures, verify/--check evicting, the plot."""
from __future__ import annotations

import json
import os
from typing import Any

import numpy as np
import pyopencl as cl
import pytest

from cltrace.programs import tunedb
from cltrace.tune import AutotuneResult, Autotuner, Config, KernelTemplate, Trial
from cltrace.tune.confirm import decide
from cltrace.tune.kernels.matmul import MATMUL
from cltrace.tune.result import preferred

SPIN_SOURCE = """
#ifndef WORK
#define WORK 16
#endif
__kernel void spin(__global float *a, const int iters) {
    const int i = get_global_id(0);
    float x = a[i];
    for (int k = 0; k < iters * WORK; ++k) x = x * 0.999f + 0.5f;
    a[i] = x;
}
"""


def spin_template(works: dict[int, int]) -> KernelTemplate:
    """A kernel whose speed each config fixes exactly: ``unroll`` u does ``works[u]`` units of work
    (the default, unroll 1, does ``works[1]``). Equal work means equal speed: a tie only noise can split."""
    return KernelTemplate("spin", SPIN_SOURCE, lambda args, c: (64,), dims=1, default=Config(None, None, 1),
                          defines=lambda c: {"WORK": works[c.unroll]})


@pytest.fixture(autouse=True)
def cache_dir(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> str:
    d = str(tmp_path / "cache")
    monkeypatch.setenv("CLTRACE_CACHE_DIR", d)
    return d


@pytest.fixture
def spin_args(queue: Any) -> tuple:
    buf = cl.Buffer(queue.context, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR,
                    hostbuf=np.ones(64, np.float32))
    return (buf, np.int32(1000))


def _tuner(queue: Any, **kw: Any) -> Autotuner:
    return Autotuner(queue, n_warmup=1, n=5, progress=False, cutoff=None, **kw)


def _m(config: Config, times: list[int]) -> Trial:
    return Trial.measured(config, times)


A, B, C, D = (Config(None, None, u) for u in (1, 2, 3, 4))


# ---- statistics and the decision (pure) ---------------------------------------------------------

def test_trials_rank_by_median_and_report_p10_p90() -> None:
    # B has the lower mean (one slow outlier in A), A the lower median: the median decides.
    a, b = _m(A, [10, 10, 10, 10, 200]), _m(B, [20, 20, 20, 20, 20])
    assert a.mean_ns > b.mean_ns and a.median_ns < b.median_ns
    assert (a.p10_ns, a.median_ns, a.p90_ns) == pytest.approx(tuple(np.percentile(a.times_ns, [10, 50, 90])))
    res = AutotuneResult(None, (b, a), "k", "dev")
    assert [t.config for t in res.ranked()] == [A, B]


def test_candidates_within_noise_are_decided_by_sweep_order_not_by_luck() -> None:
    order = {B: 0, C: 1, D: 2}
    default = _m(A, [100, 101, 102, 103, 104])
    for noise in range(6):  # whichever of the overlapping B, C gets the lucky median, B is chosen
        b = _m(B, [10 + noise, 12, 14, 16, 18])
        c = _m(C, [9, 11, 13, 15, 13 - noise])
        d = _m(D, [30, 31, 32, 33, 34])  # clearly slower than the fastest: never chosen
        assert [t.config for t in preferred([d, c, b], order)] == [B, C, D]
        winner, real, verdict = decide([c, d, b, default], A, order)
        assert (winner, real) == (B, True) and "2 within noise" in verdict and "below its p10" in verdict


def test_a_burst_on_the_sweep_order_first_does_not_hand_the_win_to_another() -> None:
    # B (first in sweep order) and C are within noise; one round of B had a burst of load (its p90
    # is above the default's p10), yet B still wins 4 of 5 rounds: B is chosen, never C.
    default = _m(A, [100, 100, 101, 101, 102, 102, 103, 103, 104, 104])
    b = _m(B, [10, 10, 11, 11, 12, 12, 13, 13, 300, 300])
    c = _m(C, [10, 10, 10, 10, 11, 11, 11, 11, 12, 12])
    winner, real, verdict = decide([b, c, default], A, {B: 0, C: 1}, 0.05, runs=2)
    assert (winner, real) == (B, True) and "won 4 of 5 rounds" in verdict
    # bursts in 2 of 5 rounds: not clearly a win, so the default is kept (not C)
    b2 = _m(B, [10, 10, 11, 11, 12, 12, 300, 300, 300, 300])
    winner, real, verdict = decide([b2, c, default], A, {B: 0, C: 1}, 0.05, runs=2)
    assert (winner, real) == (A, False) and "fewer than 4 of 5 rounds" in verdict


def test_no_real_win_keeps_the_default() -> None:
    default = _m(A, [10, 11, 12, 13, 14])
    b = _m(B, [9, 10, 11, 12, 13])  # faster median, but its p90 is not below the default's p10
    winner, real, verdict = decide([b, default], A, {B: 0})
    assert (winner, real) == (A, False) and verdict.startswith("no real win")
    winner, real, _ = decide([_m(B, [4, 5, 5, 6, 6]), default], A, {B: 0})
    assert (winner, real) == (B, True)


# ---- on the device ----------------------------------------------------------------------------------

def test_near_equal_candidates_give_the_same_winner_every_run(queue: Any, spin_args: tuple) -> None:
    spin = spin_template({1: 16, 2: 2, 3: 2, 4: 2, 5: 2})  # four equal candidates, 8x faster than the default
    stored = []
    for _ in range(3):
        res = _tuner(queue).tune(spin, spin_args, [None], [None], unroll_factors=[2, 3, 4, 5])
        assert res.real_win and res.confirmation is not None and res.persisted
        with open(res.persisted) as fh:
            stored.append(json.load(fh)["config"]["params"]["unroll"])
    assert len(set(stored)) == 1, f"three runs stored {stored}"


def test_only_a_real_win_is_stored_and_no_win_removes_the_old_one(queue: Any, spin_args: tuple) -> None:
    fast = spin_template({1: 16, 2: 1})
    res = _tuner(queue).tune(fast, spin_args, [None], [None], unroll_factors=[2])
    assert res.real_win is True and res.best_config == Config(None, None, 2) and res.persisted
    with open(res.persisted) as fh:
        doc = json.load(fh)
    fig = doc["config"]["figures"]
    conf = res.confirmation
    assert fig["rounds"] == conf.rounds == 5 and fig["runs"] == conf.rounds * conf.runs
    assert fig["p10_ns"] <= fig["median_ns"] <= fig["p90_ns"] < fig["default"]["p10_ns"]
    assert fig["speedup"] == pytest.approx(res.speedup()) and res.speedup() > 2
    assert "winner: wg=auto unroll=2" in res.table() and "beats the default" in res.table()

    # the same source, now with every candidate as slow as the default: no real win, the default stays
    same = spin_template({1: 16, 2: 16, 3: 16})
    res2 = _tuner(queue).tune(same, spin_args, [None], [None], unroll_factors=[2, 3])
    assert res2.real_win is False and res2.best_config == same.default and res2.winner is None
    assert res2.persisted is None and res2.evicted == res.persisted and not os.path.exists(res.persisted)
    assert res2.verdict.startswith("no real win") and res2.speedup() == 1.0
    assert Autotuner(queue, progress=False).best(same, res2.shape_key) is None


def test_verify_keeps_a_winner_and_evicts_one_that_no_longer_wins(queue: Any, spin_args: tuple) -> None:
    spin = spin_template({1: 16, 2: 1, 9: 64})
    tuner = _tuner(queue)
    res = tuner.tune(spin, spin_args, [None], [None], unroll_factors=[2])
    ver = tuner.verify(spin, spin_args)
    assert ver.kept and not ver.evicted and ver.config == Config(None, None, 2) and os.path.exists(res.persisted)
    assert "won" in ver.table() and "stored winner" in ver.table()
    # a stored "winner" that does 4x the default's work (the machine changed, say): evicted
    sig = spin.signature(spin_args)
    tunedb.store(spin.source_hash, spin.options, tuner.limits.device_key,
                 {"defines": {"WORK": 64}, "local_size": None, "params": Config(None, None, 9).as_dict(),
                  "kernel": "spin"}, signature=sig)
    ver = tuner.verify(spin, spin_args)
    assert ver.evicted and not ver.kept and ver.verdict.startswith("evicted")
    assert tunedb.lookup(spin.source_hash, spin.options, tuner.limits.device_key, signature=sig) is None
    assert tuner.verify(spin, spin_args).path is None  # nothing left to check


def test_cli_check_evicts_a_winner_that_no_longer_builds(capsys: pytest.CaptureFixture[str], queue: Any) -> None:
    from cltrace.cli.commands import main
    from cltrace.programs.compiler import device_key

    assert main(["tune", "--check", "--size", "24x40x20", "--rounds", "2"]) == 1
    assert "no winner stored for matmul 24x40x20" in capsys.readouterr().out
    tunedb.store(MATMUL.source_hash, MATMUL.options, device_key(queue.device),
                 {"defines": {"TILE_X": 3, "TILE_Y": 1, "UNROLL": 1}, "local_size": None,
                  "params": Config(None, (3, 1), 1).as_dict(), "kernel": "matmul"}, signature=(24, 40, 20))
    assert main(["tune", "--check", "--size", "24x40x20", "--rounds", "2"]) == 1
    out = capsys.readouterr().out
    assert "evicted" in out and "no longer runs" in out and "TILE_X must be" in out
    assert tunedb.lookup(MATMUL.source_hash, MATMUL.options, device_key(queue.device), signature=(24, 40, 20)) is None


def test_cli_prints_the_figures_and_the_verdict(capsys: pytest.CaptureFixture[str]) -> None:
    from cltrace.cli.commands import main

    rc = main(["tune", "--size", "24x40x20", "--workgroups", "auto", "--tiles", "1x1,8x4", "--unroll", "1",
               "--runs", "3", "--rounds", "3", "--no-progress"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "confirmation: 3 interleaved rounds x 3 launches" in out
    assert "p10-p90" in out and "median" in out
    assert ("winner stored:" in out) != ("tuned best       none" in out)


def test_plot_shows_the_winner_first_with_its_rounds_the_noise_band_and_names_the_device(
        queue: Any, spin_args: tuple) -> None:
    pytest.importorskip("matplotlib")
    from cltrace.tune.chart import NOISE_BAND

    spin = spin_template({1: 16, 2: 1, 3: 4})
    tuner = _tuner(queue)
    res = tuner.tune(spin, spin_args, [None], [None], unroll_factors=[2, 3], persist=False)
    assert res.winner == B  # 1 unit of work against 4 and 16
    fig = res.figure()
    import matplotlib.pyplot as plt

    try:
        ax = fig.axes[0]
        title = ax.get_title()
        assert tuner.limits.device_name in title and tuner.limits.device_key not in title
        labels = [t.get_text() for t in ax.get_yticklabels()]
        assert labels[0] == "wg=auto unroll=2 (winner)" and "wg=auto unroll=1 (default)" in labels
        notes = [t.get_text() for t in ax.texts if hasattr(t, "xy")]
        assert len(notes) == len(labels) and notes[0].startswith("WINNER")
        band = next(p for p in ax.patches if p.get_gid() == NOISE_BAND)
        fastest = min((t for t in res.confirmation.trials if t.config != A), key=lambda t: t.median_ns)
        assert band.get_x() == pytest.approx(fastest.p10_ns / 1e6)
        # the winner's rounds line spans its confirmation p10-p90, in ms (no flops given)
        w = res.confirmation.trial(B)
        spans = [seg for c in ax.collections for seg in c.get_segments()]
        assert any(seg[0][0] == pytest.approx(w.p10_ns / 1e6) and seg[1][0] == pytest.approx(w.p90_ns / 1e6)
                   for seg in spans)
    finally:
        plt.close(fig)
