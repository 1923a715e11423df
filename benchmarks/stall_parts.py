"""Which part of cltrace makes a traced thread's longest pause: the stall loop, one part on at a time.

    python benchmarks/stall_parts.py [--seconds 1] [--trials 5] [--variants untraced,files]

Two threads run bench_pipeline's stall loop (50 launches + finish + an empty region) for ``--seconds``;
each variant is run once per trial, variants alternating, all at the switch interval cltrace sets while
tracing. Printed: the median (and range) of each variant's longest pause, its excess over untraced, and
the median iterations a second of both threads together (what the variant costs the loop).

  untraced     the loop alone
  hot path     traced, the worker held off and the reaper paused: records keep their events, nothing
               reads a stamp or takes the GIL beside the launching threads until the trial ends
  reaper       the same with the reaper on (tickets, and the launching threads' harvests)
  no harvest   the reaper on, the harvest off (its native thread reads what is stale)
  worker       the reaper on and the worker resolving into memory (no file)
  files        all of it: ``.json`` + ``.pftrace`` (bench_pipeline's stall row)
  files-noharvest   the same with the harvest off
  files-hold / files-release   the same, a harvest while others launch keeping the GIL through all of its wait
               for the device (2 ms) / only for its reads (the default: through the first 0.2 ms of the wait)
  files-k512 / files-k2048   the same, a harvest every 512 / 2048 commands alone (64 / 256 while others launch)
  files-nostats   the same without the statistics pass (its numpy calls each hand the GIL over)
  files-json / files-pftrace   one file only
  files-step2k / files-step32k   worker steps of up to 2 048 / 32 768 records (8 192 by default)
"""
from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
from typing import Callable, Iterator

import cltrace
from cltrace.record.recorder import RECORDER
from cltrace.timeline import stamps

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from stall_probe import loop, setup  # noqa: E402

READ = ("tracked", "harvested", "harvests", "harvests_declined", "harvest_ms")

if stamps.REAPER is not None:
    from cltrace._ext import stamps as _stamps
else:
    _stamps = None


@contextlib.contextmanager
def worker_held() -> Iterator[None]:
    """The worker resolves nothing until the trial ends (no wake-up, no back-pressure below 4M records)."""
    RECORDER.configure(resolve_interval_s=3600, max_pending=1 << 22)
    try:
        yield
    finally:
        RECORDER.configure(resolve_interval_s=0.05, max_pending=65_536)


@contextlib.contextmanager
def reaper(paused: bool = False, harvest: bool = True, hold: int = -1, every: int = -1) -> Iterator[None]:
    if _stamps is None:
        yield
        return
    was_paused = _stamps.pause_reaper(paused)
    was = _stamps.reaper_config(250_000, 2_000_000)
    _stamps.reaper_config(*was[:2], (was[2] if every < 0 else every) if harvest else 0, *was[3:5], hold)
    try:
        yield
    finally:
        _stamps.reaper_config(*was)
        _stamps.pause_reaper(was_paused)


@contextlib.contextmanager
def no_stats() -> Iterator[None]:
    """Experiment: the worker's statistics pass skipped (its numpy calls each hand the GIL over)."""
    RECORDER.stats.add = lambda batch: None  # type: ignore[method-assign]
    try:
        yield
    finally:
        del RECORDER.stats.add


@contextlib.contextmanager
def step_rows(n: int) -> Iterator[None]:
    """Experiment: worker steps of up to ``n`` records (half that waits for the next wake)."""
    from cltrace.record import recorder

    was = recorder.STEP_ROWS, recorder.MIN_STEP_ROWS
    recorder.STEP_ROWS, recorder.MIN_STEP_ROWS = n, n // 2
    try:
        yield
    finally:
        recorder.STEP_ROWS, recorder.MIN_STEP_ROWS = was


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=1.0)
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--variants", default="", help="comma-separated, the first is the baseline (default: all)")
    a = ap.parse_args()
    q, prg, buf = setup()
    interval = RECORDER.switch_interval_s or sys.getswitchinterval()
    tmp = tempfile.mkdtemp()

    def traced(*ctx: Callable[[], contextlib.AbstractContextManager],
               files: bool | str = False) -> Callable[[], tuple[float, float, int]]:
        def run() -> tuple[float, float, int]:
            RECORDER.clear()
            before = stamps.reaper_stats()
            try:
                return traced_run()
            finally:
                after = stamps.reaper_stats()
                if before and after:
                    for key in READ:
                        reads[key] = reads.get(key, 0) + after[key] - before[key]

        def traced_run() -> tuple[float, float, int]:
            with contextlib.ExitStack() as stack:
                for c in ctx:
                    stack.enter_context(c())
                kinds = ("json", "pftrace") if files is True else (files,) if files else ()
                paths = [os.path.join(tmp, f"s.{k}") for k in kinds]
                with cltrace.trace(*paths):
                    return loop(q, prg, buf, a.seconds)
        return run

    def untraced() -> tuple[float, float, int]:
        old = sys.getswitchinterval()
        sys.setswitchinterval(interval)
        try:
            return loop(q, prg, buf, a.seconds)
        finally:
            sys.setswitchinterval(old)

    reads: dict[str, int] = {}
    variants: dict[str, Callable[[], tuple[float, float, int]]] = {
        "untraced": untraced,
        "hot path": traced(worker_held, lambda: reaper(paused=True)),
        "reaper": traced(worker_held, reaper),
        "no harvest": traced(worker_held, lambda: reaper(harvest=False)),
        "worker": traced(reaper),
        "files": traced(reaper, files=True),
        "files-noharvest": traced(lambda: reaper(harvest=False), files=True),
        "files-hold": traced(lambda: reaper(hold=2_000_000), files=True),
        "files-release": traced(lambda: reaper(hold=0), files=True),
        "files-k512": traced(lambda: reaper(every=512), files=True),
        "files-k2048": traced(lambda: reaper(every=2048), files=True),
        "files-nostats": traced(reaper, no_stats, files=True),
        "files-json": traced(reaper, files="json"),
        "files-pftrace": traced(reaper, files="pftrace"),
        "files-step2k": traced(reaper, lambda: step_rows(2048), files=True),
        "files-step32k": traced(reaper, lambda: step_rows(32768), files=True),
    }
    chosen = a.variants.split(",") if a.variants else list(variants)
    variants = {k: variants[k] for k in chosen}
    worst: dict[str, list[float]] = {k: [] for k in variants}
    rate: dict[str, list[float]] = {k: [] for k in variants}
    loop(q, prg, buf, 0.2)  # warm-up
    for t in range(a.trials):
        for name, run in variants.items():
            w, _, done = run()
            worst[name].append(w)
            rate[name].append(done / a.seconds)
        print(f"trial {t}: " + ", ".join(f"{k} {v[-1] * 1e3:.1f}" for k, v in worst.items()), flush=True)
    if reads:
        print(f"reaper, all traced runs: {reads['harvested']:,} of {reads['tracked']:,} commands read by the "
              f"launching threads in {reads['harvests']:,} harvests ({reads['harvest_ms']:,} ms), "
              f"{reads['harvests_declined']:,} declined")
    base = statistics.median(worst[chosen[0]])
    print(f"\n{a.trials} trials of {a.seconds:g} s, switch interval {interval * 1e3:g} ms; reaper: {stamps.REAPER_DETAIL}")
    print(f"{'variant':<18} {'median':>9} {'range':>15} {'over ' + chosen[0]:>14} {'iterations/s':>13}")
    for name, v in worst.items():
        m = statistics.median(v)
        print(f"{name:<18} {m * 1e3:7.2f} ms {min(v) * 1e3:6.1f}-{max(v) * 1e3:.1f} ms {(m - base) * 1e3:+11.2f} ms "
              f"{statistics.median(rate[name]):13,.0f}")


if __name__ == "__main__":
    main()
