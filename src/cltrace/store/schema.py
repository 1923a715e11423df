"""The OpenTelemetry Collector ClickHouse exporter's trace schema, applied as the exporter applies it.

The ``schema/*.sql`` files are the exporter's own templates, unchanged, from
open-telemetry/opentelemetry-collector-contrib ``exporter/clickhouseexporter/internal/sqltemplates/``
(the generation with ``ScopeName``/``ScopeVersion`` columns and ``Duration UInt64``):
``traces_table.sql`` at commit f92a5763be13aeb59ecf6f8b47e31d54109191bb,
``traces_id_ts_lookup_table.sql`` and ``traces_insert.sql`` at 61540ced55e993255df9bcfca48ed89a87d3914f,
``traces_id_ts_lookup_mv.sql`` at 57b29d74154d72320747c8dd2a0b4a1629a39187. The exporter fills their
``%s`` with Go's ``fmt.Sprintf``: database and table names, the ``ON CLUSTER`` clause (empty on one
server), the table engine (``MergeTree()`` by default) and the TTL clause (empty: no TTL); ``render``
does the same. ``traces_insert.sql`` is the column list the exporter inserts, which ``load`` follows.

Beside the exporter's tables cltrace keeps two of its own: ``cltrace_loads``, a row per file loaded
(its content hash), so loading a file twice is a no-op; and ``cltrace_spans`` (``derived``), the
columns the questions read, derived from the exporter's rows.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from . import derived

HERE = Path(__file__).parent / "schema"
DATABASE = "otel"
TABLE = "otel_traces"
ENGINE = "MergeTree()"
LOADS = "cltrace_loads"


def template(name: str) -> str:
    """One of the exporter's SQL templates, as shipped."""
    return (HERE / name).read_text(encoding="utf-8")


def _sprintf(text: str, *args: str) -> str:
    parts = text.split("%s")
    if len(parts) != len(args) + 1:
        raise ValueError(f"template takes {len(parts) - 1} values, got {len(args)}")
    return "".join(p + a for p, a in zip(parts, args + ("",)))


def render(database: str = DATABASE, table: str = TABLE, cluster: str = "", engine: str = ENGINE,
           ttl: str = "") -> list[str]:
    """The DDL statements the exporter runs at start: traces table, trace-id lookup table, its view."""
    on = f"ON CLUSTER {cluster}" if cluster else ""
    return [
        _sprintf(template("traces_table.sql"), database, table, on, engine, ttl),
        _sprintf(template("traces_id_ts_lookup_table.sql"), database, table, on, engine, ttl),
        _sprintf(template("traces_id_ts_lookup_mv.sql"), database, table, on, database, table, database, table),
    ]


def insert_columns() -> list[str]:
    """The columns the exporter inserts, in its order (from ``traces_insert.sql``)."""
    body = template("traces_insert.sql").split("(", 1)[1].split(")", 1)[0]
    return [c.strip() for c in body.split(",") if c.strip()]


def loads_ddl(database: str = DATABASE) -> str:
    return (f'CREATE TABLE IF NOT EXISTS "{database}"."{LOADS}" (FileHash String, Path String, '
            f"TraceId String, Spans UInt64, RunId String, Rank String, LoadedAt DateTime DEFAULT now()) "
            f"ENGINE = {ENGINE} ORDER BY FileHash")


def apply(client: Any, database: str = DATABASE, table: str = TABLE) -> None:
    """Create the database, the exporter's tables and view, and ``cltrace_loads`` where missing."""
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", database) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", table):
        raise ValueError("database and table names: letters, digits and _ only")
    client.command(f'CREATE DATABASE IF NOT EXISTS "{database}"')
    for ddl in render(database, table):
        client.command(ddl)
    client.command(loads_ddl(database))
    derived.ensure(client, database)
