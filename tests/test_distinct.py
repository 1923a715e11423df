"""timeline.arrays: the sinks' distinct-value helpers give what numpy's own functions give, for any
integer column (dense ids, sparse object ids, long runs, negatives, empty)."""
from __future__ import annotations

import numpy as np
from hypothesis import given, settings, strategies as st

from cltrace.timeline.arrays import distinct, first_rows, member, unique, values

columns = st.one_of(
    st.lists(st.integers(0, 40), max_size=300),  # track and name ids: the lookup-table path
    st.lists(st.integers(-(1 << 62), 1 << 62), max_size=300),  # object ids: the sort path
    st.lists(st.tuples(st.integers(-(1 << 40), 1 << 40), st.integers(1, 60)), max_size=12).map(
        lambda runs: [v for v, k in runs for _ in range(k)]),  # runs of one value: the run path
)


@settings(max_examples=300, deadline=None)
@given(col=columns)
def test_the_helpers_agree_with_numpy(col: list[int]) -> None:
    a = np.array(col, np.int64)
    want, want_first, want_inverse = np.unique(a, return_index=True, return_inverse=True)
    got, got_first, got_inverse = unique(a)
    assert got.tolist() == want.tolist()
    assert got_first.tolist() == want_first.tolist()
    assert got_inverse.tolist() == want_inverse.reshape(-1).tolist()
    assert values(a).tolist() == want.tolist()
    vals, inverse = distinct(a)
    assert vals.tolist() == want.tolist() and inverse.dtype == np.int32
    assert inverse.tolist() == want_inverse.reshape(-1).tolist()
    assert first_rows(inverse, len(vals)).tolist() == want_first.tolist()


@settings(max_examples=200, deadline=None)
@given(col=columns, keys=st.lists(st.integers(-(1 << 40), 1 << 40), max_size=8))
def test_member_is_isin(col: list[int], keys: list[int]) -> None:
    a = np.array(col, np.int64)
    k = np.array(keys + col[:2], np.int64)
    assert member(a, k).tolist() == np.isin(a, k).tolist()


def test_batch_category_mask_and_attrs_ids() -> None:
    from cltrace.timeline.batch import SpanBatch, Tables

    t = Tables()
    cats = np.array([t.cats.id(c) for c in ("kernel", "region", "kernel", "transfer")], np.int16)
    shared = {"a": 1}
    b = SpanBatch(t, {"id": np.arange(4), "cat": cats}, [shared, None, shared, {"a": 1}])
    assert b.is_region().tolist() == np.isin(cats, sorted(t.region_cats)).tolist() == [False, True, False, False]
    assert b.cat_mask([t.cats.id("kernel")]).tolist() == [True, False, True, False]
    ids = b.attrs_ids()
    assert ids.tolist() == [id(a) for a in b.attrs] and b.attrs_ids() is ids  # computed once per batch
    other = SpanBatch(t, {"id": np.arange(2)}, [None, shared])
    assert other.attrs_ids().tolist() == [id(None), id(shared)]
    assert b.attrs_ids().tolist() == ids.tolist() and not hasattr(b, "__dict__")  # nothing kept on the batch
