"""The order a sweep runs its trials in: ``grid`` (every candidate) or ``coordinate`` (one knob at a time)."""
from __future__ import annotations

import itertools
from dataclasses import replace
from typing import Any, Callable

from .config import KEYS, Config
from .runner import TrialRunner

STRATEGIES = ("grid", "coordinate")


def grid(space: dict[str, list[Any]]) -> list[Config]:
    """Every configuration of ``space``, work-group outermost, then tile, then unroll."""
    return [Config(w, t, u) for w, t, u in itertools.product(space["workgroup"], space["tile"], space["unroll"])]


def plan(strategy: str, space: dict[str, list[Any]], base: Config | None) -> tuple[int, Callable[[TrialRunner], None]]:
    """How many trials ``strategy`` runs on ``space`` from ``base``, and the function that runs them."""
    if strategy == "grid":
        todo = grid(space)
        if base is not None and base not in todo:
            todo.insert(0, base)

        def run_grid(runner: TrialRunner) -> None:
            for cfg in todo:
                runner.run(cfg)

        return len(todo), run_grid
    start = base if base is not None else Config(space["workgroup"][0], space["tile"][0], space["unroll"][0])
    total = 1 + sum(len(space[k]) - (start[k] in space[k]) for k in KEYS)
    return total, lambda runner: coordinate(runner, space, start)


def coordinate(runner: TrialRunner, space: dict[str, list[Any]], start: Config) -> None:
    """One pass: every tile around the start, then every unroll factor around the best so far,
    then every work-group shape around the best so far."""
    runner.run(start)
    for key in ("tile", "unroll", "workgroup"):
        for value in space[key]:
            cfg = replace(runner.best_config() or start, **{key: value})
            if runner.trial_of(cfg) is None:
                runner.run(cfg)
