"""``Store``: one ClickHouse store of spans, embedded or a server, with loading and the questions."""
from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, Iterable, Iterator

from . import derived, schema
from .analysis import StoreAnalysis, analyse, totals
from .questions.common import Scope
from .connect import StoreError, open_client, require_driver, resolve
from .load import CHUNK_ROWS, LoadResult, load_file


# Embedded, the engine shares this process's memory: past this a sort (the windows' ORDER BY) goes on in the
# store's folder instead of growing (a 45M-span file's questions peaked at 6.5 GB in memory). A server keeps its
# own. Not GROUP BY: the questions' groups are small, but its threshold counts the whole query's memory (a join's
# table too), so the stragglers' query spilled every block: 16 ranks x 1M spans, 7.8 s -> 69 s.
SPILL = {"max_bytes_before_external_sort": 256 << 20}
# Embedded, the table's merges run in this process: one still running when it closes is lost, and the next process
# to open the store merges those parts again from the start, beside its questions. 16 ranks x 1M spans, 2 at once:
# the load ended inside a merge of 6.3M rows (41 % done, 9 s in), which the analysis after it then did again
# (per-rank table + stragglers 11.7 s, 22.9 CPU s); waiting for it took 8 s. Bounded, so a load never hangs on one.
SETTLE_S = 300.0


@contextmanager
def guard(what: str) -> Iterator[None]:
    """The driver's and the engine's errors as one-line ``StoreError``s (cltrace's own pass through)."""
    from ..errors import CltraceError

    try:
        yield
    except CltraceError:
        raise
    except Exception as exc:
        if type(exc).__module__.split(".")[0] not in ("clickhouse_connect", "chdb"):
            raise
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise StoreError(f"the store failed {what}: {text}") from None


class Store:
    """Spans in ClickHouse. ``Store("traces.db")`` opens (creating) an embedded store in that folder;
    ``Store("http://host:8123")`` a server; ``Store()`` the one ``CLTRACE_STORE`` names. The exporter's
    tables are created where missing; ``create=False``: a missing folder is an error, not a new store.
    Use as a context manager, or ``close()``."""

    def __init__(self, store: str | os.PathLike[str] | None = None, database: str | None = None,
                 table: str = schema.TABLE, create: bool = True) -> None:
        require_driver(store)
        dsn, db = resolve(store, create)
        self.dsn = dsn
        self.embedded = dsn.startswith("chdb")  # chDB in this process, not a server
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
             chunk_rows: int = CHUNK_ROWS, jobs: int = 1, settle: bool = True) -> list[LoadResult]:
        """Load trace files, each once (see ``load.load_file``), ``jobs`` at a time (threads, each with
        a client of its own: reading a file and the engine's inserts both run outside the GIL);
        ``run_id``/``rank`` name the job and rank for files that do not carry them (recorded before
        cltrace wrote them). Embedded, it returns once the table's merges have finished (``settle``:
        see ``SETTLE_S``); pass False where the store is analysed in this process and thrown away.
        Results in the order of ``paths``."""
        paths = [os.fspath(p) for p in paths]
        results = self._load_all(paths, service_name, run_id, rank, chunk_rows, jobs)
        if settle and self.embedded and any(not r.skipped for r in results):
            with guard("waiting for the table's merges"):
                self._settle()
        return results

    def _settle(self) -> None:
        """Wait (at most ``SETTLE_S``) until no merge of this store's tables runs."""
        deadline = time.monotonic() + SETTLE_S
        while time.monotonic() < deadline:
            (n,), = self.client.query("SELECT count() FROM system.merges WHERE database = {d:String}",
                                      parameters={"d": self.database}).result_rows
            if not n:
                return
            time.sleep(0.2)

    def _load_all(self, paths: list[str], service_name: str | None, run_id: str | None, rank: str | int | None,
                  chunk_rows: int, jobs: int) -> list[LoadResult]:
        # Embedded, the engine shares this machine's cores with the other files' loads: each insert gets
        # its share of them (16 ranks x 1M spans on 2 cores: 11 % less CPU, load 35 -> 32 s for 4 of them;
        # the engine's default ran each insert on every core, the jobs' threads contending). A server keeps its own.
        jobs_now = max(1, min(jobs, len(paths)))
        threads = max(1, (os.cpu_count() or 1) // jobs_now) if self.embedded else None
        if jobs_now <= 1:
            return [self._load_one(self.client, p, service_name, run_id, rank, chunk_rows, threads) for p in paths]
        # a client runs one query at a time (the driver locks its engine handle): a client per thread
        local, clients, lock = threading.local(), [], threading.Lock()

        def one(p: str) -> LoadResult:
            client = getattr(local, "client", None)
            if client is None:
                client = local.client = open_client(self.dsn)
                with lock:
                    clients.append(client)
            return self._load_one(client, p, service_name, run_id, rank, chunk_rows, threads)

        try:
            with ThreadPoolExecutor(jobs_now, thread_name_prefix="cltrace-load") as pool:
                return list(pool.map(one, paths))
        finally:
            for c in clients:
                c.close()

    def _load_one(self, client: Any, path: str, service_name: str | None, run_id: str | None,
                  rank: str | int | None, chunk_rows: int, threads: int | None = None) -> LoadResult:
        with guard(f"loading {path}"):
            return load_file(client, path, self.database, self.table, service_name, run_id, rank, chunk_rows, threads)

    def query(self, sql: str, parameters: dict[str, Any] | None = None) -> list[tuple]:
        """Rows of a SQL query; ``{spans}`` in it names the exporter's spans table, ``{derived}``
        ``cltrace_spans``."""
        return self.result(sql, parameters).result_rows

    def result(self, sql: str, parameters: dict[str, Any] | None = None) -> Any:
        """The driver's result of a SQL query (rows and ``column_names``); ``{spans}`` as in ``query``."""
        sql = sql.replace("{spans}", f'"{self.database}"."{self.table}"')
        sql = sql.replace("{derived}", f'"{self.database}"."{derived.TABLE}"')
        with guard("a query"):
            return self.client.query(sql, parameters=parameters, settings=SPILL if self.embedded else None)

    def analyze(self, run: str | None = None, rank: str | int | None = None, service: str | None = None,
                step_name: str = "step", threshold_pct: float = 10.0, top: int = 10) -> StoreAnalysis:
        """Per-rank utilisation, stragglers and their causes, kernel pace across ranks, region totals,
        for the spans of ``run``/``rank``/``service`` (None: all), computed inside ClickHouse."""
        scope = Scope(run, None if rank is None else str(rank), service)
        self.sync()
        return analyse(self.result, scope, step_name, threshold_pct, top)

    def totals(self, run: str | None = None) -> StoreAnalysis:
        """Kernel and region tables alone, every row (``cltrace diff --store`` compares two runs' of them)."""
        self.sync()
        return totals(self.result, Scope(run))

    def sync(self) -> int:
        """Derive the ``cltrace_spans`` rows of spans a collector wrote since (``derived.sync``)."""
        with guard("deriving the collector's rows"):
            return derived.sync(self.client, self.database, self.table)

    def count(self) -> int:
        return int(self.query("SELECT count() FROM {spans}")[0][0])
