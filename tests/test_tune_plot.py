"""The autotune plot tells how the winner was chosen: the winner first and labelled,
each trial's sweep and round spread, the noise band, 'within noise' / 'not confirmed' / 'sweep only' notes."""
from __future__ import annotations

from typing import Any

import pytest

from cltrace.tune import AutotuneResult, Config, Trial
from cltrace.tune.chart import DEFAULT_P10, NOISE_BAND, NOT_CONFIRMED, SWEEP_ONLY, WINNER, WITHIN_NOISE, roles
from cltrace.tune.confirm import decide
from cltrace.tune.result import Confirmation

plt = pytest.importorskip("matplotlib.pyplot")

A, B, C, D, E, F = (Config(None, None, u) for u in (1, 2, 3, 4, 5, 6))
RUNS, ROUNDS = 3, 5


def _rounds(*per_round: int) -> list[int]:
    """Times in round order: each round's three launches spread +-1 around its value."""
    return [v + d for v in per_round for d in (-1, 0, 1)]


def _result(default_rounds: tuple[int, ...] = (100, 101, 99, 102, 100)) -> AutotuneResult:
    # The sweep: B looked fastest (10), then F (11, within noise of B but last in sweep order: not re-measured),
    # C (12), D (13), E (30, not re-measured), default A (100).
    sweep = (Trial.measured(A, [99, 100, 101, 102, 98]), Trial.measured(C, [11, 12, 13, 12, 12]),
             Trial.measured(D, [12, 13, 14, 13, 13]), Trial.measured(B, [9, 10, 11, 10, 10]),
             Trial.measured(E, [29, 30, 31, 30, 30]), Trial.measured(F, [10, 11, 11, 11, 12]))
    order = {A: 0, C: 1, D: 2, B: 3, E: 4, F: 5}
    # The rounds: B was only lucky (20), D is the fastest (11), C within noise of it (12), C first in order.
    trials = (Trial.measured(C, _rounds(12, 12, 13, 12, 12)), Trial.measured(D, _rounds(11, 11, 12, 11, 11)),
              Trial.measured(B, _rounds(20, 21, 20, 20, 22)), Trial.measured(A, _rounds(*default_rounds)))
    winner, real_win, verdict = decide(trials, A, order, 0.05, RUNS)
    conf = Confirmation(trials, (2, 3, 0, 0), ROUNDS, RUNS, A, winner, real_win, verdict)
    return AutotuneResult(winner, sweep, "k", "dev", baseline=A, confirmation=conf, real_win=real_win,
                          verdict=verdict, device_name="Some Device")


def _notes(ax: Any) -> dict[str, str]:
    """The note beside each row, keyed by the row's tick label."""
    labels = [t.get_text() for t in ax.get_yticklabels()]
    notes = {round(t.xy[1]): t.get_text().replace("\n", " ") for t in ax.texts if hasattr(t, "xy")}
    return {labels[y]: n for y, n in notes.items()}


def test_roles_say_why_the_winner_won_and_why_a_faster_looking_trial_did_not() -> None:
    res = _result()
    assert res.winner == C and res.real_win is True
    got = {r.config: r for r in roles(res)}
    assert [r.config for r in roles(res)][0] == C  # the winner first, though B looked faster in the sweep
    assert got[C].kind == WINNER and "within noise of the fastest" in got[C].note and D.label() in got[C].note
    assert got[D].kind == WITHIN_NOISE and "fastest in the rounds" in got[D].note
    assert got[B].kind == NOT_CONFIRMED and got[B].note.startswith("looked faster in the sweep; not confirmed")
    assert got[E].kind == SWEEP_ONLY and got[E].note == "sweep only: clearly slower than the sweep's fastest"
    assert got[F].kind == SWEEP_ONLY and got[F].note == ("sweep only: looked faster than the winner; within noise of "
                                                         "the sweep's fastest, later in sweep order, so not re-measured")
    assert [r.config for r in roles(res)][-2:] == [F, E]  # the sweep-only trials last, by their sweep medians
    assert "won 5 of 5 rounds" in got[C].note


def test_figure_shows_winner_first_noise_band_default_p10_and_notes() -> None:
    res = _result()
    fig = res.figure()
    try:
        ax = fig.axes[0]
        labels = [t.get_text() for t in ax.get_yticklabels()]
        assert labels[0] == f"{C.label()} (winner)"
        assert labels.index(B.label()) > labels.index(D.label())  # B sorted by its round median, not its sweep one
        notes = _notes(ax)
        assert notes[labels[0]].startswith("WINNER")
        assert "not confirmed" in notes[B.label()] and "looked faster in the sweep" in notes[B.label()]
        assert "within noise" in notes[D.label()]
        assert notes[E.label()].startswith("sweep only") and "looked faster than the winner" in notes[F.label()]
        band = next(p for p in ax.patches if p.get_gid() == NOISE_BAND)
        d = res.confirmation.trial(D)
        x0, x1 = sorted((band.get_x(), band.get_x() + band.get_width()))
        assert (x0, x1) == pytest.approx((d.p10_ns / 1e6, d.p90_ns / 1e6))  # the fastest's p10-p90, in ms
        assert "noise band" in band.get_label() and D.label() in band.get_label()
        line = next(ln for ln in ax.lines if ln.get_gid() == DEFAULT_P10)
        assert line.get_xdata()[0] == pytest.approx(res.confirmation.trial(A).p10_ns / 1e6)
        legend = [t.get_text() for t in ax.get_legend().get_texts()]
        assert any(t.startswith("noise band") for t in legend) and "each round's median" in legend
        # each round's median of the winner is drawn on its row (y 0, the rounds line just above the sweep's)
        ticks = [ln for ln in ax.lines if ln.get_marker() == "|" and all(y < 0 for y in ln.get_ydata())]
        assert len(ticks) == 1 and sorted(ticks[0].get_xdata()) == pytest.approx(
            sorted(v / 1e6 for v in (12, 12, 13, 12, 12)))
        caption = " ".join(t.get_text() for t in fig.texts)
        assert "5 interleaved rounds x 3 launches" in caption and "first of them in sweep order" in caption
        assert "Some Device" in ax.get_title() and "(confirmed)" in ax.get_title()
    finally:
        plt.close(fig)


def test_figure_says_the_default_was_kept_when_no_real_win() -> None:
    res = _result(default_rounds=(13, 12, 14, 13, 12))  # the default is as fast as C and D: no real win
    assert res.real_win is False and res.winner is None
    fig = res.figure()
    try:
        ax = fig.axes[0]
        labels = [t.get_text() for t in ax.get_yticklabels()]
        assert labels[0] == f"{A.label()} (default)"
        assert "KEPT" in _notes(ax)[labels[0]]
        assert "default kept" in ax.get_title()
        assert not any("(winner)" in lb for lb in labels)
    finally:
        plt.close(fig)


def test_figure_draws_the_top_sweep_only_trials_and_counts_the_rest(tmp_path: Any) -> None:
    res = _result()
    fig = res.figure(top=0)
    try:
        labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
        assert E.label() not in labels and F.label() not in labels and len(labels) == 4
        assert "2 more sweep-only trials" in " ".join(t.get_text() for t in fig.texts)
    finally:
        plt.close(fig)
    path = res.plot(str(tmp_path / "sweep.png"))
    with open(path, "rb") as fh:
        assert fh.read(8) == b"\x89PNG\r\n\x1a\n"


def test_figure_without_confirmation_rounds_decides_on_the_sweep_and_says_so() -> None:
    sweep = (Trial.measured(A, [99, 100, 101, 102, 98]), Trial.measured(C, [10, 11, 12, 12, 12]),
             Trial.measured(B, [9, 10, 11, 10, 10]), Trial.measured(E, [29, 30, 31, 30, 30]))
    winner, real_win, verdict = decide(sweep, A, {A: 0, C: 1, B: 2, E: 3}, 0.05)
    res = AutotuneResult(winner, sweep, "k", "dev", baseline=A, real_win=real_win, verdict=verdict)
    assert winner == C  # within noise of B, first in sweep order
    fig = res.figure()
    try:
        ax = fig.axes[0]
        labels = [t.get_text() for t in ax.get_yticklabels()]
        notes = _notes(ax)
        assert labels[0] == f"{C.label()} (winner)" and "first in sweep order" in notes[labels[0]]
        assert notes[E.label()] == "clearly slower than the sweep's fastest (no confirmation rounds)"
        assert not any("not confirmed" in n for n in notes.values())
        legend = [t.get_text() for t in ax.get_legend().get_texts()]
        assert "each round's median" not in legend and any(t.startswith("noise band") for t in legend)
        assert "No confirmation rounds" in " ".join(t.get_text() for t in fig.texts)
    finally:
        plt.close(fig)
