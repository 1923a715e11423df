"""Loading trace files into the store: rows as the collector's exporter writes them, a chunk at a time.

A file is read into columns (``read.load_columns``), its attribute sets are mapped once each
(``rows.attribute_sets``) into a small table, and its rows go in ``chunk_rows`` at a time: numpy
columns into a staging table, then one ``INSERT ... SELECT`` that joins them to the sets and
builds the exporter's row (hex ids, ``SPAN_KIND_*``/``STATUS_CODE_*``, maps, nested events) inside
ClickHouse. Memory beyond the file's own columns is bounded by the chunk. Each file is loaded once:
``cltrace_loads`` keeps its content hash, and loading it again is a no-op (a load cut short is
cleared and redone). The rows' ``cltrace_spans`` rows (``derived``) are written beside them. Staging tables use the Memory engine, so on a cluster load through one node.
The exporter's skip indexes (bloom filters over ids and attribute keys and values) are left to the
table's merges instead of built at insert (``materialize_skip_indexes_on_insert = 0``): they cost
three quarters of an insert's time here, and only speed lookups, never change an answer.
"""
from __future__ import annotations

import hashlib
import os
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import TraceFileError
from ..export.otlp.mapping import Mapper
from ..read.batches import open_batches
from ..timeline.batch import SpanBatch
from . import derived, rows, schema, values
from .questions.common import quote

# Rows an insert. Each insert is a part the table merges later: 16 files x 1M spans, 2 at a time, took 302 CPU s in
# 2.2 GB with 100k, 259 in 3.1 GB with 300k, 258 in 4.1 GB with 1M (a file in one insert); a second pair on a
# busier host, 368 s in 2.6 GB against 338 in 2.8 GB (wall 190 -> 174 s).
CHUNK_ROWS = 300_000
_STAGE_COLS = (("Ts", "Int64"), ("Dur", "UInt64"), ("Sid", "UInt64"), ("Pid", "UInt64"), ("HasParent", "UInt8"),
               ("HostDur", "Int64"), ("Dev", "UInt8"), ("DevDur", "Int64"), ("Q", "Int64"), ("Su", "Int64"),
               ("St", "Int64"), ("En", "Int64"), ("Set", "UInt32"), ("PerRow", "UInt8"))
# The sets' maps have plain String keys: the join copies a Map(LowCardinality(String), String) onto each row one
# element at a time (300k rows: 0.58 CPU s), plain strings in bulk; the insert casts the keys back (300k rows:
# the exporter's INSERT ... SELECT 2.2 -> 1.2 CPU s with the resource map below).
_SET_COLS = (("Set", "UInt32"), ("Name", "String"), ("Attrs", "Map(String, String)"),
             ("Code", "String"), ("Msg", "String"), ("TraceId", "String"), ("Service", "String"),
             ("Resource", "Map(String, String)"), ("Scope", "String"), ("ScopeVersion", "String"))


@dataclass
class LoadResult:
    path: str
    spans: int  # rows written (the cltrace.run root included); 0 when skipped
    seconds: float
    skipped: bool  # already in the store
    trace_id: str
    file_hash: str


def file_hash(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _ns(expr: str) -> str:
    return f"fromUnixTimestamp64Nano({expr})"


def _literal(resource: dict[str, str]) -> str:
    """A resource's attributes as a ClickHouse map, the same for every row of the file. Materialised with
    String keys, which the insert casts: a constant Map(LowCardinality(String), String) is copied onto the
    rows one element at a time (300k rows of 7 attributes: 0.42 CPU s, against 0.02)."""
    pairs = ", ".join(f"{quote(k)}, {quote(v)}" for k, v in resource.items())
    return f"materialize(map({pairs}))"


def _threads(threads: int | None) -> str:
    """The setting that gives an insert ``threads`` of the engine's threads ("" for its default)."""
    return "" if threads is None else f"max_threads = {int(threads)}"


def _insert_sql(db: str, table: str, stage: str, sets: str, resource: dict[str, str], threads: int | None = None) -> str:
    hex16 = "leftPad(lower(hex({})), 16, '0')"
    # a set's attributes never hold the per-row ones, so concatenating is mapUpdate's result; and the root row's
    # empty map inside, rather than an if() over two copies of the set's: 300k rows, 0.27 -> 0.13 CPU s
    host = "'cltrace.host.duration_ns'"
    per_row = f"map({host}, toString(s.HostDur), 'cltrace.device.duration_ns', toString(s.DevDur))"
    events_attrs = "arrayResize(CAST([], 'Array(Map(LowCardinality(String), String))'), if(s.Dev, 4, 0))"
    select = [
        _ns("s.Ts"), "t.TraceId", hex16.format("s.Sid"), f"if(s.HasParent, {hex16.format('s.Pid')}, '')", "''",
        "t.Name", f"'{values.SPAN_KINDS[1]}'", "t.Service", _literal(resource), "t.Scope", "t.ScopeVersion",
        f"mapConcat(t.Attrs, multiIf(s.PerRow = 0, CAST(map(), 'Map(String, String)'), s.Dev, {per_row}, "
        f"map({host}, toString(s.HostDur))))",
        "s.Dur", "t.Code", "t.Msg",
        f"if(s.Dev, [{_ns('s.Q')}, {_ns('s.Su')}, {_ns('s.St')}, {_ns('s.En')}], [])",
        "if(s.Dev, ['QUEUED', 'SUBMIT', 'START', 'END'], [])", events_attrs,
        "CAST([], 'Array(String)')", "CAST([], 'Array(String)')", "CAST([], 'Array(String)')",
        "CAST([], 'Array(Map(LowCardinality(String), String))')",
    ]
    cols = ", ".join(f"`{c}`" for c in schema.insert_columns())
    return (f'INSERT INTO "{db}"."{table}" ({cols}) SELECT {", ".join(select)} '
            f'FROM "{db}"."{stage}" AS s ANY LEFT JOIN "{db}"."{sets}" AS t ON s.Set = t.Set '
            f"SETTINGS {', '.join(filter(None, ('materialize_skip_indexes_on_insert = 0', _threads(threads))))}")


def _derive_sql(db: str, stage: str, sets: str, threads: int | None = None) -> str:
    """The loaded rows' ``cltrace_spans`` rows: ``derived.PER_SET`` evaluated once per set (the sets table's
    columns named as otel_traces's), the per-row columns from the values the rows were built from."""
    named = (f'(SELECT Set, TraceId, Name AS SpanName, Attrs AS SpanAttributes, Resource AS ResourceAttributes, '
             f'Service AS ServiceName FROM "{db}"."{sets}")')
    rows = {"TraceId": "t.TraceId", "SpanId": "leftPad(lower(hex(s.Sid)), 16, '0')", "Begin": "s.Ts",
            "End": "s.Ts + toInt64(s.Dur)", "HostNs": "if(s.PerRow, s.HostDur, toInt64(s.Dur))", "OnDevice": "s.Dev",
            "DevStart": "s.St", "DevEnd": "s.En"}
    cols = [f"t.{c}" for c, _, _ in derived.PER_SET] + [rows[c] for c, _, _ in derived.PER_ROW]
    return (f'INSERT INTO "{db}"."{derived.TABLE}" ({", ".join(derived.NAMES)}) SELECT {", ".join(cols)} '
            f'FROM "{db}"."{stage}" AS s ANY LEFT JOIN ({derived.per_set(named)}) AS t ON s.Set = t.Set'
            + (f" SETTINGS {_threads(threads)}" if threads is not None else ""))


def _create(client: Any, db: str, name: str, cols: tuple) -> None:
    client.command(f'DROP TABLE IF EXISTS "{db}"."{name}"')
    client.command(f'CREATE TABLE "{db}"."{name}" ({", ".join(f"{c} {t}" for c, t in cols)}) ENGINE = Memory')


WINDOWED_CHUNK_ROWS = 30_000


def load_file(client: Any, path: str, db: str = schema.DATABASE, table: str = schema.TABLE,
              service_name: str | None = None, run_id: str | None = None, rank: str | int | None = None,
              chunk_rows: int = CHUNK_ROWS, threads: int | None = None,
              windowed_from: int | None = None) -> LoadResult:
    """Load one ``.json``/``.pftrace`` file (see the module docstring). ``threads``: the engine's
    threads for each of its inserts (None: the engine's default). A file of ``windowed_from`` bytes or more
    (None: ``read.batches.WINDOWED_FROM`` of its format) is read a window at a time (memory bounded by the
    window, whatever the file's size); a smaller one, or one outside cltrace's layout, whole. Raises
    TraceFileError for a file cltrace cannot read."""
    t0 = time.perf_counter()
    if not os.path.isfile(path):
        raise TraceFileError(f"{'is a directory' if os.path.isdir(path) else 'no such file'}: {path}")
    digest = file_hash(path)
    trace, salt = rows.ids_of(digest)
    trace_hex = values.hex_id(trace, 16)
    done = client.query(f'SELECT count() FROM "{db}"."{schema.LOADS}" WHERE FileHash = {{h:String}}',
                        parameters={"h": digest}).result_rows[0][0]
    if done:
        return LoadResult(path, 0, time.perf_counter() - t0, True, trace_hex, digest)
    source = open_batches(path, windowed_from)
    meta = source.meta
    left = client.query(f'SELECT count() FROM "{db}"."{table}_trace_id_ts" WHERE TraceId = {{t:String}}',
                        parameters={"t": trace_hex}).result_rows[0][0]  # the exporter's lookup table: by key
    if left:  # a load cut short before it was recorded: clear its rows and load afresh
        for t in (table, derived.TABLE):
            client.command(f'DELETE FROM "{db}"."{t}" WHERE TraceId = {{t:String}}', parameters={"t": trace_hex})
    extra: dict[str, Any] = {}  # the file's path and hash are in cltrace_loads, by TraceId: not on every row
    if run_id is not None:
        extra["cltrace.run.id"] = str(run_id)
    if rank is not None:
        extra["cltrace.rank"] = str(rank)
    resource = rows.resource(meta, service_name, extra)
    mapper = Mapper(rows.FileRun(meta), trace, salt)
    tag = f"{os.getpid()}_{digest[:12]}"
    w = _Writer(client, db, table, tag, resource, trace_hex, meta, mapper, threads)
    if source.windowed:  # a large file: memory over speed (30k rows an insert: 16 % less peak RSS, 14 % longer load)
        chunk_rows = min(chunk_rows, WINDOWED_CHUNK_ROWS)
    try:
        for batch in source.batches():
            w.add(batch, chunk_rows)
        spans = w.close(source.final_meta())
        client.insert(f'"{db}"."{schema.LOADS}"',
                      [[digest], [os.path.abspath(path)], [trace_hex], [spans],
                       [resource.get("cltrace.run.id", "")], [resource.get("cltrace.rank", "")]],
                      column_names=["FileHash", "Path", "TraceId", "Spans", "RunId", "Rank"], column_oriented=True)
    finally:
        w.drop()
    return LoadResult(path, spans, time.perf_counter() - t0, False, trace_hex, digest)


class _Writer:
    """A file's rows into the store: a staging table and a table of the attribute sets seen so far, each
    batch's new sets added before its rows; the ``cltrace.run`` root row last, once the spans' extent is known."""

    def __init__(self, client: Any, db: str, table: str, tag: str, resource: dict[str, str], trace_hex: str,
                 meta: dict[str, Any], mapper: Mapper, threads: int | None) -> None:
        self.client, self.db, self.resource, self.trace_hex, self.mapper = client, db, resource, trace_hex, mapper
        self.version = str(meta.get("cltrace.version") or "")
        self.stage, self.set_table = f"cltrace_stage_{tag}", f"cltrace_sets_{tag}"
        _create(client, db, self.stage, _STAGE_COLS)
        _create(client, db, self.set_table, _SET_COLS)
        self.insert = _insert_sql(db, table, self.stage, self.set_table, resource, threads)
        self.derive = _derive_sql(db, self.stage, self.set_table, threads)
        self.sets: dict[tuple[Any, ...], int] = {}
        self.spans = 0
        self.lo: int | None = None
        self.hi: int | None = None

    def _new_sets(self, names: list[str], attrs: list[dict[str, str]], codes: list[str], messages: list[str]) -> None:
        k = len(names)
        first = len(self.sets) - k
        self.client.insert(f'"{self.db}"."{self.set_table}"',
                           [list(range(first, first + k)), names, attrs, codes, messages, [self.trace_hex] * k,
                            [self.resource.get("service.name", "")] * k, [self.resource] * k,
                            [rows.SCOPE_NAME] * k, [self.version] * k],
                           column_names=[c for c, _ in _SET_COLS], column_oriented=True)

    def _rows(self, cols: dict[str, np.ndarray]) -> None:
        names = [c for c, _ in _STAGE_COLS]
        self.client.command(f'TRUNCATE TABLE "{self.db}"."{self.stage}"')
        self.client.insert(f'"{self.db}"."{self.stage}"', [cols[c] for c in names], column_names=names,
                           column_oriented=True)
        self.client.command(self.insert)
        self.client.command(self.derive)

    def add(self, batch: SpanBatch, chunk_rows: int) -> None:
        if not batch.n:
            return
        local = rows.attribute_sets(batch, self.mapper)
        new: tuple[list[Any], ...] = ([], [], [], [])
        ids = []
        for name, attrs, code, msg in zip(local.names, local.attrs, local.codes, local.messages):
            key = (name, tuple(sorted(attrs.items())), code, msg)
            got = self.sets.get(key)
            if got is None:
                got = self.sets[key] = len(self.sets)
                for part, v in zip(new, (name, attrs, code, msg)):
                    part.append(v)
            ids.append(got)
        if new[0]:
            self._new_sets(*new)
        row_set = np.array(ids, np.uint32)[local.row_set]
        for lo in range(0, batch.n, chunk_rows):
            cols = rows.columns(batch, self.mapper, slice(lo, lo + chunk_rows))
            cols["Set"] = row_set[lo:lo + chunk_rows]
            cols["PerRow"] = np.ones(len(cols["Ts"]), np.uint8)
            self._rows(cols)
        lo, hi = int(batch.host_begin.min()), max(int(batch.host_end.max()), int(batch.dev_end.max()))
        self.lo = lo if self.lo is None else min(self.lo, lo)
        self.hi = hi if self.hi is None else max(self.hi, hi)
        self.spans += batch.n

    def close(self, meta: dict[str, Any]) -> int:
        """The root row; the rows written, the root included."""
        begin = int(meta.get("start_ns") or (self.lo if self.lo is not None else 0))
        end = self.hi if self.hi is not None else begin
        name, sid, _pid, start, stop, attrs, _ev, code, msg = self.mapper.root(begin, end, meta, {"dropped": 0,
                                                                                                  "failed": 0})
        self.sets[("the root",)] = root_set = len(self.sets)  # a key no set has (theirs are 4-tuples)
        self._new_sets([name], [values.attributes(attrs)], [values.STATUS_CODES[code]], [msg or ""])
        zero = {c: np.zeros(1, np.int64) for c in ("HostDur", "DevDur", "Q", "Su", "St", "En")}
        self._rows({"Ts": np.array([start], np.int64), "Dur": np.array([max(stop - start, 0)], np.uint64),
                    "Sid": np.array([sid], np.uint64), "Pid": np.zeros(1, np.uint64), "HasParent": np.zeros(1, np.uint8),
                    "Dev": np.zeros(1, np.uint8), "Set": np.array([root_set], np.uint32),
                    "PerRow": np.zeros(1, np.uint8), **zero})
        return self.spans + 1

    def drop(self) -> None:
        for t in (self.stage, self.set_table):
            self.client.command(f'DROP TABLE IF EXISTS "{self.db}"."{t}"')
