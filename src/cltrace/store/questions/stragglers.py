"""Stragglers: per step, the ranks whose step took longest beyond the median of all ranks, and why.

A step is a span of category ``step`` (a scheduled session's) or a span named ``step_name`` (a user's
``region("step")``); each rank's steps are numbered in time order, so step k of every rank is
compared. A rank straggles at step k when its step took more than ``threshold_pct`` over the median
of the ranks at k. Its time is split as the rank spent it inside the step (spans it began there):
kernels (device time), transfers and fills (device time), waits for the device (``sync`` host time)
and the host's own time (the step's host time less that of every OpenCL call recorded in it:
launches, transfers, fills, waits; a launch that blocks while the device works counts as the device's,
and so does the part of the step after its host side returned, until its device work ended); each part is compared
with the median rank's. The cause is the device (kernels or transfers, the larger) where their excess
explains at least half of the step's: device work is what a host waits for, in calls or between them,
so host time that grows with it is its effect; else the host, where its own excess does; else
"waiting" (waiting on something the
trace does not show, such as another rank). The step of a span is found with an ASOF join (the
latest step begun at or before it on its rank), run as a sort-merge join: chDB's hash joins refuse ASOF. Evidence: the step span's trace and span id, and where it
starts on its rank's timeline (seconds from the rank's first span), to find it in Perfetto.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from .common import DEVICE_NS, Scope, rows

PARTS = ("kernels", "transfers", "host", "waiting")


@dataclass
class Straggler:
    run: str
    rank: str
    step: int
    step_ns: int
    median_ns: float
    excess_ns: float
    excess_pct: float
    cause: str
    excess_by_part: dict[str, float] = field(default_factory=dict)  # the part's time less the median rank's
    trace_id: str = ""
    span_id: str = ""
    at_s: float = 0.0  # where the step starts: seconds after the rank's first span

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _sql(where: str, step_name: str) -> str:
    return f"""
WITH spans_ AS (
    SELECT Run AS run, Rank AS rank, Cat AS cat, Name AS name, Begin AS b, End - Begin AS d,
           {DEVICE_NS} AS dev, HostNs AS host_ns, TraceId, SpanId
    FROM {{derived}} WHERE {where}
),
origin AS (SELECT run, rank, min(b) AS t0 FROM spans_ GROUP BY run, rank),
steps AS (
    SELECT run, rank, b AS sb, b + d AS se, d AS sd, host_ns AS sh, TraceId AS trace_id, SpanId AS span_id,
           row_number() OVER (PARTITION BY run, rank ORDER BY b) - 1 AS step
    FROM spans_ WHERE cat = 'step' OR name = {{step_name:String}}
),
parts AS (
    SELECT run, rank, step, sumIf(dev, cat = 'kernel') AS kernels, sumIf(dev, cat IN ('transfer', 'fill')) AS transfers,
           sumIf(host_ns, cat = 'sync') AS waiting, sumIf(host_ns, cat IN ('kernel', 'transfer', 'fill', 'sync')) AS calls_host
    FROM (SELECT x.run AS run, x.rank AS rank, x.cat AS cat, x.b AS b, x.dev AS dev, x.host_ns AS host_ns,
                 s.step AS step, s.se AS se
          FROM (SELECT * FROM spans_ WHERE cat != 'step' AND name != {{step_name:String}}) AS x
          ASOF LEFT JOIN steps AS s ON x.run = s.run AND x.rank = s.rank AND x.b >= s.sb)
    WHERE b < se
    GROUP BY run, rank, step
),
per AS (
    SELECT s.run AS run, s.rank AS rank, s.step AS step, s.sd AS sd, s.sb AS sb, s.trace_id AS trace_id,
           s.span_id AS span_id, p.kernels AS kernels, p.transfers AS transfers, p.waiting AS waiting,
           greatest(toInt64(0), s.sh - p.calls_host) AS host
    FROM steps AS s LEFT JOIN parts AS p ON s.run = p.run AND s.rank = p.rank AND s.step = p.step
),
med AS (
    SELECT run, step, median(sd) AS m_sd, median(kernels) AS m_k, median(transfers) AS m_t, median(host) AS m_h,
           median(waiting) AS m_w, count() AS n
    FROM per GROUP BY run, step
)
SELECT per.run AS run, per.rank AS rank, per.step AS step, sd, m_sd, n, kernels - m_k AS x_kernels,
       transfers - m_t AS x_transfers, host - m_h AS x_host, waiting - m_w AS x_waiting, trace_id, span_id,
       (sb - origin.t0) / 1e9 AS at_s
FROM per JOIN med ON per.run = med.run AND per.step = med.step
JOIN origin ON per.run = origin.run AND per.rank = origin.rank
WHERE n >= 2 AND sd > m_sd * (1 + {{threshold:Float64}} / 100)
ORDER BY sd - m_sd DESC
SETTINGS join_algorithm = 'full_sorting_merge', join_use_nulls = 0"""


def cause(excess: dict[str, float], total: float) -> str:
    """The part that explains the excess (see the module docstring)."""
    device = max(("kernels", "transfers"), key=lambda k: excess[k])
    if excess[device] > 0 and excess["kernels"] + excess["transfers"] >= 0.5 * total:
        return device
    if excess["host"] > 0 and excess["host"] >= 0.5 * total:
        return "host"
    return "waiting"


def stragglers(query: Any, scope: Scope, step_name: str = "step", threshold_pct: float = 10.0,
               top: int = 0) -> list[Straggler]:
    where, params = scope.where()
    params = {**params, "step_name": step_name, "threshold": float(threshold_pct)}
    out = []
    for r in rows(query, _sql(where, step_name), params):
        sd, med = int(r["sd"]), float(r["m_sd"])
        excess = {p: float(r[f"x_{p}"] or 0) for p in PARTS}
        out.append(Straggler(str(r["run"]), str(r["rank"]), int(r["step"]), sd, med, sd - med,
                             round(100.0 * (sd - med) / med, 2) if med else 0.0, cause(excess, sd - med), excess,
                             str(r["trace_id"]), str(r["span_id"]), round(float(r["at_s"]), 6)))
        if top and len(out) >= top:
            break
    return out
