"""``Placement``'s public interface: what the resolver's native tail borrows (``Placement.native``) and what
readers see (``steps``, ``last_start``, ``max_end``, ``empty``). The native placement itself is held equal to
``Placement.place`` by tests/test_resolve_twins.py; here, the lending contract, without the C code."""
from __future__ import annotations

import threading

import numpy as np
import pytest

from cltrace.timeline.placement import Placement


def placed() -> Placement:
    pl = Placement(threshold_ns=100)
    pl.place(np.array([1_000, 5_000], np.int64), np.array([2_000, 6_000], np.int64), np.array([10, 900], np.int64))
    return pl


def test_a_new_placement_is_empty_and_lookup_says_so() -> None:
    pl = Placement()
    assert pl.empty and pl.steps() == ([], []) and pl.last_start is None and pl.max_end is None
    with pytest.raises(LookupError):
        pl.lookup(0)
    pl.place(np.array([7], np.int64), np.array([9], np.int64), np.array([3], np.int64))
    assert not pl.empty and pl.steps() == ([7], [3]) and (pl.last_start, pl.max_end) == (7, 9)


def test_native_lends_the_steps_and_state_and_takes_back_what_was_added() -> None:
    pl = placed()
    times, offsets = pl.steps()
    assert times == [1_000, 5_000] and offsets == [10, 900]  # the second command started after an idle gap
    with pl.native(room=3) as v:
        assert list(v.steps) == times and list(v.offsets) == offsets
        assert len(v.new_steps) == len(v.new_offsets) == 3
        assert v.state.tolist() == [1, 5_000, 1, 6_000, pl.worst_ns, pl.changes, 100, 0]
        reader = threading.Thread(target=pl.steps)  # waits: the placement is held while lent
        reader.start()
        reader.join(0.2)
        assert reader.is_alive()
        # What ``_resolve.finish`` does for one command at 8000..8500 stepping to offset 950:
        v.new_steps[0], v.new_offsets[0] = 8_000, 950
        v.state[:] = [1, 8_000, 1, 8_500, 40, pl.changes + 1, 100, 1]
    reader.join(5)
    assert not reader.is_alive()
    assert pl.steps() == ([1_000, 5_000, 8_000], [10, 900, 950])
    assert (pl.last_start, pl.max_end, pl.worst_ns) == (8_000, 8_500, 40)
    assert pl.lookup(9_000) == 950


def test_native_changes_nothing_when_the_block_raises_and_releases_the_lock() -> None:
    pl = placed()
    before = (pl.steps(), pl.last_start, pl.max_end, pl.worst_ns, pl.changes)
    with pytest.raises(RuntimeError):
        with pl.native(room=2) as v:
            v.new_steps[0], v.new_offsets[0] = 8_000, 950
            v.state[:] = [1, 8_000, 1, 8_500, 40, 9, 100, 1]
            raise RuntimeError("the native call failed")
    reader = threading.Thread(target=pl.steps)  # the lock was released: a reader gets through
    reader.start()
    reader.join(5)
    assert not reader.is_alive()
    assert (pl.steps(), pl.last_start, pl.max_end, pl.worst_ns, pl.changes) == before
