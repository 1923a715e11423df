"""Stragglers: per step, the ranks whose step took longest beyond the median of all ranks, and why.

A step is a span of category ``step`` (a scheduled session's) or a span named ``step_name`` (a user's
``region("step")``); each rank's steps are numbered in time order, so step k of every rank is
compared. A rank straggles at step k when its step took more than ``threshold_pct`` over the median
of the ranks at k. Step times come from the step spans alone (a window over the steps, not over
every span), read once: one group per step number gives its median, its median rank's step and the
steps over it (ClickHouse computes a CTE again wherever it is named, so none is named twice); only
the steps that straggle are then split into parts, each against the same part of
the median rank at that step (the rank whose step time is the middle one; of an even count, the
faster of the two middle ones). A step's parts are those of the spans its rank began inside it:
kernels (device time), transfers and fills (device time), waits for the device (``sync`` host time)
and the host's own time (the step's host time less that of every OpenCL call recorded in it:
launches, transfers, fills, waits; a launch that blocks while the device works counts as the device's,
and so does the part of the step after its host side returned, until its device work ended). Spans
are matched to those steps by an equi-join on time buckets (one median step long) and the step's
interval, so the cost is a scan of the calls and a hash lookup each, and no sort of every span.
The cause is the device (kernels or transfers, the larger) where their excess
explains at least half of the step's: device work is what a host waits for, in calls or between them,
so host time that grows with it is its effect; else the host, where its own excess does; else
"waiting" (waiting on something the trace does not show, such as another rank). Only aggregates come
back: per rank that straggled its steps, excess and cause, with its ``top`` worst steps as evidence
(their span ids looked up afterwards for those steps alone). Evidence: the step span's trace and span id, and where it
starts on its rank's timeline (seconds from the rank's first span), to find it in Perfetto.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from .common import DEVICE_NS, Scope, quote, rows

PARTS = ("kernels", "transfers", "host", "waiting")
CALLS = ("kernel", "transfer", "fill", "sync")  # the OpenCL calls whose host time is not the host's own


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


@dataclass
class SlowRank:
    """A rank that straggled: at how many steps, by how much in all, its parts' excess summed, the
    cause of the sum, and its worst step."""

    run: str
    rank: str
    steps: int
    excess_ns: float
    cause: str
    excess_by_part: dict[str, float] = field(default_factory=dict)
    worst_step: int = 0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _is_step(step_name: str) -> str:
    """A step span, as SQL: category ``step`` (a scheduled session's) or named ``step_name``."""
    return f"(Cat = 'step' OR Name = {quote(step_name)})"


def _key(run: str, rank: str, bucket: str) -> str:
    """The join's key of a span or a wanted step: its run's, rank's and time bucket's, one integer (keys of
    two strings took a third of the join's time); the join's WHERE then compares run, rank and time exactly,
    so a collision costs a row, not a wrong answer."""
    return f"bitXor(cityHash64({run}), cityHash64({rank})) + {bucket}"


def _sql(where: str, step_name: str, per_rank: int) -> str:
    step = _is_step(step_name)
    width = "{width:Int64}"
    span_key = _key("Run", "Rank", f"toUInt64(intDiv(Begin, {width}))")
    step_key = _key("run", "rank", f"arrayJoin(range(toUInt64(intDiv(sb, {width})), toUInt64(intDiv(se, {width})) + 1))")
    calls = ", ".join(f"'{c}'" for c in CALLS)
    xs = ", ".join(f"x_{p}" for p in PARTS)
    return f"""
WITH steps AS (
    SELECT Run AS run, Rank AS rank, Begin AS sb, End AS se, End - Begin AS sd,
           row_number() OVER (PARTITION BY Run, Rank ORDER BY Begin) - 1 AS step
    FROM {{derived}} WHERE {where} AND {step}
),
med AS (
    SELECT run, step, median(sd) AS m_sd, count() AS n, arraySort(groupArray((sd, rank, sb, se))) AS g,
           g[intDiv(n + 1, 2)] AS m
    FROM steps GROUP BY run, step
),
wanted AS (
    SELECT run, step, s.2 AS of, s.1 AS sd, m_sd, s.1 - m_sd AS excess, s.3 AS slow_b,
           arrayJoin([(s.2, s.3, s.4, 1), (m.2, m.3, m.4, -1)]) AS pair, pair.1 AS rank, pair.2 AS sb, pair.3 AS se,
           pair.4 AS sign
    FROM med ARRAY JOIN g AS s
    WHERE n >= 2 AND s.1 > m_sd * (1 + {{threshold:Float64}} / 100)
),
split AS (
    SELECT w.run AS run, w.of AS of, w.step AS step, w.sign AS sign, any(w.sd) AS sd, any(w.m_sd) AS m_sd,
           any(w.excess) AS excess, any(w.slow_b) AS slow_b,
           sumIf(dev, cat = 'kernel') AS kernels, sumIf(dev, cat IN ('transfer', 'fill')) AS transfers,
           sumIf(host_ns, cat = 'sync') AS waiting,
           greatest(toInt64(0), sumIf(host_ns, c.Begin = w.sb AND is_step) - sumIf(host_ns, cat IN ({calls}))) AS host
    FROM (SELECT Run, Rank, Begin, {span_key} AS k, Cat AS cat, {DEVICE_NS} AS dev, HostNs AS host_ns, {step} AS is_step
          FROM {{derived}} WHERE {where} AND (Cat IN ({calls}) OR {step})) AS c
    JOIN (SELECT *, {step_key} AS k FROM wanted) AS w ON c.k = w.k
    WHERE c.Run = w.run AND c.Rank = w.rank AND c.Begin >= w.sb AND c.Begin < w.se
    GROUP BY run, of, step, sign
),
x AS (
    SELECT run, of AS rank, step, anyIf(sd, sign = 1) AS sd, anyIf(m_sd, sign = 1) AS m_sd,
           anyIf(excess, sign = 1) AS excess, anyIf(slow_b, sign = 1) AS sb,
           {", ".join(f"sum(sign * toInt64({p})) AS x_{p}" for p in PARTS)}
    FROM split GROUP BY run, of, step
)
SELECT run, rank, count() AS steps, sum(excess) AS total_excess, {", ".join(f"sum(x_{p}) AS sum_{p}" for p in PARTS)},
       argMax(step, excess) AS worst,
       arraySlice(arraySort(t -> -t.4, groupArray((step, sd, m_sd, excess, {xs}, sb))), 1, {int(per_rank)}) AS top
FROM x GROUP BY run, rank ORDER BY total_excess DESC"""


def cause(excess: dict[str, float], total: float) -> str:
    """The part that explains the excess (see the module docstring)."""
    device = max(("kernels", "transfers"), key=lambda k: excess[k])
    if excess[device] > 0 and excess["kernels"] + excess["transfers"] >= 0.5 * total:
        return device
    if excess["host"] > 0 and excess["host"] >= 0.5 * total:
        return "host"
    return "waiting"


def _width(query: Any, where: str, step_name: str, params: dict[str, Any]) -> int:
    """The join's time bucket: the median step's length (a parameter of the query, not a subquery in it: each
    place that names a scalar subquery computes it again)."""
    sql = (f"SELECT greatest(toInt64(ifNotFinite(median(End - Begin), 1.0)), 1) AS w FROM {{derived}} "
           f"WHERE {where} AND {_is_step(step_name)}")
    return int(rows(query, sql, params)[0]["w"])


def stragglers(query: Any, scope: Scope, step_name: str = "step", threshold_pct: float = 10.0,
               top: int = 10) -> tuple[list[SlowRank], list[Straggler]]:
    """(the ranks that straggled, slowest first; the ``top`` straggling steps of all, largest excess first)."""
    where, params = scope.where()
    params = {**params, "threshold": float(threshold_pct)}
    params["width"] = _width(query, where, step_name, params)
    ranks, steps = [], []
    for r in rows(query, _sql(where, step_name, top or 1_000_000), params):
        summed = {p: float(r[f"sum_{p}"] or 0) for p in PARTS}
        total = float(r["total_excess"])
        ranks.append(SlowRank(str(r["run"]), str(r["rank"]), int(r["steps"]), total, cause(summed, total), summed,
                              int(r["worst"])))
        for step, sd, med, excess, *rest in r["top"]:
            x = dict(zip(PARTS, (float(v or 0) for v in rest[:len(PARTS)])))
            steps.append((Straggler(str(r["run"]), str(r["rank"]), int(step), int(sd), float(med), float(excess),
                                    round(100.0 * excess / med, 2) if med else 0.0, cause(x, float(excess)), x),
                          int(rest[len(PARTS)])))
    steps.sort(key=lambda s: -s[0].excess_ns)
    steps = steps[:top] if top else steps
    _evidence(query, scope, step_name, steps)
    return ranks, [s for s, _ in steps]


def _evidence(query: Any, scope: Scope, step_name: str, steps: list[tuple[Straggler, int]]) -> None:
    """Each step's span ids and place on its rank's timeline, looked up for these steps alone (carrying
    the ids through the window pass would carry 48 bytes of every span)."""
    if not steps:
        return
    where, params = scope.where()
    keys = sorted({(s.run, s.rank, b) for s, b in steps})
    ranks = sorted({(r, k) for r, k, _ in keys})
    params = {**params, "keys": keys, "ranks": ranks}
    got = {(r["run"], r["rank"], int(r["b"])): r for r in rows(query, f"""
SELECT s.Run AS run, s.Rank AS rank, s.Begin AS b, s.TraceId AS trace_id, s.SpanId AS span_id, o.t0 AS t0
FROM {{derived}} AS s
JOIN (SELECT Run, Rank, min(Begin) AS t0 FROM {{derived}} WHERE {where} AND (Run, Rank) IN {{ranks:Array(Tuple(String, String))}}
      GROUP BY Run, Rank) AS o ON s.Run = o.Run AND s.Rank = o.Rank
WHERE (s.Run, s.Rank, s.Begin) IN {{keys:Array(Tuple(String, String, Int64))}} AND (s.Cat = 'step' OR s.Name = {quote(step_name)})""",
        params)}
    for s, b in steps:
        r = got.get((s.run, s.rank, b))
        if r is not None:
            s.trace_id, s.span_id, s.at_s = str(r["trace_id"]), str(r["span_id"]), round((b - int(r["t0"])) / 1e9, 6)
