"""Findings: small rules over an analysed trace, each with its threshold, evidence and advice.

Each rule is one function ``rule(ctx) -> Finding | None`` in a module by subject; ``RULES``
runs them and ``run`` ranks what fired by the time at stake.
"""
from __future__ import annotations

from typing import Callable

from .base import Context, Finding
from .builds import compile_in_timed_region, rebuilt_programs
from .idle import idle_regions, long_idle_gaps
from .launch import launch_bound
from .sync import blocking_in_loop
from .transfers import small_transfers

Rule = Callable[[Context], "Finding | None"]
RULES: tuple[Rule, ...] = (rebuilt_programs, compile_in_timed_region, blocking_in_loop, small_transfers,
                           long_idle_gaps, launch_bound, idle_regions)


def run(ctx: Context, rules: tuple[Rule, ...] = RULES) -> list[Finding]:
    """The findings that fired, most time at stake first."""
    out = [f for f in (rule(ctx) for rule in rules) if f is not None]
    out.sort(key=lambda f: -f.cost_ns)
    return out


__all__ = ["Context", "Finding", "RULES", "run"]
