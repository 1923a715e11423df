"""The statistics' C table and its numpy twin give the same numbers, and the numbers are right."""
from __future__ import annotations

import numpy as np
import pytest

from cltrace.timeline import stats as st
from cltrace.timeline.batch import COLUMNS, SpanBatch, Tables

native = pytest.mark.skipif(st.NATIVE is None, reason=f"statistics: {st.DETAIL}")
PATHS = [("step",), ("step", "fwd"), ("step", "fwd", "matmul"), ("step", "bwd"), ("io",)]


def _batch(tables: Tables, rng: np.random.Generator, n: int, paths=PATHS) -> SpanBatch:
    """``n`` random spans over ``paths`` (interned in ``tables``), some on a device, some failed."""
    cols = {k: np.zeros(n, dt) for k, dt in COLUMNS}
    pick = rng.integers(len(paths), size=n)
    ids = np.array([tables.paths.id(p) for p in paths], np.int32)
    cats = np.array([tables.cats.id("kernel" if p[-1] == "matmul" else "region") for p in paths], np.int16)
    cols["path"], cols["cat"] = ids[pick], cats[pick]
    cols["host_begin"] = rng.integers(0, 10**9, n)
    cols["host_end"] = cols["host_begin"] + rng.integers(0, 10**6, n)
    on = rng.integers(2, size=n).astype(bool)
    cols["track"] = np.where(on, 3, 0)
    cols["dev_start"] = np.where(on, rng.integers(0, 10**9, n), 0)
    cols["dev_end"] = np.where(on, cols["dev_start"] + rng.integers(1, 10**5, n), 0)
    cols["status"] = (rng.integers(10, size=n) == 0).astype(np.int8)
    cols["id"] = np.arange(1, n + 1)
    return SpanBatch(tables, cols)


def _feed(stats: st.Stats, seed: int, sizes=(3, 700, 5000, 1, 9000, 30000)) -> list[SpanBatch]:
    rng = np.random.default_rng(seed)
    tables = Tables()
    batches = [_batch(tables, rng, n) for n in sizes]
    other = Tables()  # a second id space for the same paths, interned in another order
    batches.append(_batch(other, rng, 2000, PATHS[::-1] + [("late",)]))
    for b in batches:
        stats.add(b)
    return batches


@native
def test_native_and_python_tables_agree():
    a, b = st.Stats(), st.Stats(python=True)
    assert type(a._table).__module__ != type(b._table).__module__
    _feed(a, 7)
    _feed(b, 7)
    assert a.as_dict() == b.as_dict()


@pytest.mark.parametrize("python", [False, True])
def test_exact_figures_and_reservoir(python):
    s = st.Stats(python=python)
    batches = _feed(s, 11)
    out = s.as_dict()
    assert "late" in out
    firsts = {}
    for key, got in out.items():
        path = tuple(key.split("/"))
        host, dev, errors, begins = [], [], 0, []
        for b in batches:
            values = b.tables.paths.values
            rows = [i for i in range(b.n) if values[int(b.path[i])] == path]
            host += (b.host_end - b.host_begin)[rows].tolist()
            dev += [int(b.dev_end[i] - b.dev_start[i]) for i in rows if b.track[i]]
            errors += int(b.status[rows].sum())
            begins += b.host_begin[rows].tolist()
        firsts[key] = min(begins)
        assert got["host"]["count"] == len(host) and got["host"]["total_ns"] == sum(host)
        assert (got["host"]["min_ns"], got["host"]["max_ns"]) == (min(host), max(host))
        assert got["device"]["count"] == len(dev) and got["device"]["total_ns"] == sum(dev)
        assert got["errors"] == errors
        assert got["depth"] == len(path) - 1
        if len(host) <= st.RESERVOIR:  # exact until the reservoir fills
            assert got["host"]["p50_ns"] == pytest.approx(float(np.percentile(host, 50)))
        else:  # a uniform sample: its median lies near the true one
            assert abs(got["host"]["p50_ns"] - np.median(host)) < 0.1 * (max(host) - min(host))
    top = [k for k in out if "/" not in k]
    assert top == sorted(top, key=firsts.get)  # siblings in the order they first ran
    assert max(v["host"]["count"] for v in out.values()) > 2 * st.RESERVOIR  # the reservoir was sampled
    assert out["step/fwd/matmul"]["cat"] == "kernel" and out["step"]["cat"] == "region"


def test_a_table_refuses_a_path_without_a_slot():
    for table in ([st.NATIVE()] if st.NATIVE is not None else []) + [st.PythonTable()]:
        table.grow(1)
        z = np.zeros(1, np.int64)
        with pytest.raises(ValueError, match="no slot"):
            table.add(np.array([0], np.int64), np.array([1], np.int32), np.zeros(1, np.int16), z, z, z, z, z,
                      np.zeros(1, np.int8))
