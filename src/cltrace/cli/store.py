"""``cltrace load`` and the ``--store`` forms of ``analyze`` and ``diff``: spans in ClickHouse."""
from __future__ import annotations

import argparse
import os
from typing import Any

from .checks import percent, whole_number


def add_load_command(sub: Any) -> None:
    ld = sub.add_parser("load", help="load trace files into a ClickHouse store (embedded folder or server URL)")
    ld.add_argument("files", nargs="+", help="trace files written by cltrace (.json or .pftrace)")
    add_store_argument(ld)
    ld.add_argument("--service", metavar="NAME", help="service.name of the loaded spans (default: cltrace)")
    ld.add_argument("--run-id", metavar="ID", help="the job's run id, for files recorded without one")
    ld.add_argument("--rank", metavar="N", help="the rank, for files recorded without one")
    ld.add_argument("--jobs", type=whole_number(1), default=min(4, os.cpu_count() or 1), metavar="N",
                    help="files loaded at once (default: min(4, cores))")
    ld.set_defaults(fn=cmd_load)


def add_store_argument(p: argparse.ArgumentParser, required: bool = False) -> None:
    p.add_argument("--store", metavar="STORE", required=required,
                   help="a folder (embedded chDB) or http(s):// / clickhouse:// URL of a server "
                        "(default: CLTRACE_STORE)")


def add_scope_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("with --store")
    g.add_argument("--run", metavar="ID", help="only this run (its cltrace.run.id)")
    g.add_argument("--rank", metavar="N", help="only this rank")
    g.add_argument("--service", metavar="NAME", help="only spans of this service.name")
    g.add_argument("--step", default="step", metavar="NAME",
                   help="steps are spans of category step or named NAME (default: step)")
    g.add_argument("--threshold", type=percent, default=10.0, metavar="PCT",
                   help="a rank straggles at a step taking more than PCT%% over the median (default 10)")


def cmd_load(args: argparse.Namespace) -> int:
    from ..store import Store

    with Store(args.store) as store:
        for r in store.load(args.files, service_name=args.service, run_id=args.run_id, rank=args.rank,
                            jobs=args.jobs):
            if r.skipped:
                print(f"cltrace: {r.path}: already in the store (loaded before); nothing to do")
            else:
                print(f"cltrace: loaded {r.path}: {r.spans} spans in {r.seconds:.2f} s (trace {r.trace_id})")
    return 0


def cmd_analyze_store(args: argparse.Namespace) -> int:
    from ..errors import CltraceError
    from ..store import Store
    from ..store.analysis import render

    with Store(args.store, create=False) as store:
        if not store.count():
            raise CltraceError(f"the store {args.store or os.environ.get('CLTRACE_STORE')} holds no spans: "
                               "load traces first (cltrace load FILE... --store STORE)")
        a = store.analyze(run=args.run, rank=args.rank, service=args.service, step_name=args.step,
                          threshold_pct=args.threshold, top=args.top)
    if not a.ranks:
        raise CltraceError("no spans in the store match --run/--rank/--service")
    print(a.to_json() if args.json else render(a, top=args.top))
    return 0


def cmd_diff_store(args: argparse.Namespace) -> int:
    from ..store import Store

    with Store(args.store, create=False) as store:
        return diff_runs(store, args.a, args.b, f"run {args.a}", f"run {args.b}", args)


def diff_runs(store: Any, run_a: str, run_b: str, label_a: str, label_b: str, args: argparse.Namespace) -> int:
    """``cltrace diff`` of two runs of ``store``: their kernel and region totals through the files' gate
    (``analyzers.diff.compare``), printed under the labels; the exit status of the gate."""
    from ..analyzers.diff import DEFAULT_PCT, compare
    from .diff_report import print_diff

    ra, rb = (store.totals(r).run_samples() for r in (run_a, run_b))
    pct = DEFAULT_PCT if args.fail_above is None else args.fail_above
    return print_diff(compare(ra, rb, pct), label_a, label_b, pct, args)
