"""Trace files too large to read whole: ``summary``, ``analyze`` and ``diff`` through a temporary embedded store.

Reading a file whole (``read.load_columns``) holds every span in memory, so a file of tens of millions
of spans does not fit. Above a threshold (``CLTRACE_LARGE_FILE_MB``; by default 32 MB for a ``.pftrace``,
1024 MB for a ``.json``) the commands load the file into an embedded ClickHouse store (chDB, in this
process) in a temporary folder under ``TMPDIR`` and answer with the store's questions, as SQL inside the
engine: only aggregates come back.
The folder is removed afterwards, on errors and Ctrl-C too. ``--via-store`` takes that path for any
file, ``--in-memory`` never. The store answers over the whole run, with its own tables: what it cannot
honour (windows, plots, kernels grouped by shape or call site, some orders) is one line, exit 2.
"""
from __future__ import annotations

import argparse
import math
import os
import shutil
import sys
import tempfile
import time
from contextlib import contextmanager
from typing import Any, Iterator, Sequence

from ..errors import CltraceError

ENV = "CLTRACE_LARGE_FILE_MB"
MB = 1 << 20
# Read whole, a file costs ~0.7-1 KB of memory a span. A .pftrace holds a span in 10-20 B, a .json in
# 250-750 B: past 32 MB and 1024 MB (2-3M spans, 2-3 GB whole) a file goes through the store, which loads
# it window by window (read/windows.py) in well under 1 GB whatever its size.
DEFAULT_MB = {"pftrace": 32.0, "json": 1024.0}
SUMMARY_SORTS = {"total": "total_ns", "count": "count", "mean": "mean_ns"}  # what both store tables hold


def add_size_arguments(p: argparse.ArgumentParser) -> None:
    """``--via-store`` / ``--in-memory``: the path a file takes whatever its size."""
    g = p.add_mutually_exclusive_group()
    g.add_argument("--via-store", action="store_true",
                   help="read the file through a temporary embedded ClickHouse store (the default for files over "
                        f"{ENV}; unless set, a .pftrace over {DEFAULT_MB['pftrace']:g} MB, a .json over "
                        f"{DEFAULT_MB['json']:g} MB): answered inside the engine, over the whole run")
    g.add_argument("--in-memory", action="store_true",
                   help="read the file whole into memory, however large (~1 KB a span)")


def threshold_mb(kind: str = "pftrace") -> float:
    """``CLTRACE_LARGE_FILE_MB``: a file larger than this many MB (2^20 bytes) goes through the store; unset,
    the default of the file's format (``DEFAULT_MB``)."""
    raw = os.environ.get(ENV, "").strip()
    if not raw:
        return DEFAULT_MB.get(kind, math.inf)
    try:
        mb = float(raw)
    except ValueError:
        mb = -1.0
    if not (mb >= 0 and math.isfinite(mb)):
        raise CltraceError(f"{ENV}={raw[:40]!r} is not a number of MB >= 0: set it to the size above which a "
                           f"trace file is read through the store (unset: {DEFAULT_MB['pftrace']:g} for a .pftrace, "
                           f"{DEFAULT_MB['json']:g} for a .json; 0: every file), or unset it")
    return mb


def _kind(path: str) -> str:
    from ..read import detect

    try:
        return detect(path)
    except (OSError, CltraceError):  # unreadable or not a trace: the file reader says so in its own words
        return "?"


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:  # missing or unreadable: the file reader says so in its own words
        return -1


def via_store(args: argparse.Namespace, paths: Sequence[str]) -> str | None:
    """Why the files take the store path, in a few words, or None to read them whole."""
    if args.in_memory:
        return None
    if args.via_store:
        return "--via-store"
    threshold_mb()  # a bad setting is refused whatever the files
    for p in paths:
        limit = threshold_mb(_kind(p)) if _size(p) > 0 else math.inf
        if _size(p) > limit * MB:
            unset = "" if os.environ.get(ENV, "").strip() else ", the default"
            return f"{p} is {_size(p) / MB:,.1f} MB, over the {limit:g} MB of {ENV}{unset}"
    return None


def refuse(given: Sequence[str], why: str) -> None:
    """Options the store path cannot honour: one line naming them, and the way around."""
    if given:
        raise CltraceError(f"{', '.join(given)}: not available for a file read through the embedded store "
                           f"({why}), which answers over the whole run; "
                           "pass --in-memory to read the file whole")


def _window_options(args: argparse.Namespace) -> list[str]:
    return [o for o, v in (("--steps", args.steps), ("--from", args.from_ms), ("--to", args.to_ms),
                           ("--region", args.window_region), ("--steady", args.steady)) if v not in (None, False)]


@contextmanager
def temporary_store(why: str) -> Iterator[Any]:
    """An embedded store in a new folder under TMPDIR, closed and removed on the way out, however it is left."""
    from ..store import Store
    from ..store.connect import StoreExtraError, require_driver

    try:
        require_driver("chdb://")
    except StoreExtraError:
        raise CltraceError(f"{why}: reading the file through the embedded store needs the [clickhouse] extra: "
                           "pip install 'cltrace[clickhouse]', or pass --in-memory to read it whole") from None
    try:
        folder = tempfile.mkdtemp(prefix="cltrace-store-", dir=os.environ.get("TMPDIR") or None)
    except OSError as exc:
        raise CltraceError(f"cannot make a temporary store folder under TMPDIR "
                           f"({exc.strerror or exc}): set TMPDIR to a writable folder") from None
    try:
        with Store(folder) as store:
            yield store
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _load(store: Any, path: str, run_id: str | None = None) -> tuple[Any, float]:
    t0 = time.perf_counter()
    (res,) = store.load([path], run_id=run_id, settle=False)  # a store for this process alone
    return res, time.perf_counter() - t0


def _note(what: str, why: str, loaded: str) -> None:
    hint = "" if why == "--via-store" else f"; set {ENV} to change the threshold, or pass --in-memory to read it whole"
    print(f"cltrace: {what} through a temporary embedded ClickHouse store (whole-run tables), loaded in {loaded}: "
          f"{why}{hint}", file=sys.stderr, flush=True)


def analyze_via_store(args: argparse.Namespace, why: str) -> int:
    """``cltrace analyze FILE`` as the store answers it: per-rank utilisation, stragglers, findings,
    kernels and regions (``store.analysis.render``; ``--json``: its document)."""
    from ..store.analysis import render

    given = (("--plot", args.plot), ("--by-shape", args.by_shape), ("--by", args.by),
             ("--sort " + args.sort, args.sort != "total"))
    refuse(_window_options(args) + [o for o, v in given if v], why)
    with temporary_store(why) as store:
        res, s = _load(store, args.file)
        _note(f"analysed {args.file}", why, f"{s:.1f} s ({res.spans:,} spans)")
        a = store.analyze(run=args.run, rank=args.rank, service=args.service, step_name=args.step,
                          threshold_pct=args.threshold, top=args.top)
    if not a.ranks:
        raise CltraceError(f"no spans of {args.file} match --run/--rank/--service")
    print(a.to_json() if args.json else render(a, top=args.top, title=f"cltrace analyze: {args.file} (the whole run)"))
    return 0


def summary_via_store(args: argparse.Namespace, why: str) -> int:
    """``cltrace summary FILE`` as the store answers it: the host time of each region path and the device
    time of each kernel, every row (``--top N``: the N largest of each) by total, count or mean."""
    from ..store.analysis import kernel_lines, region_lines

    refuse(_window_options(args) + (["--sort " + args.sort] if args.sort not in SUMMARY_SORTS else []), why)
    with temporary_store(why) as store:
        res, s = _load(store, args.file)
        _note(f"summarised {args.file}", why, f"{s:.1f} s ({res.spans:,} spans)")
        t = store.totals()
    key = SUMMARY_SORTS[args.sort]
    regions, kernels = (sorted(rows, key=lambda r: -getattr(r, key))[:args.top or None]
                        for rows in (t.regions, t.kernels))
    if args.json:
        import json

        print(json.dumps({"source": args.file, "regions": [r.as_dict() for r in regions],
                          "kernels": [k.as_dict() for k in kernels]}, indent=2, default=str))
    else:
        print("\n".join([f"cltrace summary: {args.file} (the whole run: host time per region, device time per kernel)",
                         ""] + region_lines(regions) + [""] + kernel_lines(kernels)))
    return 0


def diff_via_store(args: argparse.Namespace, why: str) -> int:
    """``cltrace diff A B`` as ``diff --store`` answers it: both files loaded into one store as runs ``a``
    and ``b``, their totals through the same gate (same output, same exit status), labelled by file."""
    from .store import diff_runs

    refuse(_window_options(args), why)
    with temporary_store(why) as store:
        (ra, sa), (rb, sb) = _load(store, args.a, "a"), _load(store, args.b, "b")
        # a B of the same bytes as A was not loaded again (a store loads a file once): A is its own baseline
        run_b = "a" if rb.skipped else "b"
        same = f"; {args.b} holds the same bytes as {args.a}" if rb.skipped and args.a != args.b else ""
        _note(f"compared {args.a} and {args.b}", why, f"{sa:.1f} s and {sb:.1f} s ({ra.spans:,} and "
              f"{ra.spans if rb.skipped else rb.spans:,} spans){same}")
        return diff_runs(store, "a", run_b, args.a, args.b, args)
