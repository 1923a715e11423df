"""The window options of ``analyze``, ``summary`` and ``diff``: which part of a run they report on.

One set of options for the three commands (``analyzers.window`` defines what each means); ``analyze``
reports the steady state unless told otherwise, ``summary`` and ``diff`` the whole run.
"""
from __future__ import annotations

import argparse
from typing import Any

from ..errors import CltraceError

OPTIONS = "--steps/--from/--to/--region/--steady/--whole"


def _steps(value: str) -> str:
    from ..analyzers.window import parse_steps

    try:
        parse_steps(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).partition(": ")[2]) from None
    return value


def _ms(value: str) -> float:
    try:
        v = float(value)
    except ValueError:
        v = -1.0
    if not v >= 0:
        raise argparse.ArgumentTypeError(f"{value!r}: milliseconds since the trace's first span (0 or more)")
    return v


def add_window_arguments(p: argparse.ArgumentParser, steady_default: bool) -> None:
    g = p.add_argument_group("window (default: " + ("the steady state" if steady_default else "the whole run") + ")")
    g.add_argument("--steps", type=_steps, metavar="A:B",
                   help="only steps A to B, both included, as cltrace.step()/steps() numbered them "
                        "(A:, :B, N, or all for every step)")
    g.add_argument("--from", dest="from_ms", type=_ms, metavar="MS", help="from MS milliseconds after the first span")
    g.add_argument("--to", dest="to_ms", type=_ms, metavar="MS", help="to MS milliseconds after the first span")
    g.add_argument("--region", dest="window_region", metavar="NAME",
                   help="only the time inside the occurrences of region NAME (a name, or a path's last parts a/b)")
    g.add_argument("--steady", action="store_true",
                   help="the steady state: the steps after the first (else from the first kernel launch), "
                        "builds left out")
    g.add_argument("--whole", action="store_true", help="the whole run, start-up and builds included")


def window_of(args: argparse.Namespace, steady_default: bool) -> Any:
    """The ``analyzers.window.Window`` the options ask for; a CltraceError for options that contradict."""
    from ..analyzers.window import STEADY, WHOLE, Window

    explicit = [o for o, v in (("--steps", args.steps), ("--from", args.from_ms), ("--to", args.to_ms),
                               ("--region", args.window_region)) if v is not None]
    if args.steady and args.whole:
        raise CltraceError("--steady and --whole are two windows: give one")
    if explicit and (args.steady or args.whole):
        raise CltraceError(f"{'--steady' if args.steady else '--whole'} is a window of its own: "
                           f"drop it or {', '.join(explicit)}")
    if not explicit:
        return STEADY if args.steady or (steady_default and not args.whole) else WHOLE
    return Window.of(args.steps, args.from_ms, args.to_ms, args.window_region)  # a WindowError: one line


def no_window_on_store(args: argparse.Namespace) -> None:
    """The store's questions run as SQL over whole runs: a window there is one line."""
    if any(v not in (None, False) for v in (args.steps, args.from_ms, args.to_ms, args.window_region, args.steady)):
        raise CltraceError(f"{OPTIONS} apply to trace files; --store answers over whole runs (not windowed)")
