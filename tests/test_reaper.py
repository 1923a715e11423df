"""The reaper (timeline/_reaper.c): launch records carry tickets, and a native thread reads each
command's stamps and releases its event as soon as the command is done, while no Python thread runs
the resolver (the H200 case: a launch loop starving every other Python thread of the GIL).

Real PoCL events throughout. The fallback-only run (CLTRACE_NATIVE=0) skips these: it has no reaper.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from typing import Any

import numpy as np
import pyopencl as cl
import pytest

import cltrace
from cltrace.read.load import load
from cltrace.record.recorder import RECORDER
from cltrace.timeline import stamps
from cltrace.timeline.raw import R_CAT, R_EV0
from cltrace.timeline.spans import SYNC

pytestmark = pytest.mark.skipif(os.environ.get("CLTRACE_NATIVE", "").strip() == "0",
                                reason="CLTRACE_NATIVE=0: no reaper on the fallback")


@pytest.fixture(autouse=True)
def reaper() -> None:
    if stamps.REAPER is None:
        pytest.fail(f"the reaper is not active ({stamps.DETAIL or stamps.WHY}): reinstall with `pip install -e .`")


def holders(evs: list[Any]) -> set[int]:
    """How many references to each of the program's Events there are besides the test's list."""
    return {sys.getrefcount(evs[i]) - 2 for i in range(len(evs))}  # the list and getrefcount's argument


def until(cond: Any, timeout: float = 30.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.005)
    return cond()


def launch_blocked(queue: Any, kernels: Any, n: int, keep_events: bool) -> tuple[list[Any], list[tuple]]:
    """``n`` launches while the resolver cannot run (its lock held, as a starved worker); returns the
    program's own Events and the records waiting."""
    RECORDER.configure(max_pending=1 << 20, tickets_above=0)
    cltrace.start()
    with RECORDER._lock:
        ctx = stamps.events_kept() if keep_events else None
        if ctx:
            ctx.__enter__()
        try:
            evs = [kernels.launch_add(queue) for _ in range(n)]
        finally:
            if ctx:
                ctx.__exit__(None, None, None)
        queue.finish()
        recs = [r for r in RECORDER.pending if r[R_CAT] != SYNC]  # not the finish's host-only record
        if not keep_events:
            assert until(lambda: stamps.reaper_stats()["held"] == 0)
        return evs, recs


def test_events_are_released_while_the_resolver_cannot_run(queue: Any, kernels: Any) -> None:
    evs, recs = launch_blocked(queue, kernels, 500, keep_events=False)
    assert all(type(r[R_EV0]) is int for r in recs)  # tickets, not Events
    assert holders(evs) == {0}  # no record holds the program's Events
    assert stamps.reaper_stats()["held"] == 0  # and the reaper has released its own references
    cltrace.stop()
    spans = RECORDER.spans()
    kernels_ = [s for s in spans if s.cat == "kernel"]
    assert len(kernels_) == 500
    assert all(s.dev_start is not None and s.dev_end - s.dev_start == s.raw_end - s.raw_start for s in kernels_)


def test_without_the_reaper_records_hold_the_events(queue: Any, kernels: Any) -> None:
    evs, recs = launch_blocked(queue, kernels, 200, keep_events=True)
    assert all(isinstance(r[R_EV0], cl.Event) for r in recs)
    assert holders(evs) == {1}  # each record's reference waits for the resolver


def test_records_trade_events_for_tickets_only_past_the_threshold(queue: Any, kernels: Any) -> None:
    """While the worker keeps up the driver's events stay in the records (the reaper costs nothing);
    past ``tickets_above`` records waiting, every new record holds a ticket instead."""
    RECORDER.configure(max_pending=1 << 20, tickets_above=300)
    cltrace.start()
    with RECORDER._lock:
        for _ in range(1000):
            kernels.launch_add(queue)
        queue.finish()
        kinds = [type(r[R_EV0]) is int for r in RECORDER.pending if r[R_CAT] != SYNC]
    assert kinds == [False] * 300 + [True] * 700
    cltrace.stop()
    assert len([s for s in RECORDER.spans() if s.cat == "kernel" and s.dev_start is not None]) == 1000


def test_every_slot_is_freed_once_resolved_or_dropped(queue: Any, kernels: Any) -> None:
    before = stamps.reaper_stats()
    RECORDER.configure(max_pending=16, tickets_above=0, memory_budget_mb=1)  # hard cap 4 * 16 + 4096: the rest dropped
    cltrace.start()
    with RECORDER._lock:
        for _ in range(RECORDER.hard_cap + 3000):
            kernels.launch_add(queue)
        queue.finish()
    cltrace.stop()
    RECORDER.flush()
    assert RECORDER.lost > 0
    after = stamps.reaper_stats()
    assert after["tracked"] - before["tracked"] >= RECORDER.hard_cap + 3000
    assert until(lambda: stamps.reaper_stats()["held"] == 0)
    assert stamps.reaper_stats()["blocks"] <= max(before["blocks"], 1) + 1  # no slot left behind


def test_peek_reads_a_command_the_reaper_has_not_reached(queue: Any, kernels: Any) -> None:
    """The resolver never waits for the reaper: it reads a done command's ticket itself."""
    ev = kernels.launch_add(queue)
    queue.finish()
    t = stamps.track(ev)
    assert type(t) is int
    status, st, failed = stamps.peek(np.array([t], np.uint64))
    assert status[0] == 0 and not failed[0]
    assert st[0].tolist() == [ev.profile.queued, ev.profile.submit, ev.profile.start, ev.profile.end]
    stamps.done([t])
    assert stamps.peek(np.array([t], np.uint64))[0][0] == -58  # freed: CL_INVALID_EVENT


def test_the_same_command_tracked_again_shares_its_ticket(queue: Any, kernels: Any) -> None:
    """A projected region ends at its last launch: that command is read once, and its slot lives until
    the last record holding it is done."""
    ev = kernels.launch_add(queue)
    queue.finish()
    shared = stamps.reaper_stats()["shared"]
    t = stamps.track(ev)
    assert stamps.track(ev) == t and stamps.track(ev) == t
    assert stamps.reaper_stats()["shared"] == shared + 2
    want = [ev.profile.queued, ev.profile.submit, ev.profile.start, ev.profile.end]
    for _ in range(2):
        stamps.done([t])
        status, st, _ = stamps.peek(np.array([t], np.uint64))
        assert status[0] == 0 and st[0].tolist() == want  # another record still holds it
    stamps.done([t])
    assert stamps.peek(np.array([t], np.uint64))[0][0] == -58
    other = kernels.launch_add(queue)
    queue.finish()
    t1 = stamps.track(other)
    t2 = stamps.track(ev)
    assert t1 != t and t2 not in (t, t1)  # not the newest ticket's command: a ticket of its own
    stamps.done([t1, t2])


def test_projected_regions_read_their_last_launch_once(queue: Any, kernels: Any) -> None:
    """Nested regions on a queue end at commands already tracked: no second read, the same stamps, and
    every slot freed once the spans are resolved."""
    before = stamps.reaper_stats()
    RECORDER.configure(max_pending=1 << 20, tickets_above=0)
    cltrace.start()
    for _ in range(50):
        with cltrace.region("step", queue):
            with cltrace.region("forward", queue):
                kernels.launch_add(queue)
                kernels.launch_add(queue)
            with cltrace.region("optimizer", queue):
                kernels.launch_add(queue)
    queue.finish()
    cltrace.stop()
    after = stamps.reaper_stats()
    # forward, optimizer and step end at a launch of theirs: shared, unless the reaper had already read and
    # released it (its slot no longer holds the event, so the handle could be another command's by then)
    assert 100 <= after["shared"] - before["shared"] <= 150
    spans = RECORDER.spans()
    launches = sorted((s for s in spans if s.cat == "kernel"), key=lambda s: s.dev_start)
    regions = {name: sorted((s for s in spans if s.name == name), key=lambda s: s.dev_start)
               for name in ("step", "forward", "optimizer")}
    assert len(launches) == 150 and all(len(r) == 50 for r in regions.values())
    for i in range(50):
        first, second, third = launches[3 * i:3 * i + 3]
        assert regions["forward"][i].dev_end == second.dev_end
        assert regions["optimizer"][i].dev_end == third.dev_end
        assert regions["step"][i].dev_end == third.dev_end and regions["step"][i].dev_start == first.dev_start
    assert until(lambda: stamps.reaper_stats()["held"] == 0)
    assert stamps.reaper_stats()["blocks"] <= max(before["blocks"], 1) + 1  # no shared slot left behind


def test_a_held_back_command_waits_and_a_failed_one_says_so(cl_ctx: Any, kernels: Any) -> None:
    q = cltrace.profiling_queue(cl_ctx)
    gate, bad = cl.UserEvent(cl_ctx), cl.UserEvent(cl_ctx)
    try:
        add = kernels.kernel("add")
        held = stamps.track(cltrace.launch(add, q, (kernels.n,), None, kernels.a, kernels.b, wait_for=[gate]))
        q2 = cltrace.profiling_queue(cl_ctx)
        doomed = stamps.track(cltrace.launch(add, q2, (kernels.n,), None, kernels.a, kernels.b, wait_for=[bad]))
        time.sleep(0.05)
        status, _, _ = stamps.peek(np.array([held, doomed], np.uint64))
        assert (status > 0).all()  # still waiting: peeked again later
        assert stamps.running(held)
        gate.set_status(cl.command_execution_status.COMPLETE)
        bad.set_status(-1)
        stamps.wait_tickets(np.array([held, doomed], np.uint64))
        status, st, failed = stamps.peek(np.array([held, doomed], np.uint64))
        assert status[0] == 0 and not failed[0] and st[0, 3] >= st[0, 2] > 0
        assert status[1] < 0 and failed[1]
        stamps.done([held, doomed])
    finally:
        for g in (gate, bad):
            if g.command_execution_status > 0:
                g.set_status(cl.command_execution_status.COMPLETE)


def test_a_traced_program_exits_cleanly_with_the_reaper_running(tmp_path: Any) -> None:
    """At exit the last records are resolved (inline where the reaper has stopped) and the process
    ends without a hang or a crash in the driver's teardown."""
    out = tmp_path / "t.json"
    script = textwrap.dedent(f"""
        import cltrace, pyopencl as cl, numpy as np
        q = cltrace.profiling_queue()
        prg = cltrace.compile("__kernel void k(__global float *x) {{ x[get_global_id(0)] += 1.0f; }}",
                              context=q.context)
        buf = cl.Buffer(q.context, cl.mem_flags.READ_WRITE, 4 * 256)
        cltrace.start({str(out)!r})
        for _ in range(3000):
            prg.k[256, None, q](buf)
    """)
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    spans, meta = load(str(out))
    ks = [s for s in spans if s.name == "k"]
    assert len(ks) == 3000 and meta["dropped_spans"] == 0
    assert all(s.dev_end is not None and s.dev_end >= s.dev_start for s in ks)  # every one timed by the device


def harvests() -> dict[str, int]:
    st = stamps.reaper_stats()
    return {k: st[k] for k in ("harvests", "harvested", "harvests_declined", "harvests_front")}


@pytest.fixture
def only_harvests() -> Any:
    """The reaper's thread and the resolver leave every ticket to the launching thread's harvests (the
    program never counts as quiet, no ticket grows stale); the harvest count starts from zero."""
    from cltrace._ext import stamps as _stamps

    was = _stamps.reaper_config(250_000, 2_000_000, 1024, 10**9, 10**11)
    try:
        yield
    finally:
        _stamps.reaper_config(*was)


def test_the_launching_thread_harvests_its_own_commands(queue: Any, kernels: Any, only_harvests: Any) -> None:
    """Every 1024 commands, where the device keeps up, the launching thread waits for its newest command
    (done already) and reads and releases what it launched there; the spans are whole."""
    before = harvests()
    cltrace.start()
    n = 0
    while n < 20_000 and (n < 2560 or harvests()["harvests"] - before["harvests"] < 2):
        for _ in range(16):
            kernels.launch_add(queue)
        n += 16
        queue.finish()  # the device has caught up: a harvest's probe finds its command done
    after = harvests()
    cltrace.stop()
    assert after["harvests"] - before["harvests"] >= 2
    assert after["harvested"] - before["harvested"] >= 1024  # all 1024 between two harvests, at least
    ks = [s for s in RECORDER.spans() if s.cat == "kernel"]
    assert len(ks) == n
    assert all(s.dev_start is not None and s.dev_end - s.dev_start == s.raw_end - s.raw_start for s in ks)


def test_a_harvest_never_waits_on_a_command_held_back(cl_ctx: Any, kernels: Any, only_harvests: Any) -> None:
    """A command waiting on a user event the program sets later: no harvest waits for it (a wait would
    hang). Where its probe finds the device behind, the harvest is declined; where only the newest
    command waits, it reads the completed front of the queue (the commands before the held one) and
    leaves the held one and those after it unread."""
    q = cltrace.profiling_queue(cl_ctx)
    add = kernels.kernel("add")
    gate = cl.UserEvent(cl_ctx)
    before = harvests()
    cltrace.start()
    try:
        for _ in range(1000):
            cltrace.launch(add, q, (kernels.n,), None, kernels.a, kernels.b)
        q.finish()
        cltrace.launch(add, q, (kernels.n,), None, kernels.a, kernels.b, wait_for=[gate])
        for _ in range(1100):  # the 1024th command asks: 64 back is done, the newest waits for the gate
            cltrace.launch(add, q, (kernels.n,), None, kernels.a, kernels.b)
        mid = harvests()
        assert mid["harvests_front"] - before["harvests_front"] >= 1  # 64 back done, the newest held
        assert mid["harvests_declined"] - before["harvests_declined"] >= 1  # later: 64 back held too
        assert 0 < mid["harvested"] - before["harvested"] <= 1000  # completed commands only
    finally:
        gate.set_status(cl.command_execution_status.COMPLETE)
    q.finish()
    cltrace.stop()
    ks = [s for s in RECORDER.spans() if s.cat == "kernel"]
    assert len(ks) == 2101
    assert all(s.dev_start is not None and s.dev_end - s.dev_start == s.raw_end - s.raw_start for s in ks)
    ks = [s for s in RECORDER.spans() if s.cat == "kernel"]
    assert len(ks) == 2101 and all(s.dev_start is not None for s in ks)


@pytest.mark.parametrize("hold_ns", [0, 200_000, 2_000_000])
def test_harvests_are_short_while_other_threads_launch(queue: Any, kernels: Any, only_harvests: Any,
                                                       hold_ns: int) -> None:
    """Two threads launching on one queue: a harvest then reads with the GIL held (and keeps it through the
    first ``hold_ns`` of its wait) and the other thread waits for it, so harvests come every ~128 commands
    instead of every 1024; every span is still whole."""
    from cltrace._ext import stamps as _stamps

    _stamps.reaper_config(250_000, 2_000_000, -1, -1, -1, hold_ns)
    add = [cl.Kernel(kernels.add.program, "add") for _ in range(2)]  # a kernel object each: no shared args
    before = harvests()
    cltrace.start()
    counts = [0, 0]

    def body(i: int) -> None:
        while counts[i] < 6000:
            for _ in range(16):
                kernels.launch_add(queue, add[i])
            counts[i] += 16
            queue.finish()

    ts = [threading.Thread(target=body, args=(i,)) for i in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    after = harvests()
    cltrace.stop()
    made = after["harvests"] - before["harvests"]
    read = after["harvested"] - before["harvested"]
    # A harvest is declined when the device has not caught up within its 2 ms poll (often, on a loaded
    # host); the next one then reads what it left. The interval shows in the attempts.
    tried = made + after["harvests_declined"] - before["harvests_declined"]
    assert made >= 8, after
    assert read / tried < 400, (read, made, tried)
    ks = [s for s in RECORDER.spans() if s.cat == "kernel"]
    assert len(ks) == sum(counts) and all(s.dev_start is not None for s in ks)


@pytest.mark.parametrize("hold_ns", [200_000, 2_000_000])
def test_a_harvest_keeping_the_gil_never_waits_for_a_held_back_command(cl_ctx: Any, kernels: Any, only_harvests: Any,
                                                                       hold_ns: int) -> None:
    """While another thread launches, a harvest keeps the GIL through the start of its wait for the device:
    a newest command held back by a user event is never waited for; the harvest reads the completed
    commands before it (within ``spin_ns``) and leaves it unread."""
    from cltrace._ext import stamps as _stamps

    q, other_q = cltrace.profiling_queue(cl_ctx), cltrace.profiling_queue(cl_ctx)
    add, other = kernels.kernel("add"), cl.Kernel(kernels.add.program, "add")
    gate = cl.UserEvent(cl_ctx)
    cltrace.start()
    try:
        t = threading.Thread(target=lambda: [kernels.launch_add(other_q, other) for _ in range(8)])
        t.start()
        t.join()  # another thread launched lately: the harvests below count others as launching
        for _ in range(1000):
            cltrace.launch(add, q, (kernels.n,), None, kernels.a, kernels.b)
        q.finish()
        _stamps.reaper_config(250_000, 2_000_000, 1024, -1, -1, hold_ns)  # the count starts again
        before = harvests()
        for _ in range(1023):
            cltrace.launch(add, q, (kernels.n,), None, kernels.a, kernels.b)
        q.finish()
        t0 = time.perf_counter()
        # The 1024th command: its harvest finds the command 64 back done and the newest waiting for the gate.
        cltrace.launch(add, q, (kernels.n,), None, kernels.a, kernels.b, wait_for=[gate])
        spent = time.perf_counter() - t0
        mid = harvests()
        assert mid["harvests_front"] - before["harvests_front"] == 1, (before, mid)
        assert mid["harvested"] - before["harvested"] == 2023, (before, mid)  # every command before the held one
        assert spent < 0.5, spent
    finally:
        gate.set_status(cl.command_execution_status.COMPLETE)
    q.finish()
    other_q.finish()
    cltrace.stop()
    ks = [s for s in RECORDER.spans() if s.cat == "kernel"]
    assert len(ks) == 2032 and all(s.dev_start is not None for s in ks)


def test_wait_reads_and_releases_what_the_reaper_has_not_taken(queue: Any, kernels: Any, only_harvests: Any) -> None:
    """``wait_tickets`` (the resolve of ``stop()``'s tail) takes the tickets still waiting for the reaper with
    the reaper's own reference: read and released at once, no second reader, no retain of its own."""
    evs = [kernels.launch_add(queue) for _ in range(100)]  # no queue given to track: no harvest
    held = stamps.reaper_stats()["held"]
    ts = np.array([stamps.track(e) for e in evs], np.uint64)
    assert stamps.reaper_stats()["held"] == held + 100
    stamps.wait_tickets(ts)
    assert stamps.reaper_stats()["held"] == held  # released by the wait (the reaper leaves them for 1 s)
    status, st, failed = stamps.peek(ts)
    assert (status == 0).all() and not failed.any()
    assert st.tolist() == [[e.profile.queued, e.profile.submit, e.profile.start, e.profile.end] for e in evs]
    stamps.done(ts)


def test_reaper_config_checks_the_shared_hold_and_the_spin() -> None:
    from cltrace._ext import stamps as _stamps

    was = _stamps.reaper_config(250_000, 2_000_000)
    try:
        assert len(was) == 7 and 0 <= was[5] <= 2_000_000 and 0 <= was[6] <= 2_000_000
        with pytest.raises(ValueError):
            _stamps.reaper_config(250_000, 2_000_000, -1, -1, -1, 2_000_001)
        with pytest.raises(ValueError):
            _stamps.reaper_config(250_000, 2_000_000, -1, -1, -1, -1, 2_000_001)
        _stamps.reaper_config(250_000, 2_000_000, -1, -1, -1, 0, 1000)
        assert _stamps.reaper_config(250_000, 2_000_000)[5:] == (0, 1000)
    finally:
        _stamps.reaper_config(*was)
