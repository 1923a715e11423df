"""What every question reads the same way, over ``cltrace_spans`` (``store/derived``: a row's run,
rank, category, host and device times, derived once from the exporter's ``otel_traces``).

``{derived}`` in a question's SQL names that table. Device time is ``DevEnd - DevStart`` (0 off the
device); host time ``HostNs``; a span ends at ``End`` (its host return or its device end, the later).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

DEVICE_NS = "if(OnDevice, DevEnd - DevStart, 0)"
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
        parts = [f"Name != '{ROOT}'"]
        params: dict[str, Any] = {}
        if self.run is not None:
            parts.append("Run = {run:String}")
            params["run"] = str(self.run)
        if self.rank is not None:
            parts.append("Rank = {rank:String}")
            params["rank"] = str(self.rank)
        if self.service is not None:
            parts.append("Service = {service:String}")
            params["service"] = self.service
        return " AND ".join(parts), params


def quote(text: str) -> str:
    """A ClickHouse string literal (for values that go where a query parameter cannot: a WINDOW clause)."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def rows(query: Any, sql: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    """Result rows of ``query(sql, params)`` as dicts, by the column aliases in ``sql``'s outer SELECT."""
    result = query(sql, params)
    names = result.column_names
    return [dict(zip(names, r)) for r in result.result_rows]
