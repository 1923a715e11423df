"""Does a noisy run overturn the tuner's choice? Consecutive ``cltrace tune`` runs, each a fresh process
sharing one tune store (as a user re-running it would), with CPU-heavy processes beside them.

Each run is ``python -m cltrace tune --size N --no-progress`` (its own sweep, confirmation rounds and
decision). After each run the store entry for N³ is read back: it holds that run's winner, or nothing
when the run found no real win (a run without one removes the entry). Target: every run stores the same
winner or none. Finally ``cltrace tune --check`` re-measures the stored winner against the default.

    python benchmarks/tune_stability.py                          # 3 runs of 256³, one CPU hog beside them
    CLTRACE_DEVICE=gpu python benchmarks/tune_stability.py --size 2048 --hogs 0

Figures are the stored winner's confirmation figures (device time END-START, median and p10-p90 over
rounds x launches). Exit status 0 when the runs agree, 1 when they do not, 2 when a run failed.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

# Some PoCL builds abort inside LLVM when compiling float16 code on AVX-512 hosts they do not know
# (seen with PoCL 3.0-rc2 on a Zen 4 host: "LLVM ERROR: Cannot select ... _cl_madDv16_f"). A crash of
# the compiler kills the tuning process, so this probe builds one 16-wide variant in a child first.
PROBE = """
import pyopencl as cl
from cltrace.programs.compiler import default_queue
from cltrace.tune.kernels.matmul import MATMUL
q = default_queue()
if max(4, q.device.preferred_vector_width_float) >= 16:
    p = cl.Program(q.context, MATMUL.source).build(options=["-DTILE_X=16", "-DTILE_Y=1", "-DUNROLL=1"])
    p.get_info(cl.program_info.BINARIES)
    cl.Kernel(p, "matmul")
print("ok")
"""
NARROW_TILES = ",".join(f"{x}x{y}" for x in (8, 4, 2, 1) for y in (8, 4, 2, 1))


def _fmt(ns: float | None) -> str:
    if ns is None:
        return "-"
    return f"{ns / 1e6:.3f}ms" if ns >= 1e5 else f"{ns / 1e3:.1f}us"


def stored(cache: str, size: tuple[int, int, int]) -> dict[str, Any] | None:
    """The tune-store entry for this matmul size, or None."""
    for path in glob.glob(os.path.join(cache, "tuned", "*", "*", "*.json")):
        try:
            with open(path) as fh:
                doc = json.load(fh)
        except (OSError, ValueError):
            continue
        if isinstance(doc, dict) and doc.get("signature") == list(size) and \
                doc.get("config", {}).get("kernel") == "matmul":
            return doc
    return None


def start_hogs(n: int) -> list[subprocess.Popen]:
    """``n`` processes that keep one core busy each until stopped."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=256, help="N of the N x N x N matmul (default 256)")
    ap.add_argument("--runs", type=int, default=3, help="consecutive cltrace tune runs (default 3)")
    ap.add_argument("--hogs", type=int, default=1, help="CPU-heavy processes beside the runs (default 1)")
    ap.add_argument("--timeout", type=float, default=600, help="seconds one run may take (default 600)")
    ap.add_argument("--tune-args", default="", help="extra arguments for cltrace tune, e.g. '--strategy grid'")
    a = ap.parse_args()
    size = (a.size, a.size, a.size)
    cache = tempfile.mkdtemp(prefix="cltrace-tune-stability-")
    env = {**os.environ, "CLTRACE_CACHE_DIR": cache}
    env.pop("CLTRACE", None)
    extra = a.tune_args.split()

    probe = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=300)
    if probe.returncode != 0 and "--tiles" not in extra:
        err = [ln for ln in probe.stderr.splitlines() if "ERROR" in ln or "Error" in ln]
        print(f"note: this OpenCL compiler crashes on 16-wide float vectors ({err[0] if err else probe.returncode});"
              f" tiles limited to 8 wide: --tiles {NARROW_TILES}")
        extra += ["--tiles", NARROW_TILES]

    cmd = [sys.executable, "-m", "cltrace", "tune", "--size", str(a.size), "--no-progress", *extra]
    print(f"command: {' '.join(['cltrace'] + cmd[3:])}")
    print(f"tune store and each run's output (run-N.txt): {cache}; {a.hogs} CPU-heavy process(es) beside the runs")
    hogs = start_hogs(a.hogs)
    rows: list[tuple[Any, ...]] = []
    device = ""
    try:
        for i in range(1, a.runs + 1):
            t0 = time.perf_counter()
            out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=a.timeout)
            wall = time.perf_counter() - t0
            if out.returncode != 0:
                print(out.stdout[-3000:], out.stderr[-3000:], sep="\n", file=sys.stderr)
                print(f"run {i} failed with exit status {out.returncode}", file=sys.stderr)
                return 2
            first = out.stdout.splitlines()[0] if out.stdout else ""
            device = first.split(" on ", 1)[-1].split(" (", 1)[0] if " on " in first else device
            with open(os.path.join(cache, f"run-{i}.txt"), "w") as fh:
                fh.write(out.stdout)
            verdict = next((ln for ln in out.stdout.splitlines() if ln.startswith(("winner: ", "no real win"))), "")
            rows.append((i, wall, stored(cache, size), verdict))
            print(f"run {i}: {wall:.1f} s, {verdict[:160]}", flush=True)
        check = subprocess.run([sys.executable, "-m", "cltrace", "tune", "--check", "--size", str(a.size)],
                               env=env, capture_output=True, text=True, timeout=a.timeout)
    finally:
        for h in hogs:
            h.kill()
            h.wait()

    print()
    print(f"device: {device}; matmul {a.size}^3; {a.hogs} CPU hog(s)")
    head = (f"{'run':>3} {'wall s':>7}  {'winner stored':<30} {'median':>10} {'p10-p90':>21} "
            f"{'default median':>14} {'speed-up':>8}")
    print(head)
    print("-" * len(head))
    winners = []
    for i, wall, doc, _ in rows:
        if doc is None:
            winners.append(None)
            print(f"{i:>3} {wall:>7.1f}  {'none (default kept)':<30}")
            continue
        cfg = doc["config"]
        p = cfg["params"]
        label = (f"wg={'x'.join(map(str, p['workgroup'])) if p['workgroup'] else 'auto'} "
                 f"tile={'x'.join(map(str, p['tile'])) if p['tile'] else '-'} unroll={p['unroll']}")
        winners.append(label)
        fig = cfg.get("figures") or {}
        dflt = fig.get("default") or {}
        spread = f"{_fmt(fig.get('p10_ns'))}-{_fmt(fig.get('p90_ns'))}"
        speed = f"{fig['speedup']:.2f}x" if fig.get("speedup") else "-"
        print(f"{i:>3} {wall:>7.1f}  {label:<30} {_fmt(fig.get('median_ns')):>10} {spread:>21} "
              f"{_fmt(dflt.get('median_ns')):>14} {speed:>8}")
    chosen = {w for w in winners if w is not None}
    agree = len(chosen) <= 1
    print(f"same winner or none in all {a.runs} runs: {'yes' if agree else 'NO'} "
          f"({', '.join(sorted(chosen)) or 'none stored'})")
    print(f"tune --check (exit {check.returncode}): "
          + " / ".join(ln.strip() for ln in check.stdout.splitlines()[1:3]))
    return 0 if agree else 1


if __name__ == "__main__":
    sys.exit(main())
