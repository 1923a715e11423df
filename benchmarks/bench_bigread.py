"""Reading one large trace file: peak RSS and seconds of each way to read it.

Rows: ``load_columns`` (the whole file into columns), ``windows`` (``read/windows.py``: the spans of a
``.pftrace`` a window at a time, each batch dropped once counted), ``summary`` and ``analyze`` in memory,
``summary-store`` / ``analyze-store`` (``cltrace summary|analyze FILE --via-store``: the file loaded into
a temporary embedded store, window by window for a ``.pftrace``, and the questions asked there), and ``merge``
(``cltrace.merge.merge`` of the file and a small second one of 12k spans into a file of the same format, as
``cltrace merge`` does: inputs over ``read.batches.WINDOWED_FROM`` read in windows, the others whole) and
``merge-windows`` (the same, every input read in windows). Run ``merge`` on another checkout's code
(``PYTHONPATH=.../src``) for a before figure.

A trace of N spans is synthesised as columns (``tests/big_trace.py``: a ``step`` region per step holding ten
``saxpy`` kernel launches on an in-order queue and a ``finish``) and written with the real sinks (``.pftrace``
packed as cltrace writes it, and ``.json``), batch by batch, so writing it costs a batch of memory.
Each reading runs in a fresh process that reports its own peak RSS (``ru_maxrss``) and wall time.
Targets (issue 29): summary/analyze of a 45M-span ``.pftrace`` completes with peak RSS <= 2 GB;
peak RSS reading a trace <= 100 B a span; analyze of a 1M-span file no slower than before (3.3-6.5 s).

    python benchmarks/bench_bigread.py [--spans 1000000,5000000] [--formats pftrace,json]
                                       [--what load_columns,windows,summary,analyze,summary-store,analyze-store,merge,merge-windows]
                                       [--dir DIR] [--keep] [--cap-mb MB]
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from big_trace import write_big_trace  # noqa: E402  the traces the tests read

TARGET_45M_MB = 2048
TARGET_B_PER_SPAN = 100


SMALL_SPANS = 12_000  # the second file of a merge


def child_read(what: str, path: str, *more: str) -> dict[str, Any]:
    """Read ``path`` as ``what`` does; the spans it read (a packed file past the reader's inflate budget is
    read in part: ``partial``). ``merge``: ``more`` is the small second file and the output."""
    t0 = time.perf_counter()
    if what.startswith("merge"):
        from cltrace.merge import merge

        result = merge([path, more[0]], more[1], **({"windowed_from": 0} if what == "merge-windows" else {}))
        n, meta = result.spans, {}
    elif what == "load_columns":
        from cltrace.read import load_columns

        spans, meta = load_columns(path)
        n = len(spans)
    elif what == "windows":
        from cltrace.read.windows import open_windows

        wt = open_windows(path)
        if wt is None:
            raise SystemExit("the windowed reader refused the file")
        n = sum(b.n for b in wt.batches())
        meta = wt.metadata()
    elif what.endswith("-store"):
        import contextlib
        import io
        import re

        from cltrace.cli import main as cli

        err = io.StringIO()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            rc = cli([what[:-len("-store")], path, "--via-store"])
        if rc:
            raise SystemExit(err.getvalue().strip()[-300:])
        m = re.search(r"\(([\d,]+) spans\)", err.getvalue())
        n, meta = int(m.group(1).replace(",", "")) if m else 0, {}
    elif what == "summary":
        from cltrace.analyzers.summary import summarize

        stats, meta = summarize(path)
        n = sum(v["host"]["count"] for v in stats.as_dict().values() if v["host"])
    else:
        from cltrace.analyzers.analysis import analyze

        a = analyze(path)  # the steady state, as cltrace analyze: "spans read" counts the spans in it
        n, meta = a.spans, {}
    seconds = time.perf_counter() - t0
    return {"seconds": seconds, "read": n, "partial": bool(meta.get("inflate_skipped"))}


def run_child(*args: str, cap_mb: int = 0) -> dict[str, Any]:
    """Run ``--child args`` in a fresh process; ``cap_mb``: its address space limit (a reading past it fails
    with MemoryError rather than taking the machine's memory)."""
    def cap() -> None:
        if cap_mb:
            resource.setrlimit(resource.RLIMIT_AS, (cap_mb << 20, cap_mb << 20))

    p = subprocess.run([sys.executable, __file__, "--child", *args], capture_output=True, text=True, preexec_fn=cap)
    if p.returncode:
        return {"error": (p.stderr.strip().splitlines() or [f"exit {p.returncode}"])[-1][:120]}
    return json.loads(p.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spans", default="1000000,5000000", help="comma-separated span counts")
    ap.add_argument("--formats", default="pftrace,json")
    ap.add_argument("--what", default="load_columns,windows,summary,analyze,summary-store,analyze-store",
                    help="comma-separated, of those and merge, merge-windows")
    ap.add_argument("--dir", help="where the traces go (default: a temporary folder)")
    ap.add_argument("--keep", action="store_true", help="keep the traces (reused by a later run)")
    ap.add_argument("--cap-mb", type=int, default=12_000, help="address space limit of each reading (0: none)")
    ap.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        what, *rest = args.child
        if what == "synth":
            got: dict[str, Any] = {"spans": write_big_trace(int(rest[0]), *rest[1:])}
        else:
            got = child_read(what, *rest)
        got["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(json.dumps(got))
        return 0
    base = args.dir or tempfile.mkdtemp(prefix="cltrace-bench-bigread-")
    os.makedirs(base, exist_ok=True)
    formats = args.formats.split(",")
    print("| spans | format | file MB | reading | spans read | peak RSS MB | B a span read | seconds | target |")
    print("|---:|---|---:|---|---:|---:|---:|---:|---|")
    for n in (int(x) for x in args.spans.split(",")):
        files = {f: os.path.join(base, f"big{n}.{f}") for f in formats}
        todo = [p for p in files.values() if not os.path.exists(p)]
        if todo:
            got = run_child("synth", str(n), *todo)
            if "error" in got:
                raise SystemExit(f"synthesising {n} spans: {got['error']}")
        for fmt, path in files.items():
            mb = os.path.getsize(path) / 1e6
            for what in args.what.split(","):
                extra: tuple[str, ...] = ()
                if what.startswith("merge"):
                    small = os.path.join(base, f"small.{fmt}")
                    if not os.path.exists(small) and "error" in (got := run_child("synth", str(SMALL_SPANS), small)):
                        raise SystemExit(f"synthesising the small file: {got['error']}")
                    extra = (small, os.path.join(base, f"merged.{fmt}"))
                r = run_child(what, path, *extra, cap_mb=args.cap_mb)
                if extra and os.path.exists(extra[1]):
                    os.remove(extra[1])
                if "error" in r:
                    print(f"| {n} | {fmt} | {mb:.0f} | {what} | - | - | - | - | failed: {r['error']} |")
                    continue
                target = f"<= {TARGET_B_PER_SPAN} B a span"
                if n >= 40_000_000 and what not in ("load_columns", "windows"):
                    target += f"; <= {TARGET_45M_MB} MB"
                if what == "analyze" and n == 1_000_000:
                    target += "; no slower (3.3-6.5 s before)"
                read = f"{r['read']}" + (" (part: inflate budget)" if r["partial"] else "")
                print(f"| {n} | {fmt} | {mb:.0f} | {what} | {read} | {r['peak_rss_mb']:.0f} | "
                      f"{r['peak_rss_mb'] * 2**20 / max(r['read'], 1):.0f} | {r['seconds']:.1f} | {target} |", flush=True)
        if not args.keep:
            for p in files.values():
                os.remove(p)
    if not args.keep:
        for fmt in formats:
            if os.path.exists(small := os.path.join(base, f"small.{fmt}")):
                os.remove(small)
    if not args.keep and not args.dir:
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
