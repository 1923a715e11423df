"""Busy and idle time per device and per queue, and why the device sat idle.

Over the run's wall interval (first span to last), a queue is busy while any of its commands
(kernels, transfers, fills) runs, by device stamps. Every idle nanosecond is put in one of three
bins, so busy + host-bound + host-blocked + other = wall exactly:

* host-blocked: the host was inside a blocking call (finish, wait, blocking read) meanwhile;
* host-bound: the queue was empty, the next command not yet enqueued: the device waited on the host;
* other: the next command was enqueued but had not started (driver latency, dependencies).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..timeline.spans import KERNEL, TRANSFER
from .intervals import Coverage, intersect, union
from .model import TraceData

TIMELINE_BINS = 400


@dataclass
class Use:
    """Busy/idle time of one queue or one device over the wall interval (ns)."""

    name: str
    device: str
    commands: int
    wall_ns: int
    busy_ns: int
    host_bound_ns: int
    host_blocked_ns: int
    other_ns: int
    transfer_kernel_overlap_ns: int | None = None  # devices with more than one queue
    queues: list[str] = field(default_factory=list)
    track: int | None = None  # the queue's track id (None for a device)
    # Idle gaps between commands (not before the first or after the last): start, end (ns).
    gap_start: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64), repr=False)
    gap_end: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64), repr=False)

    @property
    def idle_ns(self) -> int:
        return self.wall_ns - self.busy_ns

    @property
    def busy_pct(self) -> float:
        return 100.0 * self.busy_ns / self.wall_ns if self.wall_ns else 0.0

    def as_dict(self) -> dict[str, Any]:
        d = {"name": self.name, "device": self.device, "commands": self.commands, "wall_ns": self.wall_ns,
             "busy_ns": self.busy_ns, "busy_pct": round(self.busy_pct, 3), "idle_ns": self.idle_ns,
             "idle": {"host_bound_ns": self.host_bound_ns, "host_blocked_ns": self.host_blocked_ns,
                      "other_ns": self.other_ns}}
        if self.queues:
            d["queues"] = list(self.queues)
        if self.transfer_kernel_overlap_ns is not None:
            d["transfer_kernel_overlap_ns"] = self.transfer_kernel_overlap_ns
        return d


def _use(td: TraceData, idx: np.ndarray, blocked: Coverage, name: str, device: str) -> Use:
    """Every length is measured inside the time analysed (``td.intervals``: a window may have gaps)."""
    us, ue, first = union(td.dev_start[idx], td.dev_end[idx])
    ga = np.r_[td.t0, ue]  # idle gaps: before the first interval, between them, after the last
    gb = np.maximum(np.r_[us, td.t1], ga)
    enq = np.r_[td.host_begin[idx[first]], td.t1]  # when the command that ends each gap was enqueued
    h = np.clip(enq, ga, gb)
    span = Coverage(*td.intervals)
    blk = blocked.within(ga, gb)
    bound = span.within(ga, h) - blocked.within(ga, h)
    length = span.within(ga, gb)
    return Use(name, device, int(len(idx)), td.wall_ns, int(span.within(us, ue).sum()), int(bound.sum()),
               int(blk.sum()), int((length - blk - bound).sum()), gap_start=ue[:-1], gap_end=us[1:])


def blocked_coverage(td: TraceData, threads: np.ndarray | None = None) -> Coverage:
    """The host's time inside blocking calls, within the time analysed; with ``threads``, those made on
    these thread tracks only."""
    b = td.blocking()
    if threads is not None:
        b &= np.isin(td.thread, threads)
    s, e, _ = union(td.host_begin[b], td.host_end[b])
    return Coverage(*intersect(s, e, *td.intervals))


class Blocking:
    """The blocking that can leave given commands waiting: that of their own process. In a merged
    trace each process blocks only its own queues (a child's ``finish`` does not hold the parent's
    queue back); a trace that does not say which process a thread is in is one process."""

    def __init__(self, td: TraceData) -> None:
        self.td = td
        self.process = td.process_of_threads()
        self._cache: dict[Any, Coverage] = {}

    def of(self, idx: np.ndarray) -> Coverage:
        """For the commands ``idx``: the blocking calls of the processes that launched them."""
        td, proc = self.td, self.process
        owners = {proc.get(t) for t in np.unique(td.thread[idx]).tolist()} if proc else {None}
        key = None if None in owners else frozenset(owners)
        cov = self._cache.get(key)
        if cov is None:
            threads = None if key is None else np.array([t for t, p in proc.items() if p in key], np.int64)
            cov = self._cache[key] = blocked_coverage(td, threads)
        return cov


def utilisation(td: TraceData) -> tuple[list[Use], list[Use]]:
    """(per device, per queue) busy and idle split, devices and queues in name order."""
    work = td.work
    blocking = Blocking(td)
    queues: list[Use] = []
    by_device: dict[str, list[int]] = {}
    for t, q in sorted(td.queues.items(), key=lambda kv: kv[1].name):
        idx = np.flatnonzero(work & (td.track == t))
        if not len(idx):
            continue
        queues.append(_use(td, idx, blocking.of(idx), q.name, q.device))
        queues[-1].track = t
        by_device.setdefault(q.device, []).append(t)
    kernel, transfer = td.cat_mask(KERNEL), td.cat_mask(TRANSFER)
    devices: list[Use] = []
    for dev, tracks in sorted(by_device.items()):
        on = work & np.isin(td.track, tracks)
        idx = np.flatnonzero(on)
        u = _use(td, idx, blocking.of(idx), dev, dev)
        u.queues = [td.queues[t].name for t in tracks]
        if len(tracks) > 1:
            ts, te, _ = union(td.dev_start[on & transfer], td.dev_end[on & transfer])
            ks, ke, _ = union(td.dev_start[on & kernel], td.dev_end[on & kernel])
            u.transfer_kernel_overlap_ns = int(Coverage(ts, te).within(ks, ke).sum())
        devices.append(u)
    return devices, queues


def timeline(td: TraceData, bins: int = TIMELINE_BINS) -> dict[str, Any]:
    """Busy fraction of each queue in ``bins`` equal slices of the wall interval (for the plot)."""
    edges = np.linspace(td.t0, td.t1, bins + 1).astype(np.int64)
    width = np.maximum(np.diff(edges), 1)
    out: dict[str, Any] = {"t0_ns": td.t0, "bin_ns": int(width[0]) if len(width) else 0, "queues": {}}
    work = td.work
    for t, q in sorted(td.queues.items(), key=lambda kv: kv[1].name):
        idx = work & (td.track == t)
        if not idx.any():
            continue
        s, e, _ = union(td.dev_start[idx], td.dev_end[idx])
        busy = Coverage(s, e).within(edges[:-1], edges[1:]) / width
        out["queues"][q.name] = np.round(busy, 4).tolist()
    return out
