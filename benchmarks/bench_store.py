"""The store at scale: ``cltrace load`` of 16 ranks × 1M spans into the embedded store (chDB), then
``analyze --store`` over all of them (per-rank table, stragglers, kernel pace, regions, findings).

Each rank's trace is synthesised as columns (a ``step`` region per step holding ten ``saxpy`` kernel
launches on a busy in-order queue and a ``finish``; rank 5 runs its kernels 1.5× longer: the
straggler) and written with the real ``.pftrace`` sink, the rank and run id in its metadata as a
launcher's environment gives them. Loading and analysing each run in a fresh process (this one
waits), which reports its own peak RSS; timed: the whole ``Store.load`` (read, map, insert, for
every file) and each question's SQL. Targets (issue 29): load ≤ 2 min; per-rank table + stragglers
≤ 10 s. ``--analyze-only`` (with ``--keep``) analyses the store a previous ``--keep`` run left there again,
``--runs`` times, without loading it anew (to time the questions alone).

    python benchmarks/bench_store.py [--ranks 16] [--spans 1000000] [--jobs 2] [--keep DIR]
    python benchmarks/bench_store.py --keep DIR --analyze-only [--runs 3]
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

LOAD_TARGET_S = 120.0
ANALYZE_TARGET_S = 10.0


def synthesise(n: int, rank: int, slow: bool, out: str) -> int:
    """Write one rank's trace of about ``n`` spans to ``out`` (.pftrace), its rank and run id in the metadata as
    a launcher's environment gives them; returns the span count."""
    os.environ.update(RANK=str(rank), CLTRACE_RUN_ID="bench")
    return write_big_trace(n, out, seed=rank, slow=slow)


def child_load(store: str, files: list[str], jobs: int) -> dict[str, Any]:
    from cltrace.store import Store

    t0 = time.perf_counter()
    with Store(store) as s:
        res = s.load(files, jobs=jobs)
        rows = s.count()
    return {"seconds": time.perf_counter() - t0, "spans": sum(r.spans for r in res), "rows": rows,
            "cpu_s": resource.getrusage(resource.RUSAGE_SELF).ru_utime + resource.getrusage(resource.RUSAGE_SELF).ru_stime,
            "per_file_s": [round(r.seconds, 2) for r in res]}


def child_analyze(store: str) -> dict[str, Any]:
    from cltrace.store import Store
    from cltrace.store.questions import findings, kernels, ranks, regions, stragglers
    from cltrace.store.questions.common import Scope

    out: dict[str, Any] = {}
    with Store(store, create=False) as s:
        scope = Scope()
        for name, fn in (("ranks", lambda: ranks.rank_table(s.result, scope)),
                         ("stragglers", lambda: stragglers.stragglers(s.result, scope)),
                         ("kernels", lambda: kernels.kernel_pace(s.result, scope, 10)),
                         ("regions", lambda: regions.region_table(s.result, scope, 10)),
                         ("findings", lambda: findings.run_findings(s.result, scope))):
            t0, c0 = time.perf_counter(), time.process_time()
            got = fn()
            out[name] = time.perf_counter() - t0
            out[name + "_cpu"] = time.process_time() - c0  # every thread of this process: the engine's too
            if name == "stragglers":
                slow, _steps = got
                out["slowest"] = [(r.rank, r.steps, round(r.excess_ns / 1e9, 3), r.cause) for r in slow[:3]]
            if name == "findings":
                out["found"] = [(f.rule, len(f.ranks)) for f in got]
    ru = resource.getrusage(resource.RUSAGE_SELF)
    out["cpu_s"] = ru.ru_utime + ru.ru_stime
    return out


def run_child(*args: str) -> dict[str, Any]:
    p = subprocess.run([sys.executable, __file__, "--child", *args], capture_output=True, text=True)
    if p.returncode:
        raise SystemExit(p.stderr[-3000:])
    return json.loads(p.stdout.strip().splitlines()[-1])


QUESTIONS = ("ranks", "stragglers", "kernels", "regions", "findings")


def analyze_only(base: str | None, runs: int) -> int:
    """Each question's seconds (CPU seconds) over the store a ``--keep`` run left in ``base``, ``runs`` times."""
    store = os.path.join(base or "", "store")
    if not base or not os.path.isdir(store):
        raise SystemExit(f"--analyze-only: no store kept in {base} (run with --keep {base or 'DIR'} first)")
    print("| run | " + " | ".join(QUESTIONS) + " | per-rank table + stragglers | peak RSS |")
    print("|---" + "|---:" * (len(QUESTIONS) + 2) + "|")
    for i in range(runs):
        an = run_child("analyze", store)
        both = an["ranks"] + an["stragglers"]
        print(f"| {i + 1} | " + " | ".join(f"{an[q]:.2f} s ({an[q + '_cpu']:.2f})" for q in QUESTIONS) +
              f" | {both:.2f} s ({an['ranks_cpu'] + an['stragglers_cpu']:.2f}) | {an['peak_rss_mb']:.0f} MB |")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=16)
    ap.add_argument("--spans", type=int, default=1_000_000, help="spans per rank")
    ap.add_argument("--jobs", type=int, default=2, help="files loaded at once")
    ap.add_argument("--keep", metavar="DIR", help="write the traces and the store here and keep them")
    ap.add_argument("--analyze-only", action="store_true", help="analyse the store kept in --keep DIR again")
    ap.add_argument("--runs", type=int, default=1, help="with --analyze-only: analyses, each in a fresh process")
    ap.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        what, *rest = args.child
        if what == "synth":
            got: dict[str, Any] = {"spans": synthesise(int(rest[0]), int(rest[1]), rest[2] == "1", rest[3])}
        elif what == "load":
            got = child_load(rest[0], rest[2:], int(rest[1]))
        else:
            got = child_analyze(rest[0])
        got["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(json.dumps(got))
        return 0
    if args.analyze_only:
        return analyze_only(args.keep, args.runs)
    base = args.keep or tempfile.mkdtemp(prefix="cltrace-bench-store-")
    os.makedirs(base, exist_ok=True)
    files = [os.path.join(base, f"rank{r}.pftrace") for r in range(args.ranks)]
    t0 = time.perf_counter()
    for r, f in enumerate(files):
        if not os.path.exists(f):
            run_child("synth", str(args.spans), str(r), "1" if r == 5 % args.ranks else "0", f)
    mb = sum(os.path.getsize(f) for f in files) / 1e6
    print(f"{args.ranks} rank traces of ~{args.spans} spans ({mb:.0f} MB of .pftrace) written in "
          f"{time.perf_counter() - t0:.1f} s; rank {5 % args.ranks} the straggler")
    store = os.path.join(base, "store")
    shutil.rmtree(store, ignore_errors=True)
    load_avg = [os.getloadavg()[0]]
    load = run_child("load", store, str(args.jobs), *files)
    load_avg.append(os.getloadavg()[0])
    an = run_child("analyze", store)
    load_avg.append(os.getloadavg()[0])
    n = load["spans"]
    print(f"| figure | value | target |\n|---|---:|---|")
    print(f"| load: {args.ranks} files, {n} spans ({args.jobs} at once) | {load['seconds']:.1f} s | "
          f"<= {LOAD_TARGET_S:.0f} s |")
    print(f"| load: spans/s | {n / load['seconds']:,.0f} | |")
    print(f"| load: CPU seconds (all threads) | {load['cpu_s']:.1f} | |")
    print(f"| load: peak RSS | {load['peak_rss_mb']:.0f} MB ({load['peak_rss_mb'] * 2**20 / (n / args.ranks * min(args.jobs, args.ranks)):.0f} B a span of the files in flight) | |")
    print(f"| load: seconds per file | {min(load['per_file_s'])}-{max(load['per_file_s'])} | |")
    for q in QUESTIONS:
        print(f"| analyze --store: {q} | {an[q]:.2f} s ({an[q + '_cpu']:.2f} CPU s) | |")
    both = an["ranks"] + an["stragglers"]
    print(f"| analyze --store: per-rank table + stragglers | {both:.2f} s ({an['ranks_cpu'] + an['stragglers_cpu']:.2f} "
          f"CPU s) | <= {ANALYZE_TARGET_S:.0f} s |")
    print(f"| analyze --store: CPU seconds, all five (all threads) | {an['cpu_s']:.1f} | |")
    print("| findings (rule, ranks hit) | " + "; ".join(f"{r} {n}" for r, n in an["found"]) + " | |")
    print(f"| analyze --store: peak RSS | {an['peak_rss_mb']:.0f} MB | |")
    print("| slowest ranks found (rank, steps straggled, excess s, cause) | " +
          "; ".join(f"{r} {n} {x} {c}" for r, n, x, c in an["slowest"]) + f" | rank {5 % args.ranks} first, kernels |")
    print(f"| machine's 1-min load average (before load, after load, after analysis; {os.cpu_count()} cores) | "
          f"{', '.join(f'{x:.1f}' for x in load_avg)} | |")
    print(f"| store on disk | {sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(store) for f in fs) / 1e6:.0f} MB | |")
    if not args.keep:
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
