"""Property: any tree of regions and kernels exports properly nested slices.

Random trees mix regions on a queue, on a second queue and host-only regions,
some failing, with kernels of random length on either queue. In the Chrome JSON
every track's slices must nest, and every span must lie inside its parent on
the host track and inside its nearest same-track ancestor on the device track.
"""
from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import cltrace

QUEUES = ("q", "q2")

kernel = st.tuples(st.just("kernel"), st.sampled_from(QUEUES), st.sampled_from([0, 20, 200]))
trees = st.recursive(
    kernel,
    lambda children: st.tuples(
        st.just("region"),
        st.sampled_from(QUEUES + (None,)),
        st.booleans(),  # the region raises after its children
        st.lists(children, max_size=4),
    ),
    max_leaves=14,
)
programs = st.lists(trees, min_size=1, max_size=3)


class Planned(Exception):
    pass


def _count(node: tuple) -> tuple[int, int]:
    """(spans, kernels) a node records."""
    if node[0] == "kernel":
        return 1, 1
    spans, kernels = 1, 0
    for child in node[3]:
        s, k = _count(child)
        spans += s
        kernels += k
    return spans, kernels


def _run(node: tuple, queues: dict[str, Any], kernels: Any) -> None:
    if node[0] == "kernel":
        _, q, iters = node
        kernels.launch_spin(queues[q], iters)
        return
    _, q, fails, children = node
    try:
        with cltrace.region("r", queues[q] if q else None):
            for child in children:
                _run(child, queues, kernels)
            if fails:
                raise Planned()
    except Planned:
        pass


@pytest.fixture(scope="module")
def queues(cl_ctx, queue) -> dict[str, Any]:
    return {"q": queue, "q2": cltrace.profiling_queue(cl_ctx)}


@pytest.fixture(scope="module")
def trace_path(tmp_path_factory):
    return tmp_path_factory.mktemp("nesting") / "tree.json"


@pytest.mark.parametrize("mode", ["markers", "projected"])
@settings(max_examples=25, deadline=None)
@given(program=programs)
def test_any_region_tree_exports_properly_nested_slices(program, queues, kernels, trace_path, chrome, reset, mode):
    """Regions bracketed by markers or projected from their commands: the same nesting holds."""
    reset()
    cltrace.configure(regions=mode)
    with cltrace.trace(trace_path):
        for tree in program:
            _run(tree, queues, kernels)
    tr = chrome.read(trace_path)
    placements = tr.placements()
    spans = sum(_count(t)[0] for t in program)
    n_kernels = sum(_count(t)[1] for t in program)
    assert len(placements) == spans
    assert sum(1 for pl in placements.values() if pl["host"]["cat"] == "kernel" and "device" in pl) == n_kernels
    assert tr.misnested() == []
    assert tr.children_outside_parents() == []
