"""What to capture in a long run, step by step: PyTorch profiler's schedule.

The first ``skip_first`` steps are skipped; then cycles of ``wait`` steps (not traced),
``warmup`` steps (traced, never written: first-launch JIT and cache fills stay out of the
numbers) and ``active`` steps (traced and written, one file per cycle). ``repeat=0``: cycles
go on until tracing stops; otherwise the run is traced no more after ``repeat`` cycles.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

SKIP, WAIT, WARMUP, ACTIVE, DONE = "skip", "wait", "warmup", "active", "done"
TRACED = frozenset({WARMUP, ACTIVE})


@dataclass(frozen=True)
class Schedule:
    """Which steps are traced and written. Build one with ``cltrace.schedule(...)``."""

    skip_first: int = 0
    wait: int = 1
    warmup: int = 1
    active: int = 3
    repeat: int = 0

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if type(v) is not int or v < 0:
                raise ValueError(f"schedule: {f.name} must be a whole number >= 0, not {v!r}")
        if self.active < 1:
            raise ValueError("schedule: active must be >= 1 (the steps written per cycle)")

    @property
    def cycle_steps(self) -> int:
        return self.wait + self.warmup + self.active

    def phase(self, step: int) -> tuple[str, int]:
        """(phase, cycle) of step ``step`` (from 0): phase is skip, wait, warmup, active or done;
        cycle counts from 1 (0 for skipped steps and after the last cycle)."""
        if step < self.skip_first:
            return SKIP, 0
        k = step - self.skip_first
        cycle, pos = divmod(k, self.cycle_steps)
        if self.repeat and cycle >= self.repeat:
            return DONE, 0
        if pos < self.wait:
            return WAIT, cycle + 1
        if pos < self.wait + self.warmup:
            return WARMUP, cycle + 1
        return ACTIVE, cycle + 1

    def ends_cycle(self, step: int) -> bool:
        """Whether ``step`` is the last active step of its cycle."""
        phase, cycle = self.phase(step)
        return phase == ACTIVE and self.phase(step + 1) != (ACTIVE, cycle)

    def __str__(self) -> str:
        return ",".join(f"{f.name}={getattr(self, f.name)}" for f in fields(self))


def schedule(skip_first: int = 0, wait: int = 1, warmup: int = 1, active: int = 3, repeat: int = 0) -> Schedule:
    """``cltrace.schedule(skip_first=0, wait=1, warmup=1, active=3, repeat=0)``: pass it as
    ``cltrace.trace(..., schedule=...)`` and mark steps with ``cltrace.step()`` or ``cltrace.steps()``."""
    return Schedule(skip_first, wait, warmup, active, repeat)


def parse_schedule(text: str) -> Schedule:
    """A schedule from ``skip_first=10,wait=1,warmup=1,active=3,repeat=2`` (omitted keys take
    their defaults); ValueError naming the bad part and the keys otherwise."""
    keys = [f.name for f in fields(Schedule)]
    given: dict[str, int] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        key, sep, value = (s.strip() for s in part.partition("="))
        if not sep or key not in keys:
            raise ValueError(f"schedule {text!r}: {part!r} is not KEY=N with KEY one of {', '.join(keys)}")
        if key in given:
            raise ValueError(f"schedule {text!r}: {key} is given twice")
        try:
            given[key] = int(value)
        except ValueError:
            raise ValueError(f"schedule {text!r}: {key}={value!r} is not a whole number") from None
    if not given:
        raise ValueError(f"schedule {text!r}: give KEY=N pairs, e.g. skip_first=10,wait=1,warmup=1,active=3,repeat=2")
    return Schedule(**given)
