"""What ``cltrace diff`` prints, for two files or two runs in a store alike: the rows as text or JSON."""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def print_diff(rows: list[Any], a: str, b: str, pct: float, args: argparse.Namespace,
               windows: tuple[Any, Any] | None = None) -> int:
    """A diff's rows as text or ``--json`` (files or runs in a store alike); 1 where ``--fail-above`` gates
    and a row regressed. ``windows``: the ``window.Selection`` of each file, where a window was applied."""
    from ..analyzers.diff import regressions, render_diff

    bad = regressions(rows) if args.fail_above is not None else []
    if args.json:
        extra = {"window_a": windows[0].as_dict(), "window_b": windows[1].as_dict()} if windows else {}
        print(json.dumps({"a": a, "b": b, "threshold_pct": pct, "gate": args.fail_above is not None, **extra,
                          "rows": [r.as_dict() for r in rows], "regressions": [r.name for r in bad]}, indent=2))
    else:
        words = (windows[0].words, windows[1].words) if windows else None
        print(render_diff(rows, a, b, pct, top=args.top or None, windows=words))
        if args.fail_above is not None:
            print(f"\n{len(bad)} regression(s) above {args.fail_above:g}%" +
                  "".join(f"\n  {r.kind} {r.name}: {r.reason}" for r in bad))
    sys.stdout.flush()
    return 1 if bad else 0
