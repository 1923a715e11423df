"""Placement: the offset each device command is drawn with, fixed once used.

The clock map (``clock.DeviceClock``) says where device time *should* land on the host clock; it
drifts by microseconds per second on some drivers. Drawing every stamp with that moving offset
would either stretch durations or let consecutive commands overlap. So each command gets one
offset for all its stamps (durations stay exactly END - START), and the offset a device's
commands are drawn with is piecewise constant in device time: it changes only at the start of a
command, towards the map's target, and it moves later commands earlier by less than the device's
idle gap before that command (moving them later is always safe). Commands keep their order on
every queue and never overlap; how far the drawing strays from the map is recorded
(``worst_ns``) and added to the clock's bound.
"""
from __future__ import annotations

import bisect
import threading
from array import array
from contextlib import contextmanager
from typing import Iterator, NamedTuple

import numpy as np


class NativeView(NamedTuple):
    """A placement as the native placement (``_resolve.finish``, the C twin of ``Placement.place``) reads and
    updates it, in the order that call takes a clock's placement (after the clock's three knot arrays)."""

    steps: array  # device times where the offset changes, ascending (int64; read only)
    offsets: array  # the offset from each of them on (int64; read only)
    new_steps: np.ndarray  # room for the steps the call adds (int64[room])
    new_offsets: np.ndarray  # and their offsets (int64[room])
    state: np.ndarray  # int64[8]: has a last start, last start, has a max end, max end, worst, changes,
    #                    threshold, steps added (the call sets the last)


class Placement:
    """The committed offsets of one device's commands (device ns -> offset ns, a step function)."""

    def __init__(self, threshold_ns: int = 100) -> None:
        self.threshold_ns = threshold_ns
        self._t = array("q")  # device times where the offset changes, ascending
        self._o = array("q")  # the offset from each of them on
        self._last_start: int | None = None  # latest command start placed
        self._max_end: int | None = None  # latest command end placed, device-wide
        self.worst_ns = 0  # largest |target - applied| so far
        self.changes = 0
        self._lock = threading.Lock()

    def lookup(self, device_ns: np.ndarray | int) -> np.ndarray | int:
        """The offset in force at these device times (region edges, late stamps, profiles)."""
        with self._lock:
            t, o = self._t, self._o
            if not t:
                raise LookupError("nothing placed yet")
            if isinstance(device_ns, (int, np.integer)):
                return o[max(0, bisect.bisect_right(t, int(device_ns)) - 1)]
            i = np.maximum(np.searchsorted(np.array(t, np.int64), device_ns, "right") - 1, 0)
            return np.array(o, np.int64)[i]

    def place(self, starts: np.ndarray, ends: np.ndarray, target: np.ndarray) -> np.ndarray:
        """Offsets for a batch of commands (raw START, END, and the map's offset at each START)."""
        n = len(starts)
        out = np.empty(n, np.int64)
        if not n:
            return out
        with self._lock:
            order = np.argsort(starts, kind="stable")
            s, e, tg = starts[order], ends[order], target[order]
            late = np.zeros(n, bool) if self._last_start is None else s < self._last_start
            if late.any():  # ran before what is already drawn (another queue, resolved later): no new steps
                i = np.maximum(np.searchsorted(np.array(self._t, np.int64), s[late], "right") - 1, 0)
                out[order[late]] = np.array(self._o, np.int64)[i]
            new = np.flatnonzero(~late)
            if len(new):
                out[order[new]] = self._walk(s[new], e[new], tg[new])
            self.worst_ns = max(self.worst_ns, int(np.abs(out - target).max()))
        return out

    @property
    def empty(self) -> bool:
        """Nothing placed yet (``lookup`` raises LookupError)."""
        return not self._t

    @property
    def last_start(self) -> int | None:
        """The latest command start placed (None: none yet); a command starting before it gets no new step."""
        return self._last_start

    @property
    def max_end(self) -> int | None:
        """The latest command end placed, device-wide (None: none yet)."""
        return self._max_end

    def steps(self) -> tuple[list[int], list[int]]:
        """The step function so far: the device times where the offset changes, and the offset from each on."""
        with self._lock:
            return self._t.tolist(), self._o.tolist()

    @contextmanager
    def native(self, room: int) -> Iterator[NativeView]:
        """This placement held (locked) while the native placement places at most ``room`` new commands and
        regions into the ``NativeView`` yielded; on leaving the block normally, what it placed is taken back
        (steps and state). Leaving on an exception changes nothing."""
        with self._lock:
            view = NativeView(self._t, self._o, np.empty(room, np.int64), np.empty(room, np.int64),
                              np.array([self._last_start is not None, self._last_start or 0,
                                        self._max_end is not None, self._max_end or 0, self.worst_ns, self.changes,
                                        self.threshold_ns, 0], np.int64))
            yield view
            self._take_back(view.state, view.new_steps, view.new_offsets)

    def _take_back(self, state: np.ndarray, new_t: np.ndarray, new_o: np.ndarray) -> None:
        """What the native placement left in a ``NativeView``: its state, and the steps it added (``state[7]``
        of them at the head of ``new_t``, ``new_o``). Hold ``_lock``."""
        has_last, last, has_max, max_end, worst, changes, _, added = state.tolist()
        self._last_start = last if has_last else None
        self._max_end = max_end if has_max else None
        self.worst_ns, self.changes = worst, changes
        if added:
            self._t.frombytes(new_t[:added].tobytes())
            self._o.frombytes(new_o[:added].tobytes())

    def _walk(self, s: np.ndarray, e: np.ndarray, tg: np.ndarray) -> np.ndarray:
        """Offsets for commands in start order, stepping towards the target where the gaps allow."""
        n = len(s)
        before = np.maximum.accumulate(e)
        prev_end = np.empty(n, np.int64)
        prev_end[0] = self._max_end if self._max_end is not None else np.iinfo(np.int64).min // 2
        if n > 1:
            prev_end[1:] = np.maximum(before[:-1], prev_end[0])
        gap = s - prev_end  # device idle time before each command (negative: overlaps one still running)
        if not self._o:
            self._t.append(int(s[0]))
            self._o.append(int(tg[0]))
        cur = self._o[-1]
        out = np.empty(n, np.int64)
        k = 0
        thr = self.threshold_ns
        while k < n:
            d = tg[k:] - cur
            can = (d < -thr) | ((d > thr) & (gap[k:] > 1))
            hit = np.flatnonzero(can)
            if not len(hit):
                out[k:] = cur
                break
            j = k + int(hit[0])
            out[k:j] = cur
            step = int(d[j - k])
            cur = cur + step if step < 0 else cur + min(step, int(gap[j]) - 1)
            self._t.append(int(s[j]))
            self._o.append(cur)
            self.changes += 1
            out[j] = cur
            k = j + 1
        self._last_start = int(s[-1])
        end = int(before[-1])
        self._max_end = end if self._max_end is None else max(self._max_end, end)
        return out
