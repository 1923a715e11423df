"""Cyclic GC passes during stall_parts variants: how long the longest collection of each generation took.

    python benchmarks/gc_during.py [stall_parts arguments]

Runs ``stall_parts.main()`` with a ``gc.callbacks`` hook that times every collection (wall, per
generation), then prints per generation the count, longest and total: a pause of a launching thread that
matches a collection's length was the collector's, not the driver's or the worker's.
"""
from __future__ import annotations

import gc
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import stall_parts  # noqa: E402

_t0: list[int] = [0]
_spans: dict[int, list[int]] = {0: [], 1: [], 2: []}


def _hook(phase: str, info: dict) -> None:
    if phase == "start":
        _t0[0] = time.perf_counter_ns()
    else:
        _spans[info["generation"]].append(time.perf_counter_ns() - _t0[0])


def main() -> None:
    gc.callbacks.append(_hook)
    try:
        stall_parts.main()
    finally:
        gc.callbacks.remove(_hook)
    print("\ngeneration  collections  longest     total")
    for g, d in _spans.items():
        print(f"{g:>10}  {len(d):>11}  {max(d, default=0) / 1e6:6.2f} ms  {sum(d) / 1e6:7.1f} ms")


if __name__ == "__main__":
    main()
