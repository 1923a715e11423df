"""The part of a run a report is about: steps, a time range, a region's occurrences, or the steady state.

A run's start-up (imports, context creation, program builds) is no part of the user's loop, yet over
the whole run it is idle device time that swamps the loop's. A ``Window`` says which part to keep;
``select`` resolves it on a trace's columns and ``apply`` gives the columns every question then
reads (``analysis``, ``summary`` and ``diff`` apply it first, so all answers are about one window).

- **Which spans**: a span is in the window when its host begin is (the rule a schedule uses to give
  work to a step), so a kernel launched inside counts whole even where the device runs it later,
  and a region counts with its whole time.
- **Which time** (utilisation's wall time): the window's intervals, each stretched to the device
  end of the commands launched in it; for the steady state, less the builds' host time.
- **Steady state** (``STEADY``, the default of ``cltrace analyze``): where the run marks steps, every
  step after the first (steps a schedule withheld, and the time between steps, are not in it); else
  from the first kernel launch (from the outermost region open then, so a loop's first iteration
  counts whole) to the end. Builds are set apart either way: their host time is not
  in the time analysed, and every build of the run is kept as a span (the build findings count them
  all, set-up included).

Explicit windows combine (all must hold): ``steps`` (step numbers as ``cltrace.step()``/``steps()``
marked them, both ends included), ``start_ms``/``end_ms`` (milliseconds since the trace's first
span) and ``region`` (only the time inside that region's occurrences, by name or by the last parts
of its path, ``body/fwd``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import WindowError
from ..timeline.spans import KERNEL, STEP
from .intervals import Coverage, holding, intersect, subtract, union
from .model import TraceData
from .text import fmt_ns, plural

ALL = "all"  # steps="all": every step


@dataclass(frozen=True)
class Window:
    """What part of a run to analyse; ``Window()`` is the whole run, ``STEADY`` the steady state."""

    steps: tuple[int | None, int | None] | str | None = None  # (first, last) step numbers, ends included; "all"
    start_ms: float | None = None  # since the trace's first span
    end_ms: float | None = None
    region: str | None = None  # a region's name, or its path's last parts ("step/forward", "forward")
    steady: bool = False

    def __post_init__(self) -> None:
        if self.steady and (self.steps is not None or self.start_ms is not None or self.end_ms is not None
                            or self.region is not None):
            raise WindowError("the steady state is a window of its own: give it, or steps, a time range or a region")
        if self.start_ms is not None and self.end_ms is not None and self.end_ms <= self.start_ms:
            raise WindowError(f"the window ends ({self.end_ms:g} ms) before it starts ({self.start_ms:g} ms)")
        if isinstance(self.steps, str) and self.steps != ALL:
            raise WindowError(f"steps is (first, last) or 'all', not {self.steps!r}")

    @property
    def whole(self) -> bool:
        return not self.steady and self.steps is None and self.start_ms is None and self.end_ms is None \
            and self.region is None

    @classmethod
    def of(cls, steps: str | None = None, start_ms: float | None = None, end_ms: float | None = None,
           region: str | None = None) -> "Window":
        """From the command line's words: ``steps`` as ``A:B``, ``A:``, ``:B``, ``N`` or ``all``."""
        return cls(parse_steps(steps) if steps is not None else None, start_ms, end_ms, region)


STEADY = Window(steady=True)
WHOLE = Window()


def parse_steps(text: str) -> tuple[int | None, int | None] | str:
    """``A:B`` (both included), ``A:``, ``:B``, ``N`` or ``all``; a ValueError naming the form otherwise."""
    t = text.strip()
    if t == ALL:
        return ALL
    a, colon, b = t.partition(":")
    try:
        first = int(a) if a.strip() else None
        last = (int(b) if b.strip() else None) if colon else first
    except ValueError:
        raise WindowError(f"--steps {text!r}: give A:B (both included), A:, :B, N or all") from None
    if first is not None and last is not None and last < first:
        raise WindowError(f"--steps {text!r}: the last step comes before the first")
    return first, last


def as_window(w: "Window | str | None") -> Window:
    """A Window from what the API takes: a Window, ``"steady"``, ``"whole"``/None, or a steps text."""
    if isinstance(w, Window):
        return w
    if w is None or w == "whole":
        return WHOLE
    if w == "steady":
        return STEADY
    if isinstance(w, str):
        return Window(steps=parse_steps(w))
    raise WindowError(f"window must be a Window, 'steady', 'whole' or a steps text such as '2:12', not {w!r}")


@dataclass
class Selection:
    """A window resolved on one trace: the rows in it, the intervals analysed, and what it is in words."""

    rows: np.ndarray | None  # row indices kept; None: every row
    starts: np.ndarray  # the intervals analysed (host timeline, ns), disjoint and sorted
    ends: np.ndarray
    label: str  # what it covers: "the whole run", "steps 2-12", ...
    note: str = ""  # what was left out and how to see it all
    left_out: dict[str, Any] = field(default_factory=dict)  # steps, start_ns, builds_ns
    kind: str = "whole"  # whole, steady, steps, time, region (several: joined by "+")

    def as_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "label": self.label, "note": self.note, "intervals": len(self.starts),
                "from_ns": int(self.starts[0]) if len(self.starts) else None,
                "to_ns": int(self.ends[-1]) if len(self.ends) else None,
                "wall_ns": int((self.ends - self.starts).sum()), **self.left_out}

    @property
    def words(self) -> str:
        return self.label + (f": {self.note}" if self.note else "")


def _steps(td: TraceData) -> tuple[np.ndarray, np.ndarray]:
    """The step rows by host begin, and each one's number (its ``step`` attribute, else its place)."""
    rows = np.flatnonzero(td.cat_mask(STEP))
    rows = rows[np.argsort(td.host_begin[rows], kind="stable")]
    nums = np.array([_step_number(td.attr(int(i), "step", k + 1), k + 1) for k, i in enumerate(rows.tolist())],
                    np.int64)
    return rows, nums


def _step_number(value: object, place: int) -> int:
    """A step span's number as the file says it, where it is a sensible integer; else its place (a file
    from elsewhere may say anything there)."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool) and 0 <= value < 1 << 62:
        return int(value)
    return place


def _span_of(nums: np.ndarray) -> str:
    """Step numbers in words: ``step 3``, ``steps 2-12``, ``steps 4, 7-8`` (runs of consecutive numbers)."""
    if not len(nums):
        return "no steps"
    v = np.unique(nums)
    cut = np.flatnonzero(np.diff(v) != 1) + 1
    runs = [f"{r[0]}" if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in np.split(v, cut)]
    return ("step " if len(v) == 1 else "steps ") + ", ".join(runs)


def _intervals(td: TraceData, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    s, e, _ = union(td.host_begin[rows], td.host_end[rows])
    return s, e


def _builds(td: TraceData) -> tuple[np.ndarray, np.ndarray]:
    return _intervals(td, np.flatnonzero(td.builds))


def _names(td: TraceData, rows: np.ndarray) -> list[str]:
    return sorted({td.names[td.name[i]] for i in rows.tolist()})


def select(td: TraceData, window: Window) -> Selection:
    """Resolve ``window`` on the trace; a ``WindowError`` (a ValueError) naming what the trace has where
    it matches nothing."""
    whole_s, whole_e = np.array([td.t0], np.int64), np.array([td.t1], np.int64)
    if window.whole or not td.n:
        return Selection(None, whole_s, whole_e, "the whole run")
    if window.steady:
        return _steady(td, whole_s, whole_e)
    hs, he = whole_s, whole_e  # where a span must begin to be in the window (host timeline)
    ts, te = whole_s, whole_e  # the time analysed (before it is stretched over the window's commands)
    label, kinds = [], []
    if window.steps is not None:
        rows, nums = _steps(td)
        if not len(rows):
            raise WindowError("the trace marks no steps (cltrace.step()/steps() under a schedule): "
                             "window it by time (--from/--to) or by a region (--region) instead")
        pick = np.ones(len(rows), bool)
        if window.steps != ALL:
            first, last = window.steps  # type: ignore[misc]
            pick = (nums >= (first if first is not None else nums.min())) & \
                   (nums <= (last if last is not None else nums.max()))
            if not pick.any():
                asked = f"step {first}" if first == last else \
                    f"step numbered {'' if first is None else first}:{'' if last is None else last}"
                raise WindowError(f"no {asked} in the trace (its steps: {_span_of(nums)})")
        hs, he = intersect(hs, he, *_intervals(td, rows[pick]))
        ts, te = intersect(ts, te, *_intervals(td, rows[pick]))
        label.append(_span_of(nums[pick]))
        kinds.append("steps")
    if window.start_ms is not None or window.end_ms is not None:
        a = td.origin + int(round((window.start_ms or 0.0) * 1e6))
        b = td.t1 if window.end_ms is None else td.origin + int(round(window.end_ms * 1e6))
        if a >= td.t1:
            raise WindowError(f"--from {window.start_ms:g} ms is past the trace's end "
                             f"({(td.t1 - td.origin) / 1e6:.3f} ms)")
        hs, he = intersect(hs, he, np.array([a], np.int64), np.array([b], np.int64))
        ts, te = intersect(ts, te, np.array([a], np.int64), np.array([b], np.int64))
        label.append(f"{(max(a, td.t0) - td.origin) / 1e6:.3f}-{(min(b, td.t1) - td.origin) / 1e6:.3f} ms")
        kinds.append("time")
    if window.region is not None:
        regions = np.flatnonzero(td.regions)
        name = window.region
        parts = tuple(name.split("/"))  # a name, or a path's last parts ("body/fwd" is also "step/body/fwd")
        occ = regions[[(td.path_of(int(i)) or (td.names[td.name[i]],))[-len(parts):] == parts
                       for i in regions.tolist()]] if len(regions) else regions
        if not len(occ):
            have = _names(td, regions[~td.cat_mask(STEP)[regions]])
            raise WindowError(f"no region {name!r} in the trace (its regions: "
                              f"{', '.join(have[:12]) + (' ...' if len(have) > 12 else '') if have else 'none'})")
        hs, he = intersect(hs, he, *_intervals(td, occ))
        # its time: each occurrence's device span where it has one (its commands' time), else its host span
        dev = td.on_device[occ]
        os_, oe, _ = union(np.where(dev, td.dev_start[occ], td.host_begin[occ]),
                           np.where(dev, td.dev_end[occ], td.host_end[occ]))
        ts, te = intersect(ts, te, os_, oe)
        label.append(f"inside region {name!r} ({plural(len(occ), 'occurrence')})")
        kinds.append("region")
    if not len(hs):
        raise WindowError(f"the window ({', '.join(label)}) holds no time of the trace")
    return _finish(td, hs, he, ", ".join(label), "", {}, "+".join(kinds), builds=False, time=(ts, te))


def _steady(td: TraceData, whole_s: np.ndarray, whole_e: np.ndarray) -> Selection:
    rows, nums = _steps(td)
    bs, be = _builds(td)
    builds_ns = int((be - bs).sum())
    if len(rows) >= 2:
        hs, he = _intervals(td, rows[1:])
        label = _span_of(nums[1:])
        first = f"start-up, {_span_of(nums[:1])}"
        left = {"steps_left_out": 1}
    else:
        k = np.flatnonzero(td.cat_mask(KERNEL))
        if not len(k):
            return Selection(None, whole_s, whole_e, "the whole run", "no kernels", kind="whole")
        k0 = int(k[np.argmin(td.host_begin[k])])
        a = int(td.host_begin[k0])
        regions = np.flatnonzero(td.regions & (td.host_begin <= a) & (td.host_end > a))
        where = "the first kernel launch"
        if len(regions):  # the outermost region open at the first launch: its first iteration counts whole
            r = int(regions[np.argmin(td.host_begin[regions])])
            a, where = int(td.host_begin[r]), f"region {td.names[td.name[r]]!r} of the first kernel launch"
        hs, he = np.array([a], np.int64), whole_e
        label = f"from {(a - td.origin) / 1e9:.3f} s ({where}) to the end"
        first = "start-up"
        left = {}
    start = int(hs[0] - td.t0)
    left["start_ns"] = start
    left["builds_ns"] = builds_ns
    early = int(Coverage(bs, be).upto(np.array([hs[0]]))[0])  # build time in the start left out
    if early:
        first += f"; {fmt_ns(early)} of it builds"
    out = [f"the first {fmt_ns(start)} ({first})" if start > 0 else "",
           f"{fmt_ns(builds_ns - early)} of builds in it" if builds_ns > early else ""]
    out = [x for x in out if x]
    note = "steady state" + (f", {' and '.join(out)} left out" if out else "") + "; --whole for the whole run"
    return _finish(td, hs, he, label, note, left, "steady", builds=True)


def _finish(td: TraceData, hs: np.ndarray, he: np.ndarray, label: str, note: str, left: dict[str, Any],
            kind: str, builds: bool, time: tuple[np.ndarray, np.ndarray] | None = None) -> Selection:
    """Rows beginning in the intervals ``hs``/``he``; the time analysed (``time``, else the same
    intervals) stretched over the device time of their commands. With ``builds`` (the steady state)
    the builds are set apart: every build is kept (the build findings see them all), and their host
    time is not in the time analysed."""
    inside = holding(hs, he, td.host_begin)
    work = np.flatnonzero(inside & td.work)
    rows = np.flatnonzero(inside | td.builds) if builds else np.flatnonzero(inside)
    ts, te = time if time is not None else (hs, he)
    ds, de = td.dev_start[work].astype(np.int64), td.dev_end[work].astype(np.int64)
    s, e, _ = union(np.r_[ts, ds].astype(np.int64), np.r_[te, de].astype(np.int64))
    if builds:  # the builds' host time, where the device was not busy meanwhile
        s, e = subtract(s, e, *_builds(td))
        s, e, _ = union(np.r_[s, ds].astype(np.int64), np.r_[e, de].astype(np.int64))
    if not len(s):
        raise WindowError(f"the window ({label}) holds no time of the trace")
    return Selection(rows, s, e, label, note, left, kind)


def apply(td: TraceData, sel: Selection) -> TraceData:
    """The trace's columns for the rows in the window, analysed over its intervals."""
    if sel.rows is None:
        return td
    out = td.take(sel.rows)
    out.set_window(sel.starts, sel.ends, td.origin)
    return out


__all__ = ["ALL", "STEADY", "WHOLE", "Selection", "Window", "apply", "as_window", "parse_steps", "select"]
