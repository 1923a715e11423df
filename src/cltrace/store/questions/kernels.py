"""The kernel table in the store, and each kernel's pace across ranks.

Per kernel name and device, as ``analyzers.kernels.kernel_table`` defines them on a file: launches,
total device time, the first launch's time, and the steady-state mean (launches after the first; the
only one when there is one); tests hold the two equal on the same trace. Across ranks: each rank's
mean launch time, their min / median / max, the slowest rank and the spread (max / min - 1).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from .common import DEVICE_NS, Scope, rows


@dataclass
class KernelPace:
    name: str
    device: str
    count: int
    total_ns: int
    first_ns: int
    mean_ns: float
    p50_ns: float
    p99_ns: float
    ranks: int
    rank_mean_min_ns: float
    rank_mean_median_ns: float
    rank_mean_max_ns: float
    slowest_rank: str
    spread_pct: float  # slowest rank's mean over the fastest's, minus 1

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _sql(where: str, top: int) -> str:
    limit = f"LIMIT {int(top)}" if top else ""
    return f"""
WITH k AS (
    SELECT Name AS name, Device AS device, Run AS run, Rank AS rank, {DEVICE_NS} AS dev, Begin AS b
    FROM {{derived}} WHERE {where} AND Cat = 'kernel' AND OnDevice
),
per_rank AS (
    SELECT name, device, run, rank, count() AS c, sum(dev) AS t, argMin(dev, b) AS first,
           if(c > 1, (t - first) / (c - 1), toFloat64(t)) AS m, min(b) AS b0
    FROM k GROUP BY name, device, run, rank
),
pace AS (
    SELECT name, device, sum(c) AS count, sum(t) AS total_ns, argMin(first, b0) AS first_ns, count() AS ranks,
           min(m) AS lo, median(m) AS mid, max(m) AS hi, argMax(rank, m) AS slowest, sum(first) AS sum_first
    FROM per_rank GROUP BY name, device
),
dist AS (
    SELECT name, device, quantilesExactIf(0.5, 0.99)(dev, b != first_b) AS q, count() AS c
    FROM k ANY LEFT JOIN (SELECT name, device, run, rank, b0 AS first_b FROM per_rank) AS f
      ON k.name = f.name AND k.device = f.device AND k.run = f.run AND k.rank = f.rank
    GROUP BY name, device
)
SELECT pace.name AS name, pace.device AS device, count, total_ns, first_ns,
       if(count > ranks, (total_ns - sum_first) / (count - ranks), total_ns / count) AS mean_ns,
       q[1] AS p50_ns, q[2] AS p99_ns, ranks, lo, mid, hi, slowest
FROM pace
JOIN dist ON pace.name = dist.name AND pace.device = dist.device
ORDER BY total_ns DESC, name {limit}"""


def kernel_pace(query: Any, scope: Scope, top: int = 0) -> list[KernelPace]:
    where, params = scope.where()
    out = []
    for r in rows(query, _sql(where, top), params):
        lo, hi = float(r["lo"]), float(r["hi"])
        out.append(KernelPace(str(r["name"]), str(r["device"]), int(r["count"]), int(r["total_ns"]),
                              int(r["first_ns"]), float(r["mean_ns"]), float(r["p50_ns"] or 0), float(r["p99_ns"] or 0),
                              int(r["ranks"]), lo, float(r["mid"]), hi, str(r["slowest"]),
                              round(100.0 * (hi / lo - 1), 2) if lo > 0 else 0.0))
    return out
