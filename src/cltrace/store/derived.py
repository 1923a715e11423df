"""``cltrace_spans``: the few columns the questions read, derived once from the exporter's rows.

Reading a rank out of ``ResourceAttributes`` or a category out of ``SpanAttributes`` is a scan of a map
per row: over 16M rows that is tens of seconds on two cores, every question. So each row of
``otel_traces`` is derived once into a narrow table (LowCardinality strings and integers, ordered by
run, rank and time) by ``COLUMNS``, one SQL expression each over the exporter's columns, and the
questions read that. Rows cltrace loads are derived as they are loaded (the per-process and per-set
expressions once per set, ``load``); rows a collector wrote are derived by ``sync`` before a question
runs: any trace whose row count differs between the two tables (the exporter's
``otel_traces_trace_id_ts`` lists them) is derived afresh.
"""
from __future__ import annotations

import os
import threading
from typing import Any

TABLE = "cltrace_spans"
_EV = "toUnixTimestamp64Nano(Events.Timestamp[indexOf(Events.Name, '{}')])"
ON_DEVICE = "has(Events.Name, 'START')"
# (column, type, expression over otel_traces). A row's rank is its resource's cltrace.rank (record/job),
# else host.name:process.pid; its run cltrace.run.id (empty where none was given). Device times are
# the START and END events (cltrace's OTLP mapping puts the device stamps there), 0 without them;
# host time is cltrace.host.duration_ns, else Duration. Times are Unix ns.
PER_SET = (
    ("Run", "LowCardinality(String)", "ResourceAttributes['cltrace.run.id']"),
    ("Rank", "LowCardinality(String)", "if(ResourceAttributes['cltrace.rank'] != '', ResourceAttributes['cltrace.rank'], "
                                       "concat(ResourceAttributes['host.name'], ':', ResourceAttributes['process.pid']))"),
    ("Service", "LowCardinality(String)", "ServiceName"),
    ("Host", "LowCardinality(String)", "ResourceAttributes['host.name']"),
    ("Pid", "LowCardinality(String)", "ResourceAttributes['process.pid']"),
    ("Name", "LowCardinality(String)", "SpanName"),
    ("Cat", "LowCardinality(String)", "SpanAttributes['cltrace.category']"),
    ("Path", "LowCardinality(String)", "if(SpanAttributes['cltrace.path'] != '', SpanAttributes['cltrace.path'], SpanName)"),
    ("Device", "LowCardinality(String)", "SpanAttributes['cltrace.device.name']"),
    # what the findings read (questions/findings): a blocking call (record attribute ``blocking``), bytes moved
    ("Blocking", "UInt8", "SpanAttributes['cltrace.blocking'] = 'true'"),
    ("Bytes", "Int64", "toInt64OrZero(SpanAttributes['cltrace.bytes'])"),
)
PER_ROW = (
    ("TraceId", "String", "TraceId"),
    ("SpanId", "String", "SpanId"),
    ("Begin", "Int64", "toUnixTimestamp64Nano(Timestamp)"),
    ("End", "Int64", "toUnixTimestamp64Nano(Timestamp) + toInt64(Duration)"),
    ("HostNs", "Int64", "if(SpanAttributes['cltrace.host.duration_ns'] != '', "
                        "toInt64OrZero(SpanAttributes['cltrace.host.duration_ns']), toInt64(Duration))"),
    ("OnDevice", "UInt8", ON_DEVICE),
    ("DevStart", "Int64", f"if({ON_DEVICE}, {_EV.format('START')}, 0)"),
    ("DevEnd", "Int64", f"if({ON_DEVICE}, {_EV.format('END')}, 0)"),
)
COLUMNS = PER_SET + PER_ROW
NAMES = [c for c, _, _ in COLUMNS]


def ddl(db: str) -> str:
    cols = ", ".join(f"{c} {t}" for c, t, _ in COLUMNS)
    return (f'CREATE TABLE IF NOT EXISTS "{db}"."{TABLE}" ({cols}) ENGINE = MergeTree '
            f"ORDER BY (Run, Rank, Begin) SETTINGS index_granularity = 8192")


def ensure(client: Any, db: str) -> None:
    """Create ``cltrace_spans``; one of an older cltrace with other columns is dropped and made anew
    (it is derived data: ``sync`` derives every trace again)."""
    got = [r[0] for r in client.query(f"SELECT name FROM system.columns WHERE database = {{d:String}} "
                                      f"AND table = '{TABLE}' ORDER BY position", parameters={"d": db}).result_rows]
    if got and got != NAMES:
        client.command(f'DROP TABLE IF EXISTS "{db}"."{TABLE}"')
    client.command(ddl(db))


def select(source: str, where: str = "") -> str:
    """The derivation of ``source``'s rows (an otel_traces table), as a SELECT in ``NAMES`` order."""
    return f"SELECT {', '.join(f'{e} AS {c}' for c, _, e in COLUMNS)} FROM {source}" + (f" WHERE {where}" if where else "")


def per_set(source: str) -> str:
    """The per-set columns (and ``Set``) of a sets table whose columns are named as otel_traces's."""
    return f"SELECT Set, TraceId, {', '.join(f'{e} AS {c}' for c, _, e in PER_SET)} FROM {source}"


def sync(client: Any, db: str, table: str) -> int:
    """Derive the rows of every trace whose count in ``table`` differs from ``cltrace_spans``'s (rows a
    collector wrote, or more of them since); returns the rows derived. Costs two counts where nothing
    is missing."""
    src, dst = f'"{db}"."{table}"', f'"{db}"."{TABLE}"'
    (n_src,), = client.query(f"SELECT count() FROM {src}").result_rows
    (n_dst,), = client.query(f"SELECT count() FROM {dst}").result_rows
    if n_src == n_dst:
        return 0
    stale = f'"{db}"."cltrace_stale_{os.getpid()}_{threading.get_ident()}"'
    client.command(f"DROP TABLE IF EXISTS {stale}")
    client.command(
        f"CREATE TABLE {stale} ENGINE = Memory AS SELECT TraceId FROM "
        f"(SELECT TraceId, count() AS n FROM {src} GROUP BY TraceId) AS a "
        f"LEFT JOIN (SELECT TraceId, count() AS n FROM {dst} GROUP BY TraceId) AS b USING TraceId "
        f"WHERE a.n != b.n SETTINGS join_use_nulls = 0")
    try:
        client.command(f"DELETE FROM {dst} WHERE TraceId IN (SELECT TraceId FROM {stale})")
        client.command(f"INSERT INTO {dst} ({', '.join(NAMES)}) "
                       f"{select(src, f'TraceId IN (SELECT TraceId FROM {stale})')}")
        (n,), = client.query(f"SELECT count() FROM {dst} WHERE TraceId IN (SELECT TraceId FROM {stale})").result_rows
    finally:
        client.command(f"DROP TABLE IF EXISTS {stale}")
    return int(n)
