"""``Store``: one ClickHouse store of spans, embedded or a server, with loading and the questions."""
from __future__ import annotations

import os
from typing import Any, Iterable, Sequence

from . import schema
from .analysis import StoreAnalysis, analyse
from .questions.common import Scope
from .connect import StoreError, open_client, resolve
from .load import CHUNK_ROWS, LoadResult, load_file


class Store:
    """Spans in ClickHouse. ``Store("traces.db")`` opens (creating) an embedded store in that folder;
    ``Store("http://host:8123")`` a server; ``Store()`` the one ``CLTRACE_STORE`` names. The exporter's
    tables are created where missing. Use as a context manager, or ``close()``."""

    def __init__(self, store: str | os.PathLike[str] | None = None, database: str | None = None,
                 table: str = schema.TABLE) -> None:
        dsn, db = resolve(store)
        self.dsn = dsn
        self.database = database or db or schema.DATABASE
        self.table = table
        self.client = open_client(dsn)
        try:
            schema.apply(self.client, self.database, self.table)
        except Exception as exc:
            self.close()
            raise StoreError(f"cannot create the tables in {dsn}: {str(exc).strip().splitlines()[0]}") from None

    def close(self) -> None:
        client, self.client = getattr(self, "client", None), None
        if client is not None:
            client.close()

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def load(self, paths: Iterable[str | os.PathLike[str]], service_name: str | None = None,
             run_id: str | None = None, rank: str | int | None = None,
             chunk_rows: int = CHUNK_ROWS) -> list[LoadResult]:
        """Load trace files, each once (see ``load.load_file``); ``run_id``/``rank`` name the job and
        rank for files that do not carry them (recorded before cltrace wrote them)."""
        return [load_file(self.client, os.fspath(p), self.database, self.table, service_name, run_id, rank,
                          chunk_rows) for p in paths]

    def query(self, sql: str, parameters: dict[str, Any] | None = None) -> list[tuple]:
        """Rows of a SQL query; ``{spans}`` in it names the spans table."""
        return self.result(sql, parameters).result_rows

    def result(self, sql: str, parameters: dict[str, Any] | None = None) -> Any:
        """The driver's result of a SQL query (rows and ``column_names``); ``{spans}`` as in ``query``."""
        return self.client.query(sql.replace("{spans}", f'"{self.database}"."{self.table}"'), parameters=parameters)

    def analyze(self, run: str | None = None, rank: str | int | None = None, service: str | None = None,
                step_name: str = "step", threshold_pct: float = 10.0, top: int = 10) -> StoreAnalysis:
        """Per-rank utilisation, stragglers and their causes, kernel pace across ranks, region totals,
        for the spans of ``run``/``rank``/``service`` (None: all), computed inside ClickHouse."""
        scope = Scope(run, None if rank is None else str(rank), service)
        return analyse(self.result, scope, step_name, threshold_pct, top)

    def count(self) -> int:
        return int(self.query("SELECT count() FROM {spans}")[0][0])

    def columns(self) -> Sequence[str]:
        return [r[0] for r in self.query("DESCRIBE TABLE {spans}")]
