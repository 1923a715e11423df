"""SQL expressions shared by the questions, over the exporter's ``otel_traces`` columns.

A row's rank is its resource's ``cltrace.rank`` (``record/job``), else ``host.name:process.pid``;
its run ``cltrace.run.id`` (empty where none was given). Device time is END - START of its events
(cltrace's OTLP mapping puts the device stamps there); host time is ``cltrace.host.duration_ns``,
else ``Duration``. Times are Unix ns.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

RANK = ("if(ResourceAttributes['cltrace.rank'] != '', ResourceAttributes['cltrace.rank'], "
        "concat(ResourceAttributes['host.name'], ':', ResourceAttributes['process.pid']))")
RUN = "ResourceAttributes['cltrace.run.id']"
CAT = "SpanAttributes['cltrace.category']"
BEGIN = "toUnixTimestamp64Nano(Timestamp)"
_EV = "toUnixTimestamp64Nano(Events.Timestamp[indexOf(Events.Name, '{}')])"
ON_DEVICE = "has(Events.Name, 'START')"
DEV_START = f"if({ON_DEVICE}, {_EV.format('START')}, 0)"
DEV_END = f"if({ON_DEVICE}, {_EV.format('END')}, 0)"
DEVICE_NS = f"if({ON_DEVICE}, {_EV.format('END')} - {_EV.format('START')}, 0)"
HOST_NS = ("if(SpanAttributes['cltrace.host.duration_ns'] != '', toInt64OrZero(SpanAttributes['cltrace.host.duration_ns']), "
           "toInt64(Duration))")
ROOT = "cltrace.run"  # the run's root span: its own category, left out of the questions
WORK = ("kernel", "transfer", "fill")


@dataclass
class Scope:
    """Which rows a question reads: a run, a rank, a service (None: all)."""

    run: str | None = None
    rank: str | None = None
    service: str | None = None

    def where(self) -> tuple[str, dict[str, Any]]:
        """(SQL condition, its parameters) selecting the scope's rows (the root spans left out)."""
        parts = [f"SpanName != '{ROOT}'"]
        params: dict[str, Any] = {}
        if self.run is not None:
            parts.append(f"{RUN} = {{run:String}}")
            params["run"] = str(self.run)
        if self.rank is not None:
            parts.append(f"{RANK} = {{rank:String}}")
            params["rank"] = str(self.rank)
        if self.service is not None:
            parts.append("ServiceName = {service:String}")
            params["service"] = self.service
        return " AND ".join(parts), params


def rows(query: Any, sql: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    """Result rows of ``query(sql, params)`` as dicts, by the column aliases in ``sql``'s outer SELECT."""
    result = query(sql, params)
    names = result.column_names
    return [dict(zip(names, r)) for r in result.result_rows]
