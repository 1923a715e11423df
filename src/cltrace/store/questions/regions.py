"""Region totals in the store: per region path, calls, total and mean host time, across ranks, as
``analyzers.regions`` defines them on a file (host time)."""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from .common import Scope, rows

REGION_CATS = ("region", "step", "autotune", "trial")


@dataclass
class RegionRow:
    path: str
    name: str
    count: int
    total_ns: int
    mean_ns: float
    max_ns: int
    ranks: int
    slowest_rank: str  # the rank with the largest total

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def region_table(query: Any, scope: Scope, top: int = 0) -> list[RegionRow]:
    where, params = scope.where()
    cats = ", ".join(f"'{c}'" for c in REGION_CATS)
    limit = f"LIMIT {int(top)}" if top else ""
    sql = f"""
SELECT path, any(name) AS name, sum(c) AS count, sum(t) AS total_ns, max(mx) AS max_ns, count() AS ranks,
       argMax(rank, t) AS slowest
FROM (SELECT Path AS path, Name AS name, Rank AS rank, count() AS c, sum(HostNs) AS t, max(HostNs) AS mx
      FROM {{derived}} WHERE {where} AND Cat IN ({cats}) GROUP BY path, name, rank)
GROUP BY path ORDER BY total_ns DESC, path {limit}"""
    return [RegionRow(str(r["path"]), str(r["name"]), int(r["count"]), int(r["total_ns"]),
                      int(r["total_ns"]) / max(int(r["count"]), 1), int(r["max_ns"]), int(r["ranks"]), str(r["slowest"]))
            for r in rows(query, sql, params)]
