"""What a rule reports: the finding, its evidence and what to do about it."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..launches import Launches
from ..model import TraceData
from ..utilisation import Use

WORST = 5  # instances listed per finding


@dataclass
class Context:
    """What the rules read: the columns and the analyses already made."""

    td: TraceData
    devices: list[Use]
    queues: list[Use]
    launches: Launches
    self_ns: np.ndarray


@dataclass
class Finding:
    """A rule that fired. ``cost_ns`` (the time at stake) ranks findings; ``instances`` are the
    worst occurrences, each with ``at_s`` (seconds since the trace's first span) to find in Perfetto."""

    rule: str
    title: str
    cost_ns: int
    summary: str
    suggestion: str
    threshold: str
    evidence: dict[str, Any] = field(default_factory=dict)
    instances: list[dict[str, Any]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"rule": self.rule, "title": self.title, "cost_ns": self.cost_ns, "summary": self.summary,
                "suggestion": self.suggestion, "threshold": self.threshold, "evidence": self.evidence,
                "instances": self.instances}


def instance(td: TraceData, i: int, dur_ns: int | None = None, **extra: Any) -> dict[str, Any]:
    """One span as evidence: name, region path, where it starts and how long it took."""
    hb = int(td.host_begin[i])
    return {"name": td.names[td.name[i]], "path": "/".join(td.path_of(i)), "span": int(td.id[i]),
            "at_s": round(td.at(hb), 6), "ts_ns": hb,
            "dur_ns": int(td.host_end[i] - hb if dur_ns is None else dur_ns), **extra}


def worst(values: np.ndarray, n: int = WORST) -> np.ndarray:
    """Positions of the ``n`` largest values, largest first."""
    if len(values) <= n:
        return np.argsort(-values, kind="stable")
    part = np.argpartition(-values, n)[:n]
    return part[np.argsort(-values[part], kind="stable")]
