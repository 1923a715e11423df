"""Resolution: raw records -> Spans, device stamps -> host timeline.

Records whose events have not completed stay in ``waiting`` and are retried
on the next batch; with ``block=True`` the resolver waits for them (at flush
or export, never per launch).
"""
from __future__ import annotations

import logging
from typing import Any

from .spans import REGION_CATS, STATUS_ERROR, STATUS_OK, Span
from .tracks import COMPILE_THREAD

log = logging.getLogger("cltrace")

_COMPLETE = 0
_OUT_OF_ORDER = 1  # CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE


def _profile(ev: Any) -> tuple[int, int, int, int]:
    p = ev.profile
    return p.queued, p.submit, p.start, p.end


class Resolver:
    def __init__(self, tracks: Any, clocks: Any) -> None:
        self.tracks = tracks
        self.clocks = clocks
        self.waiting: list[tuple] = []
        self._queues: dict[tuple[int, int, int], tuple[int, Any, Any]] = {}
        # (queue, thread) of an out-of-order queue -> end time of the last command on each lane
        self._lanes: dict[tuple[int, int, int], list[int]] = {}
        self._to_lane: list[tuple[Span, Any, int, Any]] = []
        # parent id -> {device track: [min dev_start, max dev_end] of resolved children}
        self._child_ext: dict[int, dict[int, list[int]]] = {}

    def queue_info(self, queue: Any, thread: int) -> tuple[int, Any, Any]:
        """(device track id, DeviceClock, lane key or None) for work a thread submitted to a queue.

        For an out-of-order queue the track is the one its regions go on; commands get lanes.
        """
        dev = queue.device
        # The device is part of the key: a freed queue's address may come back on another device.
        key = (queue.int_ptr, dev.int_ptr, thread)
        info = self._queues.get(key)
        if info is None:
            dkey = self.tracks.register_device(dev).key
            ooo = bool(queue.properties & _OUT_OF_ORDER)
            track = self.tracks.device_queue(queue, thread, dkey, "regions" if ooo else None)
            clock = self.clocks.for_queue(queue, dkey)
            info = self._queues[key] = (track, clock, key if ooo else None)
        return info

    def _assign_lanes(self) -> None:
        """Put a batch's out-of-order commands, in start order, on the first lane free at their start."""
        todo, self._to_lane = self._to_lane, []
        todo.sort(key=lambda t: t[0].dev_start)
        for span, queue, thread, key in todo:
            ends = self._lanes.setdefault(key, [])
            for i, last in enumerate(ends):
                if last <= span.dev_start:
                    ends[i] = span.dev_end
                    break
            else:
                ends.append(span.dev_end)
                i = len(ends) - 1
            span.device_track = self.tracks.device_queue(queue, thread, None, str(i + 1))

    def resolve(self, batch: list[tuple], block: bool, limit: int | None = None) -> list[Span]:
        """Spans for every record whose events completed; with ``block``, wait for them first.

        ``limit`` (back-pressure) waits only for the oldest ``limit`` records.
        """
        out = self._resolve(batch, block, limit)
        if self._to_lane:
            self._assign_lanes()
        return out

    def _resolve(self, batch: list[tuple], block: bool, limit: int | None = None) -> list[Span]:
        todo = self.waiting + batch if self.waiting else batch
        self.waiting = []
        if block:
            must = todo if limit is None else todo[:limit]
            _wait([ev for rec in must for ev in (rec[9], rec[10]) if ev is not None])
            if limit is not None:
                ready, rest = todo[:limit], todo[limit:]
                out = [self._one(rec) for rec in ready]
                return out + self._resolve(rest, block=False)
            return [self._one(rec) for rec in todo]
        out: list[Span] = []
        for rec in todo:
            ev = rec[10] if rec[10] is not None else rec[9]
            if ev is not None:
                try:
                    st = ev.command_execution_status
                except Exception:
                    st = _COMPLETE
                if st > _COMPLETE:
                    self.waiting.append(rec)
                    continue
            out.append(self._one(rec))
        return out

    def _one(self, rec: tuple) -> Span:
        (cat, name, sid, parent, path, thread, hb, he, queue, ev0, ev1, attrs, status, error) = rec
        host_track = (self.tracks.compile_track() if thread == COMPILE_THREAD
                      else self.tracks.host_thread(thread))
        if cat not in REGION_CATS:
            path = path + (name,)
        exts = self._child_ext.pop(sid, None)
        span = Span(sid, parent, name, cat, host_track, hb, he, attrs=attrs,
                    status=status or STATUS_OK, error=error, path=path)
        if queue is None or ev0 is None:
            return span
        try:
            track, clock, lanes = self.queue_info(queue, thread)
            if ev1 is None:
                q, s, st, en = _profile(ev0)
            else:
                q, s, _, st = _profile(ev0)
                en = _profile(ev1)[3]
        except Exception as exc:
            # A failed command or profiling info that does not exist: keep the host span, say why.
            span.attrs = dict(attrs or {})
            span.attrs["cltrace.device_time"] = f"unavailable: {exc}"
            if _is_event_error(ev0) or (ev1 is not None and _is_event_error(ev1)):
                span.status = STATUS_ERROR
                span.error = span.error or f"command failed: {exc}"
            return span
        off = clock.offset_at(st)
        span.device_track = track
        span.dev_queued = q - off
        span.dev_submit = s - off
        span.raw_start = st
        span.raw_end = en
        if cat in REGION_CATS:
            ext = exts.get(track) if exts else None
            if ext is not None:
                # Markers bracket the region's commands on an in-order queue; widen to
                # children when the driver stamps markers loosely so nesting holds.
                if ext[0] + off < st:
                    span.raw_start = ext[0] + off
                if ext[1] + off > en:
                    span.raw_end = ext[1] + off
        span.dev_start = span.raw_start - off
        span.dev_end = span.raw_end - off
        if lanes is not None and cat not in REGION_CATS:
            self._to_lane.append((span, queue, thread, lanes))  # on a lane: does not widen its region
        elif parent:
            per_track = self._child_ext.setdefault(parent, {})
            cur = per_track.get(track)
            if cur is None:
                per_track[track] = [span.dev_start, span.dev_end]
            else:
                if span.dev_start < cur[0]:
                    cur[0] = span.dev_start
                if span.dev_end > cur[1]:
                    cur[1] = span.dev_end
        return span


def _wait(events: list[Any]) -> None:
    """Wait for a batch of events; a failed command must not stop the others resolving."""
    if not events:
        return
    import pyopencl as cl

    try:
        cl.wait_for_events(events)
    except Exception:
        for ev in events:
            try:
                ev.wait()
            except Exception:
                pass


def _is_event_error(ev: Any) -> bool:
    try:
        return ev.command_execution_status < 0
    except Exception:
        return True
