"""What ``cltrace diff`` prints, for two files or two runs in a store alike: the rows as text or JSON."""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def print_diff(rows: list[Any], a: str, b: str, pct: float, args: argparse.Namespace) -> int:
    """A diff's rows as text or ``--json`` (files or runs in a store alike); 1 where ``--fail-above`` gates
    and a row regressed."""
    from ..analyze.diff import regressions, render_diff

    bad = regressions(rows) if args.fail_above is not None else []
    if args.json:
        print(json.dumps({"a": a, "b": b, "threshold_pct": pct, "gate": args.fail_above is not None,
                          "rows": [r.as_dict() for r in rows], "regressions": [r.name for r in bad]}, indent=2))
    else:
        print(render_diff(rows, a, b, pct, top=args.top or None))
        if args.fail_above is not None:
            print(f"\n{len(bad)} regression(s) above {args.fail_above:g}%" +
                  "".join(f"\n  {r.kind} {r.name}: {r.reason}" for r in bad))
    sys.stdout.flush()
    return 1 if bad else 0
