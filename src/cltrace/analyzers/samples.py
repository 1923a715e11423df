"""What ``cltrace diff`` compares: each row's samples, one duration per occurrence, from a trace's columns.

A row is a kernel (its device time in each step where the run marks steps; else each launch's, the
first apart as in the kernel table: driver JIT and cold caches are not the kernel's speed), a region
(per occurrence, the device time of the commands launched inside it; host time where it launched
none) or the run's device time (its commands' in each step where the run marks steps; else the whole
run as one sample). Device rows measure the device's work, not how fast the host kept it fed: a host
slowed by a busy machine leaves the device idle between commands, which ``analyze`` reports. Samples
are kept whole, not summarised, so the gate can use medians and quartiles of both runs.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..timeline.spans import KERNEL, STEP
from .intervals import holder
from .kernels import device_codes, self_time
from .model import TraceData
from .regions import path_groups, region_tree
from .report import region_rows

Key = tuple[str, str, str]  # (kind, name, source): ("kernel", "gemm", "device")


@dataclass
class RowSamples:
    """One row of one run: how often it ran, its total and self time, and its samples (ns, sorted)."""

    count: int
    total_ns: int
    self_ns: int
    values: np.ndarray
    per: str = "call"  # what one sample is: a "call" (launch, occurrence), a "step", the "run"
    p99_ns: float | None = None

    @property
    def p50_ns(self) -> float:
        return float(np.percentile(self.values, 50)) if len(self.values) else float("nan")

    def quartiles(self) -> tuple[float, float, float]:
        p25, p50, p75 = np.percentile(self.values, (25, 50, 75))
        return float(p25), float(p50), float(p75)

    @property
    def typical_ns(self) -> float:
        """Its time with every sample at the median: what it costs, an outlier step or launch apart."""
        return self.p50_ns * len(self.values) if len(self.values) else 0.0

    @property
    def mean_ns(self) -> float:
        """The mean per sample (per call, or per step where the samples are steps)."""
        return float(self.values.mean()) if len(self.values) else 0.0


@dataclass
class RunSamples:
    """Every row of a run, its number of steps (0: none marked) and its time of each kind: the
    device time of its commands and the host wall time, the scale new rows are measured against."""

    rows: dict[Key, RowSamples] = field(default_factory=dict)
    steps: int = 0
    device_ns: int = 0
    wall_ns: int = 0

    def base_ns(self, source: str) -> int:
        return self.device_ns if source == "device" else self.wall_ns


TOTAL = "device time"  # the total row's name: per step where the run marks steps, else the run's

def _row(vals: np.ndarray, count: int | None = None, total: float | None = None,
         self_ns: float | None = None, per: str = "call") -> RowSamples:
    v = np.sort(vals.astype(np.float64))
    t = float(v.sum()) if total is None else total
    return RowSamples(count if count is not None else len(v), int(t), int(t if self_ns is None else self_ns), v,
                      per, float(np.percentile(v, 99)) if len(v) else None)


def _step_of(td: TraceData, rows: np.ndarray) -> np.ndarray:
    """Each row's step (its index among the run's steps, by host begin), -1 outside every step."""
    steps = np.flatnonzero(td.cat_mask(STEP))
    if not len(steps):
        return np.full(len(rows), -1, np.int64)
    order = steps[np.argsort(td.host_begin[steps], kind="stable")]
    return holder(td.host_begin[order], td.host_end[order], td.host_begin[rows])


def _kernels(td: TraceData, selfs: np.ndarray, per_device: bool) -> dict[Key, RowSamples]:
    """Per kernel: its device time in each step it ran in, where the run marks steps (a kernel
    launched with several shapes or arguments is one sample per step, not a spread of modes);
    else, or for a kernel launched outside every step, each launch after the first."""
    idx = np.flatnonzero(td.cat_mask(KERNEL) & td.on_device)
    if not len(idx):
        return {}
    names, dev = device_codes(td, idx)
    dur = (td.dev_end[idx] - td.dev_start[idx]).astype(np.float64)
    step = _step_of(td, idx)
    out = {}
    groups: dict[str, list[int]] = {}
    for k, (n, d) in enumerate(zip(td.name[idx].tolist(), dev.tolist())):
        groups.setdefault(td.names[n] + (f" on {names[d]}" if per_device else ""), []).append(k)
    for name, ks in groups.items():
        at = np.array(ks)
        total, own = float(dur[at].sum()), float(selfs[idx[at]].sum())
        inside = at[step[at] >= 0]
        if len(inside):
            steps, per_step = np.unique(step[inside], return_inverse=True)
            vals, per = np.bincount(per_step.ravel(), weights=dur[inside], minlength=len(steps)), "step"
        else:
            order = at[np.argsort(td.dev_start[idx[at]], kind="stable")]
            vals, per = dur[order[1:] if len(order) > 1 else order], "call"  # the first launch apart
        out[("kernel", name, "device")] = _row(vals, len(at), total, own, per)
    return out


def _regions(td: TraceData) -> dict[Key, RowSamples]:
    """Per region path and occurrence: the device time of the commands launched inside it; a
    region that launched none has its host time."""
    paths, group = path_groups(td)
    selfs = {(r["path"], r["source"]): r["self_ns"] for r in region_rows(region_tree(td))}
    is_region = td.regions
    work = np.flatnonzero(td.work)
    wdur = (td.dev_end[work] - td.dev_start[work]).astype(np.float64)
    out = {}
    for k, path in enumerate(paths):
        rows = np.flatnonzero((group == k) & is_region)
        if not len(rows):
            continue
        name = "/".join(path)
        under = np.array([v[:len(path)] == path for v in td.path_values] or [False], bool)
        mine = work[under[td.path[work]]] if len(work) else work
        if len(mine):
            rows = rows[np.argsort(td.host_begin[rows], kind="stable")]
            at = holder(td.host_begin[rows], td.host_end[rows], td.host_begin[mine])
            inside = at >= 0
            vals = np.bincount(at[inside], weights=wdur[under[td.path[work]]][inside], minlength=len(rows))
            src = "device"
        else:
            vals, src = (td.host_end[rows] - td.host_begin[rows]), "host"
        out[("region", name, src)] = _row(vals, self_ns=selfs.get((name, src)))
    return out


def _total(td: TraceData) -> tuple[dict[Key, RowSamples], int]:
    """The device time of the run's commands in each step (the run as one sample without steps)."""
    work = np.flatnonzero(td.work)
    dur = (td.dev_end[work] - td.dev_start[work]).astype(np.float64)
    nsteps = int(td.cat_mask(STEP).sum())
    if not len(work):
        return {}, nsteps
    if not nsteps:
        return {("total", TOTAL, "device"): _row(np.array([dur.sum()]), 1, per="run")}, 0
    step = _step_of(td, work)
    inside = step >= 0
    per_step = np.bincount(step[inside], weights=dur[inside], minlength=nsteps)
    return {("total", TOTAL, "device"): _row(per_step, total=float(dur.sum()), per="step")}, nsteps


def run_samples(td: TraceData, per_device: bool = False) -> RunSamples:
    """The rows of one run; ``per_device`` keys kernels by name and device (where either run has two)."""
    total, steps = _total(td)
    work = td.work
    rows = {**total, **_kernels(td, self_time(td), per_device), **_regions(td)}
    return RunSamples(rows, steps, int((td.dev_end[work] - td.dev_start[work]).sum()), td.wall_ns)


def devices(td: TraceData) -> int:
    """How many devices ran the run's kernels."""
    idx = np.flatnonzero(td.cat_mask(KERNEL) & td.on_device)
    return len(set(device_codes(td, idx)[1].tolist())) if len(idx) else 0


def whole(r: RowSamples) -> RowSamples:
    """A total row as one sample of the whole run (to compare a run with steps to one without)."""
    return RowSamples(r.count, r.total_ns, r.self_ns, np.array([float(r.total_ns)]), "run", float(r.total_ns))


__all__ = ["Key", "RowSamples", "RunSamples", "TOTAL", "devices", "run_samples", "whole"]
