"""The store: spans in ClickHouse (chDB here) in the collector exporter's schema, loaded from cltrace's
files and analysed there across ranks.

Everything runs on the real engine: chDB in this process, or the ClickHouse server that
``CLTRACE_TEST_CLICKHOUSE_URL`` names (each test in a database of its own). Rank traces come from a real
pyopencl program (``rank_program.py``) run as three processes of one job, rank 1 given six times the
kernel work of the others.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest

from cltrace.analyzers.analysis import analyze
from cltrace.store import Store, StoreError, schema, values
from cltrace.store.connect import resolve

HERE = Path(__file__).parent
SERVER = os.environ.get("CLTRACE_TEST_CLICKHOUSE_URL")
STEPS = 5


@pytest.fixture(params=["embedded"] + (["server"] if SERVER else []))
def store(request: Any, tmp_path: Path) -> Iterator[Store]:
    """An empty store: a chDB folder, or a fresh database on the test server."""
    if request.param == "server":
        s = Store(SERVER, database=f"cltrace_test_{uuid.uuid4().hex[:12]}")
        try:
            yield s
        finally:
            s.client.command(f'DROP DATABASE IF EXISTS "{s.database}"')
            s.close()
    else:
        with Store(tmp_path / "store") as s:
            yield s


def run_rank(out: str, rank: int, work: int, otlp: str | None = None, run_id: str = "job-7") -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "CLTRACE_RUN_ID")}
    env.update(RANK=str(rank), CLTRACE_RUN_ID=run_id)
    cmd = [sys.executable, str(HERE / "rank_program.py"), out, str(STEPS), str(work)] + ([otlp] if otlp else [])
    subprocess.run(cmd, env=env, check=True, timeout=120, capture_output=True)


@pytest.fixture(scope="module")
def job(tmp_path_factory: Any) -> list[str]:
    """Three ranks of one job, rank 1 the straggler; rank 0 also as Chrome JSON. The ranks run one
    after another: on two cores, three at once would slow each other by more than the work does."""
    d = tmp_path_factory.mktemp("job")
    outs = [str(d / f"rank{r}.pftrace") for r in range(3)]
    for r, out in enumerate(outs):
        run_rank(out + (f",{d / 'rank0.json'}" if r == 0 else ""), r, 12 if r == 1 else 2)
    return outs + [str(d / "rank0.json")]


# ---- the exporter's mapping of values -------------------------------------------------------

@pytest.mark.parametrize("value,go", [
    ("x", "x"), (True, "true"), (7, "7"), (-3, "-3"), (1.0, "1"), (0.1, "0.1"), (2.5e-7, "0.00000025"),
    (1e21, "1000000000000000000000"), (float("nan"), "NaN"), (float("-inf"), "-Inf"),
    ([1, 2], "[1,2]"), (["a<b", "c&d"], '["a\\u003cb","c\\u0026d"]'), ([1.5, 1e-7, 1e21, 2.0], "[1.5,1e-7,1e+21,2]"),
    ([True, False], "[true,false]"), ((), "[]"),
])
def test_values_are_strings_as_pdata_writes_them(value: Any, go: str) -> None:
    # go: what pcommon.Value.AsString() returns for the same OTLP value (FormatFloat 'f' -1; encoding/json)
    assert values.as_string(value) == go


@pytest.mark.parametrize("col", [
    np.array([7, 3, 3, 9, -2, 7]), np.array([5, 5, 5]), np.array([2, 0, 1], np.uint8), np.array([], np.int64),
    np.array([10**15, 3, 10**12, 3]), np.array([-(2**63), 2**63 - 1, 0]), np.array([0.5, 0.25, 0.5]),
    np.array(["b", "a", "b"]),
])
def test_attribute_set_ranks_are_uniques_inverse(col: np.ndarray) -> None:
    # rows._dense ranks small integer ranges by a presence table, the rest by np.unique: the same ranks
    from cltrace.store.rows import _dense
    u, inv = np.unique(col, return_inverse=True)
    got, k = _dense(col)
    assert got.tolist() == inv.reshape(-1).tolist() and k == len(u)


def test_ids_and_enums_as_the_exporter_names_them() -> None:
    assert values.hex_id(0xABC, 8) == "0000000000000abc"
    assert values.hex_id(0, 16) == ""
    assert values.SPAN_KINDS[1] == "SPAN_KIND_INTERNAL" and values.STATUS_CODES == (
        "STATUS_CODE_UNSET", "STATUS_CODE_OK", "STATUS_CODE_ERROR")


# ---- schema ------------------------------------------------------------------------------------

def test_the_exporters_ddl_applies_as_shipped(store: Store) -> None:
    tables = {r[0] for r in store.query(f"SHOW TABLES FROM \"{store.database}\"")}
    assert {"otel_traces", "otel_traces_trace_id_ts", "otel_traces_trace_id_ts_mv", "cltrace_loads"} <= tables
    cols = dict((r[0], r[1]) for r in store.query("DESCRIBE TABLE {spans}"))
    assert list(cols) == schema.insert_columns()  # the exporter inserts every column, in table order
    assert cols["Timestamp"] == "DateTime64(9)" and cols["Duration"] == "UInt64"
    assert cols["SpanAttributes"] == "Map(LowCardinality(String), String)"
    assert cols["Events.Timestamp"] == "Array(DateTime64(9))"
    # the shipped templates, filled as the exporter's Sprintf fills them, are what ran
    ddl = schema.render(store.database)
    assert all("%s" not in d for d in ddl) and "ENGINE = MergeTree()" in ddl[0]
    assert schema.template("traces_table.sql").count("%s") == 5


# ---- loading -----------------------------------------------------------------------------------

def test_load_writes_the_exporters_rows(store: Store, job: list[str]) -> None:
    path = job[0]
    (res,) = store.load([path])
    from cltrace.read import load_columns

    batch, meta = load_columns(path)
    assert not res.skipped and res.spans == len(batch) + 1 == store.count()
    rows = store.query("SELECT TraceId, SpanId, ParentSpanId, SpanName, SpanKind, StatusCode, ServiceName, "
                       "toUnixTimestamp64Nano(Timestamp), Duration, SpanAttributes, Events.Name, "
                       "arrayMap(t -> toUnixTimestamp64Nano(t), Events.Timestamp), ResourceAttributes, ScopeName "
                       "FROM {spans}")
    root = [r for r in rows if r[3] == "cltrace.run"]
    assert len(root) == 1 and root[0][2] == ""
    root_id = root[0][1]
    off = meta["start_unix_ns"] - meta["start_ns"]
    by_start = {(int(s.host_begin) + off, s.name): s for s in batch}
    for trace, sid, parent, name, kind, status, service, ts, dur, attrs, ev_names, ev_ts, res_attrs, scope in rows:
        assert trace == res.trace_id and len(trace) == 32 and len(sid) == 16 and kind == "SPAN_KIND_INTERNAL"
        assert status == "STATUS_CODE_UNSET" and service == "cltrace" and scope == "cltrace"
        assert res_attrs["cltrace.rank"] == "0" and res_attrs["cltrace.run.id"] == "job-7"
        assert res_attrs["process.pid"] == str(meta["pid"]) and res_attrs["host.name"] == meta["host"]["name"]
        if name == "cltrace.run":
            continue
        s = by_start[(ts, name)]
        assert attrs["cltrace.category"] == s.cat
        assert attrs["cltrace.host.duration_ns"] == str(s.host_end - s.host_begin)
        end = max(s.host_end, s.dev_end) if s.dev_start is not None else s.host_end
        assert dur == end - s.host_begin  # Duration = end - start, the span ending with its device work
        if s.dev_start is not None:
            assert ev_names == ["QUEUED", "SUBMIT", "START", "END"]
            # a .pftrace keeps no QUEUED/SUBMIT stamps: its readers give START for them (the general one None)
            q, sub = (s.dev_start if v is None else v for v in (s.dev_queued, s.dev_submit))
            assert ev_ts == [q + off, sub + off, s.dev_start + off, s.dev_end + off]
            assert attrs["cltrace.device.duration_ns"] == str(s.raw_end - s.raw_start)
        else:
            assert ev_names == []
        if s.parent == 0:
            assert parent == root_id
    lookup = store.query(f'SELECT TraceId FROM "{store.database}".otel_traces_trace_id_ts')
    assert {r[0] for r in lookup} == {res.trace_id}  # the exporter's materialised view ran on our inserts


def test_loaded_rows_are_derived_as_the_collectors_are(store: Store, job: list[str]) -> None:
    # cltrace_spans rows written by the loader are what derived.COLUMNS gives from the exporter's rows
    from cltrace.store import derived

    store.load(job[:2])
    cols = ", ".join(derived.NAMES)
    mine = sorted(store.query(f"SELECT {cols} FROM {{derived}}"))
    again = sorted(store.query(f"SELECT {cols} FROM ({derived.select('{spans}')})"))
    assert mine == again and len(mine) == store.count()
    assert store.sync() == 0  # nothing left to derive


def test_a_file_is_loaded_once(store: Store, job: list[str], capsys: Any) -> None:
    first = store.load([job[0]])[0]
    again = store.load([job[0]])[0]
    assert again.skipped and again.spans == 0 and again.trace_id == first.trace_id
    assert store.count() == first.spans


def test_chunks_give_the_same_rows(tmp_path: Path, job: list[str]) -> None:
    got = []
    for i, chunk in enumerate((7, 100_000)):
        with Store(tmp_path / f"s{i}") as s:
            s.load([job[2]], chunk_rows=chunk)
            got.append(sorted(map(repr, s.query("SELECT * FROM {spans}"))))
    assert got[0] == got[1] and len(got[0]) > 7


def test_embedded_loads_share_the_cores_and_give_the_same_rows(tmp_path: Path, job: list[str], monkeypatch: Any) -> None:
    """Embedded, each file's inserts get the machine's cores over the files loading at once; the rows are
    the same whatever the share."""
    from cltrace.store import store as store_mod
    seen: list[Any] = []
    real = store_mod.load_file
    monkeypatch.setattr(store_mod, "load_file", lambda *a, **kw: (seen.append(a[8] if len(a) > 8 else kw.get("threads")), real(*a, **kw))[1])
    monkeypatch.setattr(os, "cpu_count", lambda: 4)
    got = []
    for i, jobs in enumerate((1, 2)):
        with Store(tmp_path / f"s{i}") as s:
            s.load(job[:2], jobs=jobs)
            got.append(sorted(map(repr, s.query("SELECT * FROM {spans}"))))
    assert seen == [4, 4, 2, 2]
    assert got[0] == got[1] and len(got[0]) > 2


def test_json_and_pftrace_load_alike(tmp_path: Path, job: list[str]) -> None:
    # rank 0 wrote both formats from one recording: the same spans, times, attributes and events
    def rows(path: str) -> list[tuple]:
        with Store(tmp_path / Path(path).suffix[1:]) as s:
            s.load([path])
            return sorted(s.query("SELECT SpanName, toUnixTimestamp64Nano(Timestamp), Duration, "
                                  "SpanAttributes['cltrace.category'], SpanAttributes['cltrace.host.duration_ns'], "
                                  "arraySlice(arrayMap(t -> toUnixTimestamp64Nano(t), Events.Timestamp), 3, 2) FROM {spans} "
                                  "WHERE SpanName != 'cltrace.run'"))
    assert rows(job[0]) == rows(job[3])


# ---- rows as a collector writes them ------------------------------------------------------------

def _by_span(rows: list[tuple]) -> dict[tuple, dict[str, Any]]:
    """Rows keyed by (name, start ns), parents named by their key instead of their id."""
    keys = {r[1]: (r[3], r[4]) if r[3] != "cltrace.run" else "root" for r in rows}
    out = {}
    for trace, sid, parent, name, ts, dur, kind, status, msg, service, res, attrs, ev_names, ev_ts, scope in rows:
        out[(name, ts)] = {"parent": keys.get(parent), "dur": dur, "kind": kind,
                           "status": status, "msg": msg, "service": service, "res": res, "attrs": attrs,
                           "events": list(zip(ev_names, ev_ts)), "scope": scope}
    return out


def _as_go(attrs: dict[str, str]) -> dict[str, str]:
    """rotel writes an array attribute as OTLP/JSON (``{"values":[{"intValue":"0"}]}``) where the Go exporter
    writes pdata's ``AsString()`` (``[0]``): rotel's values in the Go exporter's spelling."""
    def plain(v: dict[str, Any]) -> Any:
        (kind, x), = v.items()
        return {"intValue": int, "doubleValue": float, "boolValue": bool}.get(kind, lambda y: y)(x)

    out = {}
    for k, v in attrs.items():
        if v.startswith('{"values":'):
            v = values.as_string([plain(x) for x in json.loads(v)["values"]])
        out[k] = v
    return out


_ROWS = ("SELECT TraceId, SpanId, ParentSpanId, SpanName, toUnixTimestamp64Nano(Timestamp), Duration, SpanKind, "
         "StatusCode, StatusMessage, ServiceName, ResourceAttributes, SpanAttributes, Events.Name, "
         "arrayMap(t -> toUnixTimestamp64Nano(t), Events.Timestamp), ScopeName FROM {spans}")


def test_rows_match_a_collectors_clickhouse_exporter(tmp_path: Path) -> None:
    """One run, exported over OTLP to rotel, whose ClickHouse exporter writes into the store (through
    ClickHouse's HTTP interface in front of chDB), and written to a file that cltrace loads: the same
    rows, and one analysis reads both."""
    from clickhouse_front import ClickHouseFront
    from otlp_collector import RotelCollector

    out = str(tmp_path / "rank0.json")
    with Store(tmp_path / "store") as store:
        schema.apply(store.client, "collector")
        with ClickHouseFront(store.client, "collector") as front:
            exporter = ["--exporter", "clickhouse", "--clickhouse-exporter-endpoint", front.url,
                        "--clickhouse-exporter-database", "collector", "--clickhouse-exporter-compression", "none",
                        "--clickhouse-exporter-async-insert", "false"]
            with RotelCollector(debug=False, exporter=exporter) as rotel:
                run_rank(out, 0, 2, otlp=rotel.grpc_endpoint)
                store.load([out])
                want = store.count()
                deadline = time.monotonic() + 30
                got = 0
                while got < want and time.monotonic() < deadline:
                    got = store.query('SELECT count() FROM "collector"."otel_traces"')[0][0]
                    time.sleep(0.1)
        assert not front.errors and got == want, (front.errors, got, want)
        ours = _by_span(store.query(_ROWS))
        theirs = _by_span(store.query(_ROWS.replace("{spans}", '"collector"."otel_traces"')))
        (root_ours,) = [k for k in ours if k[0] == "cltrace.run"]
        (root_theirs,) = [k for k in theirs if k[0] == "cltrace.run"]
        # the root: the sink's begin/end against the file's first and last span; its counters the same
        root_attrs = ours.pop(root_ours)["attrs"]
        assert root_attrs == _as_go(theirs.pop(root_theirs)["attrs"])
        # the devices the run used: on its root span, in both; never in a resource (repeated on every row)
        assert root_attrs["cltrace.opencl.device.names"].startswith('["')
        assert not any(k.startswith("cltrace.opencl.") for row in (*ours.values(), *theirs.values()) for k in row["res"])
        assert ours.keys() == theirs.keys() and len(ours) > 3 * STEPS
        for key, a in ours.items():
            b = theirs[key]
            assert a["kind"] == "SPAN_KIND_INTERNAL"  # the Go exporter's traceutil.SpanKindStr
            assert b["kind"] in ("SPAN_KIND_INTERNAL", "Internal")  # rotel writes pdata's SpanKind.String()
            assert a["status"] == "STATUS_CODE_UNSET" and b["status"] in ("STATUS_CODE_UNSET", "Unset")
            for field in ("parent", "dur", "msg", "service", "events", "scope"):
                assert a[field] == b[field], (key, field, a[field], b[field])
            assert a["attrs"] == _as_go(b["attrs"])
            shared = set(a["res"]) & set(b["res"])
            b["res"] = _as_go(b["res"])
            assert {"service.name", "host.name", "process.pid", "cltrace.rank", "cltrace.run.id",
                    "cltrace.version"} <= shared
            assert {k: a["res"][k] for k in shared} == {k: b["res"][k] for k in shared}
        with Store(tmp_path / "store", database="collector") as collector:  # a second client, same engine
            mine, its = store.analyze(), collector.analyze()
        assert [(k.name, k.count, k.total_ns, k.first_ns) for k in mine.kernels] == \
            [(k.name, k.count, k.total_ns, k.first_ns) for k in its.kernels]
        assert [(r.rank, r.kernel_ns, r.busy_ns, r.spans) for r in mine.ranks] == \
            [(r.rank, r.kernel_ns, r.busy_ns, r.spans) for r in its.ranks]
        assert [(r.path, r.count, r.total_ns) for r in mine.regions] == [(r.path, r.count, r.total_ns) for r in its.regions]


# ---- analysis ----------------------------------------------------------------------------------

def test_kernel_and_region_totals_are_the_file_analysis(store: Store, job: list[str]) -> None:
    store.load(job[:3])
    for rank, path in enumerate(job[:3]):
        a = analyze(path)
        got = store.analyze(rank=rank, run="job-7")
        (k,) = got.kernels
        (fk,) = a.kernels
        assert (k.name, k.count, k.total_ns, k.first_ns) == (fk["name"], fk["count"], fk["total_ns"], fk["first_ns"])
        assert k.mean_ns == pytest.approx(fk["mean_ns"])
        (r,) = got.regions
        (fr,) = [x for x in a.regions if x["path"] == "step" and x["label"] == "host"]
        assert (r.count, r.total_ns, r.max_ns) == (fr["count"], fr["total_ns"], fr["max_ns"])


@pytest.mark.timing
def test_the_straggler_is_named_with_its_cause(store: Store, job: list[str]) -> None:
    store.load(job[:3])
    a = store.analyze(run="job-7")
    assert [r.rank for r in a.ranks] == ["0", "1", "2"]
    ranks = {r.rank: r for r in a.ranks}
    assert ranks["1"].kernel_ns > 3 * max(ranks["0"].kernel_ns, ranks["2"].kernel_ns)
    assert all(0 < r.busy_ns <= r.wall_ns for r in a.ranks)
    assert a.stragglers and {s.rank for s in a.stragglers} == {"1"}
    assert len(a.stragglers) == STEPS  # every step of rank 1
    slow = a.slowest_ranks()
    assert slow[0]["rank"] == "1" and slow[0]["cause"] == "kernels"
    assert slow[0]["excess_by_part"]["kernels"] > 0.5 * slow[0]["excess_ns"] and slow[0]["steps"] == STEPS
    # step by step the cause holds too, but for a step the machine's load may have disturbed
    assert sum(s.cause == "kernels" for s in a.stragglers) > STEPS // 2
    for s in a.stragglers:
        assert s.excess_by_part["kernels"] > 0
        # the evidence is a step span of rank 1 that a user finds at that time on its timeline
        ((name, rank, at),) = store.query(
            "SELECT SpanName, ResourceAttributes['cltrace.rank'], (toUnixTimestamp64Nano(Timestamp) - "
            "(SELECT min(toUnixTimestamp64Nano(Timestamp)) FROM {spans} WHERE ResourceAttributes['cltrace.rank'] = '1' "
            "AND SpanName != 'cltrace.run')) / 1e9 FROM {spans} WHERE TraceId = {t:String} AND SpanId = {s:String}",
            {"t": s.trace_id, "s": s.span_id})
        assert (name, rank) == ("step", "1") and at == pytest.approx(s.at_s, abs=1e-6)
    k = a.kernels[0]
    assert k.ranks == 3 and k.slowest_rank in {"0", "1", "2"} and k.spread_pct >= 0
    assert json.loads(a.to_json())["slowest_ranks"][0]["rank"] == "1"


def test_scope_selects_rows(store: Store, job: list[str]) -> None:
    store.load(job[:3])
    assert [r.rank for r in store.analyze(rank=2).ranks] == ["2"]
    assert store.analyze(run="no-such-run").ranks == []
    assert store.analyze(service="cltrace").ranks and not store.analyze(service="other").ranks


# ---- store specs and errors -------------------------------------------------------------------

def test_store_specs(tmp_path: Path) -> None:
    assert resolve(tmp_path / "a")[0] == f"chdb://{tmp_path / 'a'}" and (tmp_path / "a").is_dir()
    assert resolve("clickhouse://u:p@db.example:8123/traces") == ("http://u:p@db.example:8123", "traces")
    assert resolve("https://db.example:8443") == ("https://db.example:8443", None)
    f = tmp_path / "file"
    f.write_text("x")
    for bad in (str(f), "ftp://x"):
        with pytest.raises(StoreError) as e:
            resolve(bad)
        assert "\n" not in str(e.value)


def test_no_store_given_says_how(monkeypatch: Any) -> None:
    monkeypatch.delenv("CLTRACE_STORE", raising=False)
    with pytest.raises(StoreError, match="CLTRACE_STORE"):
        resolve(None)


# ---- the command line -------------------------------------------------------------------------

def test_cli_load_analyze_diff(tmp_path: Path, job: list[str], capsys: Any, monkeypatch: Any) -> None:
    from cltrace.cli import main

    folder = str(tmp_path / "cli-store")
    assert main(["load", *job[:3], "--store", folder, "--jobs", "2"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 3 and all(line.startswith("cltrace: loaded ") and " spans in " in line for line in out)
    assert main(["load", job[1], "--store", folder]) == 0
    assert capsys.readouterr().out.strip() == f"cltrace: {job[1]}: already in the store (loaded before); nothing to do"

    monkeypatch.setenv("CLTRACE_STORE", folder)  # the default store
    assert main(["analyze", "--run", "job-7"]) == 0
    text = capsys.readouterr().out
    assert "rank 1 of run job-7: 5 step(s)" in text and "cause: kernels" in text
    assert main(["analyze", "--store", folder, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema"] == "cltrace.store-analysis/1" and doc["slowest_ranks"][0]["rank"] == "1"

    # a second run of the job, rank 0 alone, with less kernel work: diff the two runs
    run_rank(str(tmp_path / "again.pftrace"), 0, 1, run_id="job-8")
    assert main(["load", str(tmp_path / "again.pftrace"), "--store", folder]) == 0
    capsys.readouterr()
    assert main(["diff", "--store", folder, "job-7", "job-8", "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)["rows"]}
    assert rows["forward"]["count_a"] == 5 * (2 + 12 + 2) and rows["forward"]["count_b"] == 5
    assert rows["step"]["count_a"] == 15 and rows["step"]["count_b"] == 5
    # the same gate as for files: a run against itself passes; the job against its lighter rerun fails on its kernel
    assert main(["diff", "--store", folder, "job-7", "job-7", "--fail-above", "10"]) == 0
    capsys.readouterr()
    assert main(["diff", "--store", folder, "job-8", "job-7", "--fail-above", "10", "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert "forward" in doc["regressions"] and all(r["reason"] for r in doc["rows"])


def test_cli_store_errors_are_one_line(tmp_path: Path, capsys: Any, monkeypatch: Any) -> None:
    from cltrace.cli import main

    monkeypatch.delenv("CLTRACE_STORE", raising=False)
    f = tmp_path / "file"
    f.write_text("x")
    for argv in (["analyze", "--store", str(tmp_path / "none")], ["load", str(f), "--store", str(f)],
                 ["analyze"], ["load", str(f), "--store", str(tmp_path / "s")],
                 ["load", str(tmp_path / "missing.pftrace"), "--store", str(tmp_path / "s")]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith("cltrace: error: ") and err.count("\n") == 1, (argv, err)


def test_resource_values_are_kept_exactly(store: Store, job: list[str]) -> None:
    odd = "it's a \\ name, {x}"
    store.load([job[2]], service_name=odd, run_id="run 'quoted'")
    ((svc, res_svc, run),) = store.query("SELECT DISTINCT ServiceName, ResourceAttributes['service.name'], "
                                         "ResourceAttributes['cltrace.run.id'] FROM {spans}")
    assert svc == res_svc == odd and run == "run 'quoted'"
    assert [r.rank for r in store.analyze(run="run 'quoted'", service=odd).ranks] == ["2"]


def test_a_load_cut_short_is_redone(store: Store, job: list[str]) -> None:
    # rows of a file whose load never finished (no cltrace_loads row) are cleared, then the file loaded whole
    first = store.load([job[0]])[0]
    store.client.command(f'TRUNCATE TABLE "{store.database}"."cltrace_loads"')
    store.client.command(f'DELETE FROM "{store.database}"."otel_traces" WHERE SpanName = \'forward\'')
    again = store.load([job[0]])[0]
    assert not again.skipped and again.trace_id == first.trace_id and store.count() == first.spans
    assert int(store.query("SELECT count() FROM {derived}")[0][0]) == first.spans


def test_sync_derives_what_a_collector_added(store: Store, job: list[str]) -> None:
    # spans of a trace that reached otel_traces without their cltrace_spans rows (a collector wrote them,
    # or more of them since) are derived before a question runs; complete traces are left alone
    from cltrace.store import derived

    store.load(job[:2])
    cols = ", ".join(derived.NAMES)
    want = sorted(store.query(f"SELECT {cols} FROM {{derived}}"))
    store.client.command(f'DELETE FROM "{store.database}"."{derived.TABLE}" WHERE Name = \'forward\' AND Rank = \'1\'')
    rank = derived.NAMES.index("Rank")
    assert store.sync() == sum(1 for r in want if r[rank] == "1")  # rank 1's trace derived afresh
    assert sorted(store.query(f"SELECT {cols} FROM {{derived}}")) == want
    assert store.sync() == 0


def test_two_ranks_are_enough(store: Store, job: list[str]) -> None:
    # the median of two ranks lies between them (an "exact" median taking the upper one would hide the slow one)
    store.load(job[:2])
    slow = store.analyze().slow_ranks
    assert [r.rank for r in slow] == ["1"] and slow[0].steps == STEPS


def _derived_rows(store: Store, spans: list[dict[str, Any]]) -> None:
    """Rows straight into ``cltrace_spans`` (what the questions read), for a question on known numbers."""
    from cltrace.store import derived

    base = {"Run": "r", "Service": "s", "Host": "h", "Pid": "1", "Path": "", "Device": "", "TraceId": "t",
            "SpanId": "", "OnDevice": 0, "DevStart": 0, "DevEnd": 0, "Blocking": 0, "Bytes": 0}
    rows = [{**base, "Path": s["Name"], **s} for s in spans]
    store.client.insert(f'"{store.database}"."{derived.TABLE}"', [[r[c] for c in derived.NAMES] for r in rows],
                        column_names=derived.NAMES)


def test_a_straggling_step_is_split_against_the_median_rank() -> None:
    # three ranks, one step each: rank 1 is the median (105 us), rank 2 straggles (200 us). Its parts are
    # compared with rank 1's own parts, not with each part's median over the ranks (which no rank ran)
    import tempfile

    t0 = 1_000_000_000
    spans = []
    for rank, (step, kernel, wait) in {"0": (100_000, 80_000, 10_000), "1": (105_000, 20_000, 70_000),
                                        "2": (200_000, 150_000, 20_000)}.items():
        spans += [
            {"Rank": rank, "Name": "step", "Cat": "step", "Begin": t0, "End": t0 + step, "HostNs": step},
            {"Rank": rank, "Name": "k", "Cat": "kernel", "Begin": t0 + 10, "End": t0 + 1_010, "HostNs": 1_000,
             "OnDevice": 1, "DevStart": t0 + 2_000, "DevEnd": t0 + 2_000 + kernel},
            {"Rank": rank, "Name": "finish", "Cat": "sync", "Begin": t0 + 2_000, "End": t0 + 2_000 + wait,
             "HostNs": wait},
        ]
    with tempfile.TemporaryDirectory() as d, Store(d) as store:
        _derived_rows(store, spans)
        a = store.analyze()
    (s,) = a.stragglers
    assert (s.rank, s.step, s.step_ns, s.median_ns) == ("2", 0, 200_000, 105_000)
    # host's own time: the step's host time less its calls' (launch 1 us and the wait)
    assert s.excess_by_part == {"kernels": 130_000, "transfers": 0, "waiting": -50_000,
                                "host": (200_000 - 21_000) - (105_000 - 71_000)}
    assert s.cause == "kernels" and a.slow_ranks[0].excess_by_part == s.excess_by_part


def test_findings_per_rank_are_the_file_analysis(store: Store, job: list[str]) -> None:
    # each rule the store computes fires on the ranks whose own file it fires on, with the same time at stake
    from cltrace.store.questions.findings import run_findings
    from cltrace.store.questions.common import Scope

    store.load(job[:3])
    a = store.analyze(run="job-7")
    got = {(f.rule, h.rank): h.cost_ns for f in a.findings for h in f.ranks}
    want = {}
    for rank, path in enumerate(job[:3]):
        for f in analyze(path).findings:
            if f["rule"] in ("blocking-in-loop", "small-transfers"):
                want[(f["rule"], str(rank))] = f["cost_ns"]
    assert ("blocking-in-loop", "1") in want  # rank_program's queue.finish() in every step
    assert got == want
    assert [f.rule for f in run_findings(store.result, Scope(run="job-7", rank="1"))] == ["blocking-in-loop"]
    from cltrace.store.analysis import render

    assert "blocking-in-loop" in render(a) and "0-2 (3)" in render(a)


def test_a_derived_table_of_other_columns_is_derived_again(tmp_path: Path, job: list[str]) -> None:
    # cltrace_spans is derived data: a store whose table an older cltrace made (other columns) gets it anew
    with Store(tmp_path / "s") as s:
        s.load([job[0]])
        s.client.command(f'ALTER TABLE "{s.database}".cltrace_spans DROP COLUMN Blocking')
    with Store(tmp_path / "s") as s:
        a = s.analyze()
        assert s.query("SELECT count() FROM {derived}")[0][0] == s.count()
        assert [f.rule for f in a.findings] == ["blocking-in-loop"]


def test_device_busy_is_the_exact_union_across_seconds(tmp_path: Path) -> None:
    """The rank table's busy time (``ranks.busy_cte``: the union taken a second at a time) against the union
    computed here, on intervals that overlap across queues, cross one or many second boundaries, touch,
    nest, are empty, or are not device work."""
    import random

    from cltrace.store.questions.ranks import SLOT_NS, busy_cte

    rng = random.Random(7)
    rows = []
    for rank in ("0", "1"):
        t = 5 * SLOT_NS - 3_000
        for _ in range(400):
            t += rng.choice([0, 1, 50, 5_000, SLOT_NS // 3])
            d = rng.choice([0, 10, 7_000, SLOT_NS - 1, SLOT_NS, 2 * SLOT_NS + 17])
            rows.append((rank, rng.choice(["kernel", "transfer", "fill", "sync"]), rng.random() < 0.9, t, t + d))
            if rng.random() < 0.3:  # another queue's command overlapping it
                rows.append((rank, "kernel", True, t + d // 2, t + d + rng.choice([1, SLOT_NS // 2])))
    want = {}
    for rank in ("0", "1"):
        iv = sorted((s, e) for r, c, on, s, e in rows if r == rank and on and c != "sync" and e > s)
        total, end = 0, None
        for s, e in iv:
            if end is None or s > end:
                total += e - s
                end = e
            elif e > end:
                total += e - end
                end = e
        want[rank] = total
    values = ", ".join(f"('r', '{r}', '{c}', {int(on)}, {s}, {e})" for r, c, on, s, e in rows)
    sql = (f"WITH base AS (SELECT * FROM values('run String, rank String, cat String, on_dev UInt8, ds Int64, "
           f"de Int64', {values})), {busy_cte(repr('kernel') + ', ' + repr('transfer') + ', ' + repr('fill'))} "
           "SELECT rank, busy_ns FROM busy ORDER BY rank")
    with Store(tmp_path / "s") as store:
        got = {r: int(b) for r, b in store.query(sql)}
    assert got == want and all(v > 3 * SLOT_NS for v in want.values())
