"""The run's findings with the ranks they hit: the rules of ``cltrace analyze FILE`` (``analyzers/findings``)
that the store computes as SQL, judged per rank, each rank as its own file would be.

One definition: each rule's thresholds are imported from its file module, the SQL follows its code
step by step (named in each function), and ``tests/test_store.py`` holds the rules that fire on each
rank, and the time at stake, equal to ``cltrace analyze`` of that rank's file. Rules computed here:

- ``blocking-in-loop`` (``analyzers/findings/sync``): blocking calls (``sync`` spans and transfers with
  ``blocking``) grouped by name and the region they were called from; a group of at least
  ``HOT_CALLS`` whose host time is ``WAIT_RATIO`` times its device time is hot; the rule fires where
  the hot groups' waits (host less device time) reach ``WALL_SHARE`` of the rank's wall time (first
  span, host or device, to the last end).
- ``small-transfers`` (``analyzers/findings/transfers``): at least ``MANY`` transfers under
  ``SMALL_BYTES`` (a transfer without a byte count is not small), and at least ``SHARE`` of all
  transfers; the time at stake is their host time.

The others (program builds, idle gaps and regions, launch-bound kernels) need what the store's
columns do not hold (build records, the device's shared self time) and stay with the file analysis.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from ...analyzers.findings import sync, transfers
from .common import DEVICE_NS, Scope, rows


@dataclass
class RankFinding:
    """One rule on one rank: the time at stake and what it is about (``detail``)."""

    run: str
    rank: str
    cost_ns: int
    detail: str = ""


@dataclass
class RunFinding:
    """A rule and the ranks it hits, most time at stake first."""

    rule: str
    cost_ns: int  # over the ranks
    ranks: list[RankFinding] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _wall(where: str) -> str:
    """Per rank, its wall time as ``analyzers.model.TraceData`` counts it."""
    return (f"SELECT Run, Rank, max(greatest(End, DevEnd)) - min(if(OnDevice, least(Begin, DevStart), Begin)) AS wall "
            f"FROM {{derived}} WHERE {where} GROUP BY Run, Rank")


def _blocking_sql(where: str) -> str:
    return f"""
WITH g AS (
    SELECT Run, Rank, arrayStringConcat(arrayPopBack(splitByChar('/', Path)), '/') AS place, Name AS name,
           count() AS c, sum(HostNs) AS h, sum({DEVICE_NS}) AS d
    FROM {{derived}} WHERE {where} AND (Cat = 'sync' OR (Cat = 'transfer' AND Blocking))
    GROUP BY Run, Rank, place, name
),
hot AS (
    SELECT Run, Rank, sum(h - d) AS wait, argMax((name, place, c), (h - d, name)) AS worst
    FROM g WHERE c >= {int(sync.HOT_CALLS)} AND h >= {float(sync.WAIT_RATIO)} * d GROUP BY Run, Rank
)
SELECT hot.Run AS run, hot.Rank AS rank, wait, worst FROM hot JOIN ({_wall(where)}) AS w
  ON hot.Run = w.Run AND hot.Rank = w.Rank
WHERE wait >= {float(sync.WALL_SHARE)} * wall"""


def _small_sql(where: str) -> str:
    small = f"Bytes > 0 AND Bytes < {int(transfers.SMALL_BYTES)}"
    return f"""
SELECT Run AS run, Rank AS rank, countIf({small}) AS small, count() AS n, sumIf(HostNs, {small}) AS host
FROM {{derived}} WHERE {where} AND Cat = 'transfer' GROUP BY Run, Rank
HAVING small >= {int(transfers.MANY)} AND small >= {float(transfers.SHARE)} * n"""


def run_findings(query: Any, scope: Scope) -> list[RunFinding]:
    """Each rule that fires on some rank, with the ranks it hits (most time at stake first)."""
    where, params = scope.where()
    found = {
        "blocking-in-loop": [RankFinding(str(r["run"]), str(r["rank"]), int(r["wait"]),
                                         f"{r['worst'][0]!r} in {r['worst'][1] or '(top level)'}, "
                                         f"{int(r['worst'][2])} times")
                             for r in rows(query, _blocking_sql(where), params)],
        "small-transfers": [RankFinding(str(r["run"]), str(r["rank"]), int(r["host"]),
                                        f"{int(r['small'])} of {int(r['n'])} transfers")
                            for r in rows(query, _small_sql(where), params)],
    }
    out = []
    for rule, hits in found.items():
        if hits:
            hits.sort(key=lambda h: (-h.cost_ns, h.run, h.rank))
            out.append(RunFinding(rule, sum(h.cost_ns for h in hits), hits))
    out.sort(key=lambda f: -f.cost_ns)
    return out
