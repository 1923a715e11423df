"""Launch statistics: what a kernel costs the host to enqueue against what it runs on the device,
and how many commands each queue held over time.

A launch is *launch-bound* when its device time is shorter than its host enqueue cost: the host
cannot issue such kernels as fast as the device finishes them, so adding device speed buys nothing.
Queue depth counts commands enqueued (host call began) and not yet finished (device END).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from ..timeline.spans import KERNEL
from .kernels import percentiles
from .model import TraceData, dense

DEPTH_BINS = 400


@dataclass
class LaunchRow:
    name: str
    count: int
    enqueue_mean_ns: float
    enqueue_p50_ns: float
    device_mean_ns: float
    device_p50_ns: float
    launch_bound: int  # launches whose device time was shorter than their enqueue cost

    @property
    def launch_bound_pct(self) -> float:
        return 100.0 * self.launch_bound / self.count if self.count else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "launch_bound_pct": round(self.launch_bound_pct, 3)}


@dataclass
class Launches:
    count: int
    launch_bound: int
    enqueue_ns: int  # host time spent inside enqueue calls, all kernels
    device_ns: int
    rows: list[LaunchRow]
    depth: dict[str, dict[str, Any]]  # queue name -> {"max", "mean", "t0_ns", "bin_ns", "max_per_bin"}

    @property
    def launch_bound_pct(self) -> float:
        return 100.0 * self.launch_bound / self.count if self.count else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {"count": self.count, "launch_bound": self.launch_bound,
                "launch_bound_pct": round(self.launch_bound_pct, 3), "enqueue_ns": self.enqueue_ns,
                "device_ns": self.device_ns, "kernels": [r.as_dict() for r in self.rows], "queue_depth": self.depth}


def launches(td: TraceData, bins: int = DEPTH_BINS) -> Launches:
    idx = np.flatnonzero(td.cat_mask(KERNEL) & td.on_device)
    enq = (td.host_end[idx] - td.host_begin[idx]).astype(np.float64)
    dev = (td.dev_end[idx] - td.dev_start[idx]).astype(np.float64)
    bound = dev < enq
    codes, group = dense(td.name[idx])
    ng = len(codes)
    counts = np.bincount(group, minlength=ng)
    n = np.maximum(counts, 1)
    enq_mean, dev_mean = np.bincount(group, enq, ng) / n, np.bincount(group, dev, ng) / n
    (enq_p50,), (dev_p50,) = percentiles(enq, group, ng, (0.5,)), percentiles(dev, group, ng, (0.5,))
    nbound = np.bincount(group, bound.astype(np.float64), ng)
    rows = [LaunchRow(td.names[codes[k]], int(counts[k]), float(enq_mean[k]), float(enq_p50[k]),
                      float(dev_mean[k]), float(dev_p50[k]), int(nbound[k])) for k in range(ng)]
    rows.sort(key=lambda r: (-r.launch_bound, -r.count, r.name))
    return Launches(len(idx), int(bound.sum()), int(enq.sum()), int(dev.sum()), rows, queue_depth(td, bins))


def queue_depth(td: TraceData, bins: int = DEPTH_BINS) -> dict[str, dict[str, Any]]:
    """Per queue: the most commands in flight at once, the time-weighted mean, and the maximum
    in each of ``bins`` equal slices of the wall interval."""
    out: dict[str, dict[str, Any]] = {}
    work = td.work
    edges = np.linspace(td.t0, td.t1, bins + 1).astype(np.int64)
    for t, q in sorted(td.queues.items(), key=lambda kv: kv[1].name):
        idx = np.flatnonzero(work & (td.track == t))
        if not len(idx):
            continue
        times = np.r_[td.host_begin[idx], td.dev_end[idx]]
        steps = np.r_[np.ones(len(idx), np.int64), -np.ones(len(idx), np.int64)]
        order = np.lexsort((steps, times))  # at equal times, the finish before the next enqueue
        times, depth = times[order], np.cumsum(steps[order])
        held = np.diff(np.r_[times, td.t1])
        span = max(td.t1 - td.t0, 1)
        # max per bin: the depth carried into the bin and every depth reached inside it
        at = np.searchsorted(times, edges[:-1], side="right") - 1
        carried = np.where(at >= 0, depth[np.maximum(at, 0)], 0)
        inside = np.searchsorted(times, edges[:-1], side="left")
        per_bin = carried.copy()
        nonempty = inside < np.searchsorted(times, edges[1:], side="left")
        if nonempty.any():
            red = np.maximum.reduceat(depth, inside[nonempty])
            per_bin[nonempty] = np.maximum(per_bin[nonempty], red)
        out[q.name] = {"max": int(depth.max()), "mean": round(float((depth * held).sum() / span), 3),
                       "t0_ns": td.t0, "bin_ns": int((td.t1 - td.t0) / bins), "max_per_bin": per_bin.tolist()}
    return out
