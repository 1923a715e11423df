"""Tuned vs untuned tiled matmul on the default device, measured side by side in one run.

For each size: a coordinate sweep (``cltrace tune``'s default, with its confirmation
rounds), then the untuned default configuration and the chosen one launched in
alternating rounds on the same queue, device time from events (END - START).
Prints GFLOP/s, the ratio, and whether the tuner called it a real win (when it did
not, the chosen configuration is the default and the ratio is ~1).

    python benchmarks/bench_autotune.py [--sizes 256,512] [--rounds 5] [--runs 10]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from typing import Any

import cltrace
from cltrace.tune import Autotuner, Config
from cltrace.programs.compiler import default_queue
from cltrace.tune.kernels.matmul import MATMUL, MatmulProblem


def device_ns(queue: Any, config: Config, problem: MatmulProblem, runs: int) -> list[int]:
    """Device times of ``runs`` launches of one configuration (after one untimed launch)."""
    prg = MATMUL.compile(config, context=queue.context, device=queue.device)
    evs = [MATMUL.launch(prg, queue, problem.args, config) for _ in range(runs + 1)]
    evs[-1].wait()
    return [e.profile.end - e.profile.start for e in evs[1:]]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="256,512")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--runs", type=int, default=10)
    a = ap.parse_args()
    os.environ.setdefault("CLTRACE_CACHE_DIR", tempfile.mkdtemp(prefix="cltrace-bench-"))
    queue = default_queue()
    print(f"device: {queue.device.name.strip()} ({cltrace.programs.compiler.device_key(queue.device)})")
    rows = []
    for size in (int(s) for s in a.sizes.split(",")):
        problem = MatmulProblem(queue, size, size, size)
        tuner = Autotuner(queue, n_warmup=1, n=5, strategy="coordinate", progress=False, persist=False)
        t0 = time.perf_counter()
        res = tuner.tune(MATMUL, problem.args, output=problem.c, reference=problem.reference)
        sweep_s = time.perf_counter() - t0
        base_ns: list[int] = []
        best_ns: list[int] = []
        for _ in range(a.rounds):  # alternate, so drift and noise hit both alike
            base_ns += device_ns(queue, MATMUL.default, problem, a.runs)
            best_ns += device_ns(queue, res.best_config, problem, a.runs)
        g0 = problem.flops / statistics.median(base_ns)
        g1 = problem.flops / statistics.median(best_ns)
        rows.append((size, g0, g1, g1 / g0, res.best_config.label(), len(res.measurements), sweep_s, res.real_win))
    head = (f"{'size':>6} {'default GFLOP/s':>16} {'tuned GFLOP/s':>14} {'ratio':>7}  {'tuned config':<30} "
            f"{'trials':>6} {'sweep s':>8} {'real win':>8}")
    print(head)
    print("-" * len(head))
    for size, g0, g1, r, label, n, s, win in rows:
        print(f"{size:>6} {g0:>16.2f} {g1:>14.2f} {r:>6.2f}x  {label:<30} {n:>6} {s:>8.1f} {str(win):>8}")
    print("(median over rounds x runs of device time END-START; default = wg=auto tile=1x1 unroll=1)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
