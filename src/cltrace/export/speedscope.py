"""speedscope's own file format (``.speedscope.json``): one evented profile per track.

speedscope reads Chrome JSON too, but names each frame by its name *and* the JSON of its
``args``, where cltrace keeps per-span ids and stamps: every slice becomes a frame of its own
and the left-heavy and sandwich views group nothing. Here a frame is a span's name (and
category), so every ``step > forward > gemm`` adds up. Host threads and the compile track
are timed by the host clock, device queues by their device stamps (mapped to the host
timeline), all in nanoseconds from the start of the run.

The format is one JSON object, so spans are kept (three numbers each) and the file is written
at ``close``: a run killed before it leaves no file (the .json/.pftrace outputs survive that).
Spans that overlap without nesting (concurrent commands) go to a further profile of the same
track (``… (2)``), as an evented profile must nest.
"""
from __future__ import annotations

import json
import os
from typing import Any

from .._version import version
from ..timeline.batch import SpanBatch
from ..timeline.spans import STEP
from ..timeline.tracks import DEVICE_QUEUE
from .base import TraceContext, create_output

SCHEMA = "https://www.speedscope.app/file-format-schema.json"


class SpeedscopeSink:
    """Collects spans by track and writes a speedscope file at ``close``."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self._ctx: TraceContext | None = None
        self._frames: dict[tuple[str, str], int] = {}
        self._tracks: dict[int, list[tuple[int, int, int]]] = {}  # track -> (begin, end, frame)

    def start(self, ctx: TraceContext) -> None:
        if self._ctx is None:
            self._ctx = ctx

    def write(self, batch: SpanBatch) -> None:
        frames = self._frames
        tracks = self._tracks
        for s in batch:
            key = (STEP if s.cat == STEP else s.name, s.cat)  # every "step N" one frame: steps add up
            f = frames.get(key)
            if f is None:
                f = frames[key] = len(frames)
            tracks.setdefault(s.thread, []).append((s.host_begin, max(s.host_end, s.host_begin), f))
            if s.device_track is not None and s.dev_start is not None and s.dev_end is not None:
                tracks.setdefault(s.device_track, []).append((s.dev_start, max(s.dev_end, s.dev_start), f))

    def flush(self, meta: dict[str, Any]) -> None:
        pass

    def close(self, meta: dict[str, Any]) -> None:
        if self._ctx is None:
            return
        doc = self.document()
        with create_output(self.path, "w", encoding="utf-8") as fh:
            json.dump(doc, fh, ensure_ascii=False, separators=(",", ":"))
        self._tracks.clear()

    def document(self) -> dict[str, Any]:
        """The speedscope file as a dict: host tracks first, then device queues, in track order."""
        registry = self._ctx.tracks
        base = self._ctx.start_ns
        profiles = []
        order = sorted(self._tracks, key=lambda t: (registry.get(t).kind == DEVICE_QUEUE, t))
        for tid in order:
            track = registry.get(tid)
            name = track.name if track.kind != DEVICE_QUEUE else f"{track.process} · {track.name}"
            lanes = _lanes(self._tracks[tid])
            for i, lane in enumerate(lanes):
                profiles.append(_profile(name if i == 0 else f"{name} ({i + 1})", lane, base))
        frames = [{"name": name} for name, _ in self._frames]
        return {"$schema": SCHEMA, "name": os.path.basename(self.path), "exporter": f"cltrace {version()}",
                "activeProfileIndex": 0, "shared": {"frames": frames}, "profiles": profiles}


def _lanes(spans: list[tuple[int, int, int]]) -> list[list[tuple[int, int, int]]]:
    """Spans split into lists in which every two spans nest or are disjoint (first fit)."""
    spans.sort(key=lambda s: (s[0], -s[1]))
    lanes: list[list[tuple[int, int, int]]] = []
    stacks: list[list[int]] = []  # per lane: the ends of its open spans
    for s in spans:
        begin, end, _ = s
        for lane, stack in zip(lanes, stacks):
            while stack and stack[-1] <= begin:
                stack.pop()
            if not stack or end <= stack[-1]:
                stack.append(end)
                lane.append(s)
                break
        else:
            lanes.append([s])
            stacks.append([end])
    return lanes


def _profile(name: str, spans: list[tuple[int, int, int]], base: int) -> dict[str, Any]:
    """An evented profile of nested spans (sorted by begin, outer first)."""
    events: list[dict[str, Any]] = []
    stack: list[tuple[int, int]] = []  # (end, frame) of the open spans
    for begin, end, frame in spans:
        while stack and stack[-1][0] <= begin:
            e, f = stack.pop()
            events.append({"type": "C", "frame": f, "at": e - base})
        events.append({"type": "O", "frame": frame, "at": begin - base})
        stack.append((end, frame))
    while stack:
        e, f = stack.pop()
        events.append({"type": "C", "frame": f, "at": e - base})
    return {"type": "evented", "name": name, "unit": "nanoseconds",
            "startValue": events[0]["at"], "endValue": events[-1]["at"], "events": events}
