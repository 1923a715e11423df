"""``cltrace tune``: autotune the tiled matmul example on the default device and keep a real win;
``--check`` re-measures a stored winner and evicts it when it no longer wins."""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ..analyzers.report import format_ns
from ..export.base import create_output, partial_path, put_in_place
from .checks import check_device, check_plot_path, whole_number


def _size(value: str) -> tuple[int, int, int]:
    try:
        parts = [int(p) for p in value.lower().split("x")]
    except ValueError:
        parts = []
    if len(parts) == 1:
        parts *= 3
    if len(parts) != 3 or min(parts) < 1:
        raise argparse.ArgumentTypeError(f"size must be N or MxNxK with positive integers, not {value!r}")
    return parts[0], parts[1], parts[2]


def _shapes(value: str) -> list[tuple[int, ...] | None]:
    """``auto,8x4,16x8`` -> [None, (8, 4), (16, 8)]."""
    out: list[tuple[int, ...] | None] = []
    for item in value.split(","):
        item = item.strip().lower()
        if not item:
            continue
        if item in ("auto", "none"):
            out.append(None)
            continue
        try:
            out.append(tuple(int(p) for p in item.split("x")))
        except ValueError:
            raise argparse.ArgumentTypeError(f"bad shape {item!r}: write AxB, e.g. 8x4 (or auto)") from None
    if not out:
        raise argparse.ArgumentTypeError("empty list")
    return out


def _ints(value: str) -> list[int]:
    try:
        out = [int(p) for p in value.split(",") if p.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, not {value!r}") from None
    if not out:
        raise argparse.ArgumentTypeError("empty list")
    return out


def add_tune_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``cltrace tune``."""
    parser.add_argument("--size", type=_size, default=(512, 512, 512), metavar="N|MxNxK",
                        help="matrix sizes: C[M,N] = A[M,K] @ B[K,N] (default 512)")
    parser.add_argument("--strategy", choices=("coordinate", "grid"), default="coordinate",
                        help="coordinate: one parameter at a time around the best (default, fast); "
                             "grid: every combination")
    parser.add_argument("--workgroups", type=_shapes, metavar="LIST",
                        help="work-group shapes to try, e.g. auto,8x4,16x8 (default: from the device limits)")
    parser.add_argument("--tiles", type=_shapes, metavar="LIST",
                        help="tiles TILE_XxTILE_Y to try, e.g. 1x1,4x4,8x4 (default: from the device)")
    parser.add_argument("--unroll", type=_ints, metavar="LIST", help="unroll factors, e.g. 1,2,4")
    parser.add_argument("-n", "--runs", type=whole_number(1), default=10, help="timed launches per trial (default 10)")
    parser.add_argument("--warmup", type=whole_number(0), default=1,
                        help="untimed launches per trial (default 1: the first launch carries the JIT)")
    parser.add_argument("--no-check", action="store_true", help="do not check each trial's result against numpy")
    parser.add_argument("--no-persist", action="store_true", help="do not store the winner in the tune DB")
    parser.add_argument("--confirm", type=whole_number(0), default=5, metavar="K",
                        help="re-measure the K fastest and the untuned default in interleaved rounds "
                             "before choosing (default 5; 0: decide on the sweep alone)")
    parser.add_argument("--rounds", type=whole_number(1), default=5,
                        help="interleaved confirmation rounds (default 5, 3 launches per candidate each)")
    parser.add_argument("--check", action="store_true",
                        help="do not sweep: re-measure the winner stored for --size against the default "
                             "and evict it if it no longer wins")
    parser.add_argument("--top", type=whole_number(0), default=15, help="rows of the ranked table (default 15; 0: all)")
    parser.add_argument("--plot", metavar="FILE", help="save a chart of the sweep (needs cltrace[plot])")
    parser.add_argument("--out", metavar="TRACE", action="append",
                        help="also trace the sweep to this file (.json, .pftrace; repeatable)")
    parser.add_argument("--json", metavar="FILE", help="write every trial as JSON")
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                        help="progress bar (default: when stderr is a terminal)")


def _gflops(trial: Any, flops: float) -> str:
    """GFLOP/s at the median, with the p10-p90 range of device time."""
    g = trial.gflops(flops) if trial is not None and trial.ok else None
    if g is None:
        return "-"
    return (f"{g:.2f} GFLOP/s (median {format_ns(trial.median_ns)}, "
            f"p10-p90 {format_ns(trial.p10_ns)}-{format_ns(trial.p90_ns)})")


def _check(args: argparse.Namespace, tuner: Any, problem: Any) -> int:
    """``--check``: 0 when the stored winner still wins, 1 when it was evicted or none is stored."""
    from ..tune.kernels.matmul import MATMUL

    ver = tuner.verify(MATMUL, problem.args, rounds=args.rounds)
    print(ver.table(problem.flops))
    if ver.path is None:
        return 1
    if ver.kept:
        print(f"kept: {ver.path}")
        return 0
    print(f"evicted: {ver.path}  (cltrace.compile() of this matmul for these sizes now builds the untuned default)")
    return 1


def main_tune(args: argparse.Namespace) -> int:
    """Run the sweep, print the ranked table and the default-vs-tuned GFLOP/s; 0 if a trial succeeded."""
    from ..tune import Autotuner
    from ..tune.kernels.matmul import MATMUL, MatmulProblem
    from ..programs.compiler import default_queue
    from ..capture.session import trace

    if args.plot:
        check_plot_path(args.plot)  # before the sweep, not after it
    check_device()
    queue = default_queue()
    m, n, k = args.size
    problem = MatmulProblem(queue, m, n, k)
    tuner = Autotuner(queue, n_warmup=args.warmup, n=args.runs, strategy=args.strategy, progress=args.progress,
                      persist=not args.no_persist, confirm=args.confirm, rounds=args.rounds)
    if args.check:
        print(f"cltrace tune --check: matmul {m}x{k} @ {k}x{n} on {tuner.limits.device_name}", flush=True)
        return _check(args, tuner, problem)
    print(f"cltrace tune: matmul {m}x{k} @ {k}x{n} on {tuner.limits.device_name} "
          f"({tuner.limits.device_key}), strategy {args.strategy}, {args.warmup}+{args.runs} launches per trial, "
          f"then the {args.confirm} fastest and the default in {args.rounds} interleaved rounds", flush=True)
    check = {} if args.no_check else {"output": problem.c, "reference": problem.reference}

    def sweep() -> Any:
        return tuner.tune(MATMUL, problem.args, args.workgroups, args.tiles, args.unroll, **check)

    if args.out:
        with trace(*args.out, quiet=True):  # the paths are printed below
            result = sweep()
    else:
        result = sweep()

    print(result.table(top=args.top or None))
    print()
    flops = problem.flops
    default = result.default or MATMUL.default
    base = result.figures(default)
    print(f"untuned default  {default.label():<32} {_gflops(base, flops)}"
          + ("" if base is None or base.ok else f"  (failed: {base.reason})"))
    if result.best_config is None:
        print("no configuration ran successfully", file=sys.stderr)
        return 1
    if result.winner is not None and result.winner != default:
        speed = result.speedup()
        print(f"tuned best       {result.winner.label():<32} {_gflops(result.figures(result.winner), flops)}"
              + (f"  {speed:.2f}x the default" if speed else ""))
    else:
        print("tuned best       none: no configuration beats the default by more than the noise; default kept")
    if result.persisted:
        print(f"winner stored: {result.persisted}")
        print(f"  cltrace.compile() of this matmul source for {m}x{n}x{k} on this device and driver now builds "
              "the tuned variant")
    elif result.real_win is False and not args.no_persist:
        print("nothing stored" + (f"; removed the earlier winner {result.evicted}" if result.evicted else ""))
    if args.plot:
        print(f"wrote {result.plot(args.plot)}")
    if args.json:
        with create_output(partial_path(args.json), "w") as fh:  # renamed when whole: an earlier file is never half-replaced
            json.dump(result.as_dict(), fh, indent=1, default=str)
        put_in_place(args.json)
        print(f"wrote {args.json}")
    for path in args.out or ():
        print(f"wrote {path}  (open it in https://ui.perfetto.dev)")
    return 0
