"""Per rank, side by side: wall time, device busy and idle (the union of its kernels', transfers' and
fills' device intervals, so overlap on several queues counts once), and where the host's time went:
kernels' device time, transfers, waits for the device (``sync`` spans)."""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from .common import DEVICE_NS, WORK, Scope, rows


@dataclass
class RankRow:
    run: str
    rank: str
    service: str
    host: str
    pid: str
    spans: int
    wall_ns: int
    busy_ns: int  # device busy: union of the rank's device intervals
    idle_ns: int  # wall - busy
    busy_pct: float
    kernel_ns: int  # kernels' device time, summed
    transfer_ns: int  # transfers' and fills' device time
    wait_ns: int  # host time blocked waiting for the device
    kernels: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


# The union of a rank's device intervals is taken a second of its timeline at a time (each interval cut at
# the seconds it crosses): the window over them then holds one second's intervals, not the run's (a 45M-span
# run in one window took 6.5 GB), and the seconds' unions add up to the whole union exactly.
SLOT_NS = 1_000_000_000


def busy_cte(work: str) -> str:
    """The ``busy`` CTE: per (run, rank) the union of the device intervals of ``base`` rows of categories
    ``work`` (a SQL list), exact, a second at a time."""
    return f"""busy AS (
    SELECT run, rank, sum(greatest(toInt64(0), de - greatest(ds, prev))) AS busy_ns FROM (
        SELECT run, rank, cs AS ds, ce AS de, max(ce) OVER (PARTITION BY run, rank, slot ORDER BY cs, ce
                                                           ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev
        FROM (SELECT run, rank, slot, greatest(ds, slot * {SLOT_NS}) AS cs, least(de, (slot + 1) * {SLOT_NS}) AS ce
              FROM base ARRAY JOIN range(intDiv(ds, {SLOT_NS}), intDiv(de - 1, {SLOT_NS}) + 1) AS slot
              WHERE on_dev AND cat IN ({work}) AND de > ds AND ds >= 0))
    GROUP BY run, rank
)"""


def _sql(where: str) -> str:
    """The rank table; its per-rank sums aggregate in the table's (Run, Rank) order, not by hashing two
    strings a span (16 ranks x 1M spans: 0.5 CPU s less)."""
    work = ", ".join(f"'{c}'" for c in WORK)
    return f"""
WITH base AS (
    SELECT Run AS run, Rank AS rank, Service AS service, Host AS host, Pid AS pid, Cat AS cat, Begin AS b,
           End AS e, {DEVICE_NS} AS dev, HostNs AS host_ns, OnDevice AS on_dev, DevStart AS ds, DevEnd AS de
    FROM {{derived}} WHERE {where}
),
{busy_cte(work)}
SELECT t.run AS run, t.rank AS rank, service, host, pid, spans, wall_ns, ifNull(busy.busy_ns, 0) AS busy_ns,
       kernel_ns, transfer_ns, wait_ns, kernels
FROM (
    SELECT run, rank, any(service) AS service, any(host) AS host, any(pid) AS pid, count() AS spans,
           max(greatest(e, de)) - min(b) AS wall_ns, sumIf(dev, cat = 'kernel') AS kernel_ns,
           sumIf(dev, cat IN ('transfer', 'fill')) AS transfer_ns, sumIf(host_ns, cat = 'sync') AS wait_ns,
           countIf(cat = 'kernel') AS kernels
    FROM base GROUP BY run, rank) AS t
LEFT JOIN busy ON t.run = busy.run AND t.rank = busy.rank
ORDER BY run, length(rank), rank
SETTINGS join_use_nulls = 1, optimize_aggregation_in_order = 1"""


def rank_table(query: Any, scope: Scope) -> list[RankRow]:
    where, params = scope.where()
    out = []
    for r in rows(query, _sql(where), params):
        wall, busy = int(r["wall_ns"]), int(r["busy_ns"] or 0)
        out.append(RankRow(str(r["run"]), str(r["rank"]), str(r["service"]), str(r["host"]), str(r["pid"]),
                           int(r["spans"]), wall, busy, max(wall - busy, 0),
                           round(100.0 * busy / wall, 2) if wall else 0.0, int(r["kernel_ns"]),
                           int(r["transfer_ns"]), int(r["wait_ns"]), int(r["kernels"])))
    return out
