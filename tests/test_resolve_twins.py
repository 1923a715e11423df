"""The resolver's two implementations give identical spans: the native one (C passes and C first
pass, ``timeline/_resolve.c`` and ``_stamps.c``) and the pure-Python one (``Resolver(python=True)``).

Both resolve the same real PoCL records, in the same batches, each with its own copy of the same
device clocks, and every column of every batch (ids, decoded names, paths and sites, attributes,
errors) must match; so must what each keeps between batches (records waiting, children's extents).
The scenarios are the adversarial ones: nested regions on several threads and queues, host-only
regions, kernels outside regions, commands held back by a user event and completing out of order,
failed commands, an out-of-order queue's lanes, batches cut at every boundary, records shuffled.

The native side fails, not skips, when the extensions are not active: CI must exercise both paths.
Only ``CLTRACE_NATIVE=0`` (the fallback-only run) skips it; the pass-level tests then still check the
Python passes against brute-force references.
"""
from __future__ import annotations

import contextlib
import copy
import os
import random
import sys
import threading
import time
from typing import Any, Callable

import numpy as np
import pyopencl as cl
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import cltrace
from cltrace.record.recorder import RECORDER
from cltrace.timeline import passes, stamps
from cltrace.timeline.batch import NAMES, SpanBatch, Tables
from cltrace.timeline.clock import ClockRegistry
from cltrace.timeline.placement import Placement
from cltrace.timeline.raw import R_EV0
from cltrace.timeline.resolve import Resolver
from cltrace.timeline.tracks import TrackRegistry

DISABLED = os.environ.get("CLTRACE_NATIVE", "").strip() == "0"


def native_passes() -> passes.Impl:
    if DISABLED:
        pytest.skip("CLTRACE_NATIVE=0: fallback-only run")
    if passes.NATIVE is None or stamps.NATIVE is None:
        pytest.fail(f"the C extensions are not active ({passes.DETAIL}; stamps: {stamps.DETAIL}): reinstall "
                    "with `pip install -e .` where a C compiler exists, or run with CLTRACE_NATIVE=0")
    return passes.NATIVE


class ForkedClocks:
    """A shared ``ClockRegistry``'s clocks, each copied once with its own placement, so two resolvers map
    and place the same stamps identically without sharing the state placement keeps between batches."""

    def __init__(self, source: ClockRegistry) -> None:
        self.source = source
        self._forks: dict[int, Any] = {}

    def for_queue(self, queue: Any, device_uid: str | None = None) -> Any:
        clk = self.source.for_queue(queue, device_uid)
        fork = self._forks.get(id(clk))
        if fork is None:
            fork = self._forks[id(clk)] = copy.copy(clk)  # the map (knots) is only read while resolving
            fork.placement = Placement(clk.placement.threshold_ns)
        return fork


class ClockPerQueue(ForkedClocks):
    """Each queue its own copy of its device's clock, with its own placement: several clocks in one batch, as
    several devices give (one PoCL device here)."""

    def for_queue(self, queue: Any, device_uid: str | None = None) -> Any:
        clk = self.source.for_queue(queue, device_uid)
        fork = self._forks.get(queue.int_ptr)
        if fork is None:
            fork = self._forks[queue.int_ptr] = copy.copy(clk)
            fork.placement = Placement(clk.placement.threshold_ns)
        return fork


def recorded(scenario: Callable[[], Any], tickets: bool = False) -> list[tuple]:
    """The raw records a scenario appends, taken before the recorder's worker resolves them. With
    ``tickets`` the hot path trades the events for the reaper's tickets (native path), else keeps them."""
    RECORDER.configure(max_pending=1 << 20, tickets_above=0)
    if tickets and stamps.REAPER is None:
        pytest.fail(f"the reaper is not active (stamps: {stamps.DETAIL})")
    cltrace.start()
    try:
        with RECORDER._lock, (contextlib.nullcontext() if tickets else stamps.events_kept()):  # the worker resolves under this lock: it waits until the records are taken
            try:
                scenario()
                # Quiet past the reaper's quiet_ns (2 ms): while a program launches, only the launching
                # thread's harvest reads a young ticket, and the twins must see the same stamps.
                time.sleep(0.01)
                return list(RECORDER.pending)
            finally:
                RECORDER.pending.clear()  # stop() must not wait for commands a test holds back
    finally:
        cltrace.stop()


def twins(forks: type = ForkedClocks) -> tuple[Resolver, Resolver]:
    native_passes()
    tracks, clocks = TrackRegistry(), ClockRegistry(recalibrate_s=1e9)
    nat, py = Resolver(tracks, forks(clocks), Tables()), Resolver(tracks, forks(clocks), Tables(), python=True)
    assert (nat.path, py.path) == ("native", "python")  # the fused native tail against the Python reference
    return nat, py


def decoded(b: SpanBatch) -> dict[str, list]:
    t = b.tables
    return {"name": b.name_list(), "cat": b.cat_list(), "path": [t.paths.values[i] for i in b.path.tolist()],
            "site": b.site_list(), "attrs": list(b.attrs), "errors": b.error_list()}


def assert_same(nb: SpanBatch, pb: SpanBatch, where: str) -> None:
    for c in NAMES:
        a, b = getattr(nb, c), getattr(pb, c)
        assert a.dtype == b.dtype and np.array_equal(a, b), f"{where}: column {c} differs"
    assert decoded(nb) == decoded(pb), where


def placed(res: Resolver) -> dict[Any, tuple]:
    """What each clock keeps from batch to batch: its placement's steps and state, the latest stamp it mapped."""
    return {key: (c.placement.steps(), c.placement.last_start, c.placement.max_end, c.placement.worst_ns,
                  c.placement.changes, c._mapped_max) for key, c in res.clocks._forks.items()}


def resolve_both(recs: list[tuple], cuts: list[int], finish: Callable[[], None] | None = None,
                 cut_after_finish: int | None = None, forks: type = ForkedClocks) -> list[SpanBatch]:
    """Feed both resolvers the same batches (``recs`` cut at ``cuts``); ``finish`` runs before the batch
    starting at ``cut_after_finish``; the last batch blocks. Returns the native batches. Records with
    tickets are read by both: the native resolver, first, leaves them for the Python one to free."""
    nat, py = twins(forks)
    ticketed = sum(type(r[R_EV0]) is int for r in recs)
    if ticketed:
        nat._done = lambda hs: None
    bounds = [0] + sorted(set(c for c in cuts if 0 < c < len(recs))) + [len(recs)]
    out = []
    for k, (lo, hi) in enumerate(zip(bounds, bounds[1:])):
        if finish is not None and lo == cut_after_finish:
            finish()
        last = hi == len(recs)
        nb = nat.resolve(recs[lo:hi], block=last)
        pb = py.resolve(recs[lo:hi], block=last)
        assert_same(nb, pb, f"batch {k} (records {lo}:{hi})")
        assert len(nat.waiting) == len(py.waiting) and all(a is b for a, b in zip(nat.waiting, py.waiting))
        assert len(nat._extents) == len(py._extents)
        assert placed(nat) == placed(py), "each clock's placement and map commits the same"
        out.append(nb)
    if ticketed:
        left = stamps.peek(np.array([r[R_EV0] for r in recs if type(r[R_EV0]) is int], np.uint64))[0]
        assert (left == -58).all(), "every ticket of a resolved record is freed"  # CL_INVALID_EVENT
    return out


# --- scenarios on real PoCL events --------------------------------------------------------------

def threads_and_queues(cl_ctx: Any, queue: Any, kernels: Any, tickets: bool = False) -> list[tuple]:
    """Nested regions on three threads and two queues, host-only regions, kernels outside regions."""
    q2 = cltrace.profiling_queue(cl_ctx)

    def work(seed: int) -> None:
        add, spin = kernels.kernel("add"), kernels.kernel("spin")
        rng = random.Random(seed)
        for step in range(6):
            kernels.launch_add(queue, add)  # outside any region
            with cltrace.region("step", queue):
                with cltrace.region("host part"):  # a host-only region around device work
                    kernels.launch_spin(q2, rng.choice([0, 30]), spin)
                    with cltrace.region("inner", q2):
                        kernels.launch_add(q2, add)
                for _ in range(rng.randint(0, 3)):
                    kernels.launch_add(queue, add)
                with cltrace.region("empty", queue):
                    pass

    def scenario() -> None:
        ts = [threading.Thread(target=work, args=(s,)) for s in range(3)]
        for t in ts:
            t.start()
        work(99)
        for t in ts:
            t.join()
        queue.finish()
        q2.finish()

    return recorded(scenario, tickets)


@pytest.mark.parametrize("tickets", [False, True], ids=["events", "tickets"])
def test_nested_regions_across_threads_and_queues_resolve_identically(cl_ctx, queue, kernels, tickets):
    native_passes()
    recs = threads_and_queues(cl_ctx, queue, kernels, tickets)
    assert any(type(r[R_EV0]) is int for r in recs) == tickets
    assert len(recs) > 200
    batches = resolve_both(recs, list(range(0, len(recs), 37)))
    spans = SpanBatch.concat(batches[0].tables, batches)
    assert spans.n == len(recs)
    assert (spans.track != 0).sum() > spans.n // 2  # device rows were placed, not skipped


@pytest.mark.parametrize("tickets", [False, True], ids=["events", "tickets"])
def test_several_clocks_and_thread_keys_beyond_int64_resolve_identically(cl_ctx, queue, kernels, tickets):
    """Every queue on a clock of its own (each placed on its own, in one batch), and two threads whose keys do
    not fit int64 (a reused thread ident's key): each keeps its own host track, and its queues theirs."""
    native_passes()
    recs = threads_and_queues(cl_ctx, queue, kernels, tickets)
    keys = sorted({r[5] for r in recs})
    assert len(keys) >= 3
    big = {k: k + ((i + 1) << 64) for i, k in enumerate(keys[:2])}
    recs = [r[:5] + (big.get(r[5], r[5]),) + r[6:] for r in recs]
    batches = resolve_both(recs, list(range(0, len(recs), 300)), forks=ClockPerQueue)
    spans = SpanBatch.concat(batches[0].tables, batches)
    thread_of = dict(zip(spans.id.tolist(), spans.thread.tolist()))
    tracks = {k: {thread_of[r[2]] for r in recs if r[5] == k} for k in {r[5] for r in recs}}
    assert all(len(t) == 1 for t in tracks.values()) and len({t.pop() for t in tracks.values()}) == len(tracks)


@pytest.mark.parametrize("size", [1, 2, 7, 64, 4096])
def test_every_batch_boundary_resolves_identically(cl_ctx, queue, kernels, size):
    """Children and their regions in different batches: the extents kept between batches must agree."""
    native_passes()
    recs = threads_and_queues(cl_ctx, queue, kernels)
    resolve_both(recs, list(range(0, len(recs), size)))


@pytest.mark.parametrize("tickets", [False, True], ids=["events", "tickets"])
def test_shuffled_records_resolve_identically(cl_ctx, queue, kernels, tickets):
    """Records out of record order (regions before their children, threads interleaved anyhow)."""
    native_passes()
    recs = threads_and_queues(cl_ctx, queue, kernels, tickets)
    random.Random(7).shuffle(recs)
    resolve_both(recs, list(range(0, len(recs), 50)))


@pytest.mark.parametrize("tickets", [False, True], ids=["events", "tickets"])
def test_held_back_and_failed_commands_resolve_identically(cl_ctx, queue, kernels, tickets):
    """Commands held by a user event complete after later ones (they wait between batches); a second
    gate fails, so the commands behind it fail; a queue without profiling gives no stamps."""
    native_passes()
    ok_gate, bad_gate = cl.UserEvent(cl_ctx), cl.UserEvent(cl_ctx)
    q_late, q_bad = cltrace.profiling_queue(cl_ctx), cltrace.profiling_queue(cl_ctx)
    plain = cl.CommandQueue(cl_ctx)
    add = kernels.kernel("add")

    def scenario() -> None:
        with cltrace.region("held", q_late):
            cltrace.launch(add, q_late, (kernels.n,), None, kernels.a, kernels.b, wait_for=[ok_gate])
            kernels.launch_add(q_late, add)
        for _ in range(5):
            with cltrace.region("free", queue):
                kernels.launch_add(queue, add)
        with cltrace.region("doomed", q_bad):
            cltrace.launch(add, q_bad, (kernels.n,), None, kernels.a, kernels.b, wait_for=[bad_gate])
        kernels.launch_add(plain, add)  # no stamps: kept as a host span that says why
        kernels.launch_add(queue, add)
        queue.finish()
        plain.finish()

    def open_gates() -> None:
        for gate, status in ((bad_gate, -1), (ok_gate, cl.command_execution_status.COMPLETE)):
            if gate.command_execution_status > 0:
                gate.set_status(status)

    try:
        recs = recorded(scenario, tickets)
        batches = resolve_both(recs, [3, 9, len(recs) - 2], finish=open_gates, cut_after_finish=len(recs) - 2)
    finally:
        open_gates()  # whatever failed: nothing may wait on them forever
    assert batches[0].n < 3  # the held commands waited
    spans = SpanBatch.concat(batches[0].tables, batches)
    assert spans.n == len(recs)
    assert spans.status.any()  # the commands behind the failed gate
    assert any(a and "cltrace.device_time" in a for a in spans.attrs)  # failed or without profiling


@pytest.mark.parametrize("tickets", [False, True], ids=["events", "tickets"])
def test_out_of_order_queue_lanes_resolve_identically(cl_ctx, kernels, tickets):
    native_passes()
    q = cltrace.profiling_queue(cl_ctx, out_of_order=True)
    spin = kernels.kernel("spin")
    bufs = [cl.Buffer(cl_ctx, cl.mem_flags.READ_WRITE, 4 * kernels.n) for _ in range(6)]

    def scenario() -> None:
        for step in range(4):
            with cltrace.region("step", q):
                for i, buf in enumerate(bufs):
                    cltrace.launch(spin, q, (kernels.n,), None, buf, np.int32(20 + 30 * i))
        q.finish()

    recs = recorded(scenario, tickets)
    batches = resolve_both(recs, list(range(0, len(recs), 5)))
    spans = SpanBatch.concat(batches[0].tables, batches)
    kernel_tracks = set(spans.track[np.array(spans.cat_list()) == "kernel"].tolist())
    assert kernel_tracks and spans.n == len(recs)


# --- the passes on their own -------------------------------------------------------------------

def brute_group(keys: np.ndarray) -> tuple[list[int], list[int]]:
    rows = [tuple(r) for r in np.atleast_2d(keys).T.tolist()]
    first: dict[tuple, int] = {}
    for i, r in enumerate(rows):
        first.setdefault(r, i)
    order = list(first)
    return list(first.values()), [order.index(r) for r in rows]


def impls() -> list[passes.Impl]:
    return [passes.PYTHON] + ([] if DISABLED else [native_passes()])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(-3, 3), st.sampled_from([0, 1, -1, 2 ** 62, -2 ** 63])), max_size=300),
       st.booleans())
def test_group_numbers_groups_in_order_of_first_appearance(pairs, two):
    keys = np.array(pairs, np.int64).reshape(-1, 2).T.copy()
    keys = keys if two else keys[0]
    want = brute_group(keys)
    for impl in impls():
        first, inverse = impl.group(keys)
        assert (first.tolist(), inverse.tolist()) == want


def test_group_of_many_distinct_keys():
    keys = np.random.default_rng(1).integers(-2 ** 63, 2 ** 63 - 1, 50_000, dtype=np.int64)
    keys[::3] = 5  # one big group among many singletons
    results = [impl.group(keys) for impl in impls()]
    for first, inverse in results:
        assert np.array_equal(keys[first][inverse], keys)
        assert np.all(np.diff(first) > 0)
    for first, inverse in results[1:]:
        assert np.array_equal(first, results[0][0]) and np.array_equal(inverse, results[0][1])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 50), st.integers(0, 30)), max_size=60),
       st.lists(st.integers(0, 60), max_size=4))
def test_first_fit_puts_each_command_on_the_first_free_lane(cmds, lane_ends):
    cmds = sorted((s, s + d) for s, d in cmds)
    starts, ends = np.array([c[0] for c in cmds], np.int64), np.array([c[1] for c in cmds], np.int64)
    last = list(lane_ends)
    want = []
    for s, e in cmds:
        j = next((j for j, x in enumerate(last) if x <= s), len(last))
        last[j:j + 1] = [e]
        want.append(j)
    for impl in impls():
        lanes, new_ends = impl.first_fit(starts, ends, np.array(lane_ends, np.int64))
        assert lanes.tolist() == want and new_ends.tolist() == last


rows = st.tuples(st.sampled_from([0, passes.LEAF, passes.REGION, passes.REGION_UNPLACED]),
                 st.integers(1, 8), st.integers(0, 8), st.integers(0, 2),
                 st.integers(-50, 50), st.integers(-50, 50), st.integers(0, 1000), st.integers(0, 1000))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(rows, max_size=40), max_size=6))
@example([[(passes.LEAF, 5, 9, 0, 0, 0, 0, 10), (passes.LEAF, 6, 9, 0, 0, 0, 5, 20)],
          [(passes.REGION, 9, 0, 0, 0, 0, 0, 0)]])  # two children widen their parent both ways
def test_extents_agree_batch_after_batch(batches):
    """Arbitrary (even inconsistent) rows: ids reused, parents missing, many tracks per parent."""
    nests = [impl.Extents() for impl in impls()]
    for batch in batches:
        cols = [np.array(c, np.int64) for c in zip(*batch)] if batch else [np.zeros(0, np.int64)] * 8
        results = []
        for x in nests:
            rs, re_ = cols[6].copy(), cols[7].copy()
            x.nest(*cols[:6], rs, re_)
            results.append((rs.tolist(), re_.tolist(), len(x)))
        assert all(r == results[0] for r in results[1:])


def test_extents_keep_many_parents_and_give_them_back():
    """Past the first table sizes (rebuilds, removed slots reused), every parent gets its children's extent."""
    for impl in impls():
        x = impl.Extents()
        n = 20_000
        parent = np.arange(1, n + 1, dtype=np.int64)
        zeros = np.zeros(n, np.int64)
        for track in (7, 8):  # each parent has children on two tracks
            x.nest(np.full(n, passes.LEAF, np.int64), zeros + 10 ** 6, parent, zeros + track, zeros, zeros,
                   -parent, parent * 2)
        assert len(x) == 2 * n
        rs, re_ = zeros.copy(), zeros.copy()
        x.nest(np.full(n, passes.REGION, np.int64), parent, zeros, zeros + 8, zeros, zeros, rs, re_)
        assert np.array_equal(rs, -parent) and np.array_equal(re_, parent * 2) and len(x) == 0


def test_native_passes_release_the_gil():
    native = native_passes()
    keys = np.random.default_rng(2).integers(0, 1 << 40, 4_000_000, dtype=np.int64)
    count = [0]
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            count[0] += 1

    t = threading.Thread(target=spin)
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-4)
    t.start()
    try:
        time.sleep(0.01)
        during = []
        for _ in range(3):
            before = count[0]
            native.group(keys)
            during.append(count[0] - before)
    finally:
        stop.set()
        t.join()
        sys.setswitchinterval(old)
    assert max(during) > 0  # the other thread ran while the C pass did


def test_devices_says_which_resolver_passes_run():
    from cltrace.cli.commands import _native_parts

    want = "python (fallback: CLTRACE_NATIVE=0)" if DISABLED else "native (C extension)"
    assert _native_parts()["resolver passes"] == want == passes.DETAIL
