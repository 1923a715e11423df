"""Confirming a winner: the top few candidates and the untuned default re-measured in interleaved rounds.

A sweep measures candidates one after another, so load from other processes
falls on some and not others, and the fastest of a sweep is often only the
luckiest. Here every round launches each candidate in turn (A B C D, B C D A,
...; the start rotates), so whatever else the machine does falls on all alike.
The decision (``decide``) is made on these figures:

* candidates the fastest does not clearly beat (its p90 below their p10 and
  its median more than ``tolerance`` below theirs) are tied with it, and the
  first of them in sweep order is chosen, so noise cannot flip the choice
  between near-equal candidates;
* the choice is a real win only when its median lies below the default's p10
  (and more than ``tolerance`` below its median) and it wins at least 4 in 5 of
  the rounds; otherwise the default is kept. Medians and rounds, not p90s,
  so one burst of load cannot turn a win into a loss.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Mapping, Sequence

import pyopencl as cl

from ..analyzers.report import format_ns
from ..record.regions import category_region
from ..record.timing import _events_of, _span_ns
from ..timeline.spans import REGION
from .config import Config
from .result import Confirmation, Trial
from .rounds import rounds_won
from .runner import TrialRunner


def confirm(runner: TrialRunner, configs: Sequence[Config], default: Config | None, rounds: int, runs: int,
            order: Mapping[Config, int], tolerance: float = 0.0) -> Confirmation:
    """Re-measure ``configs`` and ``default`` in ``rounds`` interleaved rounds of ``runs`` launches each
    (one untimed launch each first), then ``decide``. A candidate that fails to build or launch here
    becomes a failed trial and takes no further part."""
    cands = list(dict.fromkeys(list(configs) + ([default] if default is not None else [])))
    calls: dict[Config, Callable[[], Any]] = {}
    failed: dict[Config, Trial] = {}
    queue = runner.tuner.queue
    with category_region("confirm", queue, {"rounds": rounds, "runs": runs, "candidates": len(cands)}, REGION):
        for c in cands:
            prepared = runner.prepare(c)
            if isinstance(prepared, Trial):
                failed[c] = prepared
            else:
                calls[c] = prepared[0]
        times: dict[Config, list[int]] = {c: [] for c in calls}
        wins = {c: 0 for c in calls}
        live = [c for c in cands if c in calls]
        for c in list(live):
            if _batch(calls[c], 1, c, failed) is None:
                live.remove(c)
        for r in range(rounds):
            medians: dict[Config, float] = {}
            start = r % len(live) if live else 0
            for c in live[start:] + live[:start]:
                got = _batch(calls[c], runs, c, failed)
                if got is None:
                    continue
                times[c] += got
                medians[c] = sorted(got)[len(got) // 2]
            live = [c for c in live if c not in failed]
            if medians:
                wins[min(medians, key=lambda c: medians[c])] += 1
    trials = tuple(failed[c] if c in failed else Trial.measured(c, times[c]) for c in cands)
    winner, real_win, verdict = decide(trials, default, order, tolerance, runs)
    return Confirmation(trials, tuple(wins.get(c, 0) for c in cands), rounds, runs, default, winner, real_win,
                        verdict)


def _batch(call: Callable[[], Any], count: int, config: Config, failed: dict[Config, Trial]) -> list[int] | None:
    """Device times of ``count`` launches of ``call`` (one wait), or None with the failure recorded."""
    batch: list[list[Any]] = []
    try:
        for _ in range(count):
            evs = _events_of(call())
            if evs is None:
                raise TypeError("kernel_fn must return a cl.Event or a list of them")
            batch.append(evs)
        cl.wait_for_events([e for evs in batch for e in evs])
    except (cl.Error, TypeError) as exc:
        for evs in batch:
            for e in evs:
                try:
                    e.wait()
                except cl.Error:
                    pass
        failed[config] = Trial.failed(config, "launch", f"launch failed during confirmation: {exc}")
        return None
    return [_span_ns(evs) for evs in batch]


def decide(trials: Sequence[Trial], default: Config | None, order: Mapping[Config, int],
           tolerance: float = 0.0, runs: int | None = None) -> tuple[Config | None, bool | None, str]:
    """(chosen config, real win?, one-line verdict) from measured trials; see the module docstring.

    ``tolerance``: the fraction by which medians must differ for a difference to count. ``runs``:
    launches per round when the times come from interleaved rounds (they are then compared round
    by round too); None for a sweep's figures.
    """
    ok = [t for t in trials if t.ok]
    base = next((t for t in ok if t.config == default), None) if default is not None else None
    cands = [t for t in ok if t.config != default]
    if not cands:
        return (default if base is not None else None), (False if base is not None else None), \
            "no candidate ran" + ("; keeping the default" if base is not None else "")
    fastest = min(cands, key=lambda t: t.median_ns)
    tied = [t for t in cands if not fastest.clearly_faster_than(t, tolerance)]
    pick = min(tied, key=lambda t: (order.get(t.config, len(order)), t.median_ns))
    note = f"; {len(tied)} within noise of the fastest, the first in sweep order chosen" if len(tied) > 1 else ""
    if base is None:
        return pick.config, None, f"{pick.config.label()} {_figures(pick)} (no default measured to compare){note}"
    why_not = _beats(pick, base, tolerance, runs)
    if why_not:
        return default, False, (f"no real win: {pick.config.label()} {_figures(pick)} does not clearly beat the "
                                f"default {_figures(base)} ({why_not}){note}; keeping the default")
    won = (f", won {rounds_won(pick.times_ns, base.times_ns, tolerance, runs)} of {len(base.times_ns) // runs} rounds"
           if runs else "")
    return pick.config, True, (f"{pick.config.label()} {_figures(pick)} beats the default {_figures(base)}: "
                               f"median below its p10{won}, {base.median_ns / pick.median_ns:.2f}x{note}")


def _beats(t: Trial, base: Trial, tolerance: float, runs: int | None) -> str | None:
    """Why ``t`` does not clearly beat ``base``, or None when it does: its median must lie below the
    default's p10 and more than ``tolerance`` below its median, and with rounds, it must win at least
    4 in 5 of them (a round's burst of load may cost one)."""
    if not (t.median_ns < base.p10_ns and t.median_ns * (1 + tolerance) < base.median_ns):
        return "its median is not below the default's p10"
    if runs:
        n = min(len(t.times_ns), len(base.times_ns)) // runs
        need = math.ceil(0.8 * n)
        if rounds_won(t.times_ns, base.times_ns, tolerance, runs) < need:
            return f"it won fewer than {need} of {n} rounds"
    return None


def _figures(t: Trial) -> str:
    return f"median {format_ns(t.median_ns)} [p10 {format_ns(t.p10_ns)}, p90 {format_ns(t.p90_ns)}]"
