"""Resolution: a batch of raw records -> one ``SpanBatch`` on the host timeline.

Column by column: the records are transposed once, every event's four profiling stamps are read
in one call (``stamps``: native where built), names, categories and paths become interned ids,
and each device's stamps are mapped through its clock in one vectorised pass. Python loops run
over distinct queues, threads, paths and regions, not over launches. Records whose events have
not completed stay in ``waiting`` for the next batch; with ``block=True`` the resolver first
waits for them (at flush or export, never per launch).
"""
from __future__ import annotations

import logging
from itertools import compress
from operator import itemgetter
from typing import Any

import numpy as np

from . import stamps
from .batch import NAMES, SpanBatch, Tables
from .sites import SiteTable
from .tracks import COMPILE_THREAD

log = logging.getLogger("cltrace")

_OUT_OF_ORDER = 1  # CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE
_QUEUED, _SUBMIT, _START, _END = range(4)


_ATTRS = itemgetter(11)  # a raw record's attrs (record/recorder.py R_ATTRS)


class Resolver:
    def __init__(self, tracks: Any, clocks: Any, tables: Tables | None = None) -> None:
        self.tracks = tracks
        self.clocks = clocks
        self.tables = tables or Tables()
        self.sites = SiteTable(self.tables.sites)  # raw call-site captures -> site ids (lines looked up here)
        self.waiting: list[tuple] = []
        self._queues: dict[tuple[int, int, int, int], tuple[int, Any, Any]] = {}
        # (queue, thread) of an out-of-order queue -> end time of the last command on each lane
        self._lanes: dict[tuple[int, int, int], list[int]] = {}
        # parent id -> {device track: [min dev_start, max dev_end] of resolved children}
        self._child_ext: dict[int, dict[int, list[int]]] = {}

    def queue_info(self, queue: Any, thread: int) -> tuple[int, Any, Any]:
        """(device track id, DeviceClock, lane key or None) for work a thread submitted to a queue.

        For an out-of-order queue the track is the one its regions go on; commands get lanes.
        """
        dev = queue.device
        props = queue.properties
        # The device and the properties are part of the key: a freed queue's address may come back
        # on another device, or as an out-of-order queue (whose commands need lanes).
        key = (queue.int_ptr, dev.int_ptr, thread, props)
        info = self._queues.get(key)
        if info is None:
            uid = self.tracks.register_device(dev).uid
            ooo = bool(props & _OUT_OF_ORDER)
            track = self.tracks.device_queue(queue, thread, uid, "regions" if ooo else None)
            clock = self.clocks.for_queue(queue, uid)
            info = self._queues[key] = (track, clock, key if ooo else None)
        return info

    def resolve(self, batch: list[tuple], block: bool, limit: int | None = None) -> SpanBatch:
        """Spans for every record whose events completed; with ``block``, wait for them first.

        ``limit`` (back-pressure) waits only for the oldest ``limit`` records.
        """
        todo = self.waiting + batch if self.waiting else batch
        self.waiting = []
        if not todo:
            return SpanBatch.empty(self.tables)
        t = self.tables
        ints, hs = stamps.columns(todo, t.names.ids, t.cats.ids)
        n = len(todo)
        flags = ints[stamps.C_FLAGS]
        dev = (flags & stamps.F_DEV) != 0
        two_ev = (flags & stamps.F_TWO) != 0
        if block:
            upto = n if limit is None else min(limit, n)
            must = np.flatnonzero(dev[:upto])
            h1 = hs[1][must]
            stamps.wait(np.concatenate([hs[0][must], h1[h1 != 0]]))
        status = np.zeros(n, np.int32)
        raw = np.zeros((n, 4), np.int64)
        dv = np.flatnonzero(dev)
        if len(dv):
            st0, s0 = stamps.read(hs[0][dv])
            status[dv] = st0
            raw[dv] = s0
            has1 = two_ev[dv]
            if has1.any():
                # A region's two markers: START is the first marker's END, END the second's.
                rows = dv[has1]
                st1, s1 = stamps.read(hs[1][rows])
                raw[rows, _START] = raw[rows, _END]
                raw[rows, _END] = s1[:, _END]
                st1 = st1.astype(np.int32)
                status[rows] = np.where(st0[has1] < 0, st0[has1],
                                        np.where(st1 < 0, st1, np.maximum(st0[has1], st1)))
        pending = status > 0
        if pending.any():
            self.waiting = list(compress(todo, pending))
            keep = ~pending
            todo = list(compress(todo, keep))
            if not todo:
                return SpanBatch.empty(self.tables)
            ints, dev, status, raw = ints[:, keep], dev[keep], status[keep], raw[keep]
        return self._columns(todo, ints, dev, status, raw)

    def _sites(self, todo: list[tuple], obj: np.ndarray) -> np.ndarray:
        """Site ids of the rows: captures are shared objects, so each distinct one is looked up once."""
        uniq, first, inverse = np.unique(obj, return_index=True, return_inverse=True)
        ids = np.array([self.sites.site_id(todo[i][14]) for i in first.tolist()], np.int32)
        return ids[inverse]

    def _interned(self, ids: np.ndarray, todo: list[tuple], field: int, table: Any) -> np.ndarray:
        """``ids`` with the values ``stamps.columns`` did not find (-1) interned now."""
        for i in np.flatnonzero(ids < 0).tolist():
            ids[i] = table.id(todo[i][field])
        return ids

    def _columns(self, todo: list[tuple], ints: np.ndarray, dev: np.ndarray, status: np.ndarray,
                 raw: np.ndarray) -> SpanBatch:
        n = len(todo)
        t = self.tables
        C = stamps
        flags = ints[C.C_FLAGS]
        out: dict[str, np.ndarray] = {
            "id": ints[C.C_ID], "parent": ints[C.C_PARENT], "host_begin": ints[C.C_HB], "host_end": ints[C.C_HE],
            "name": self._interned(ints[C.C_NAME], todo, 1, t.names).astype(np.int32),
            "cat": self._interned(ints[C.C_CAT], todo, 0, t.cats).astype(np.int16),
            "site": self._sites(todo, ints[C.C_SITE]),
        }
        thr = ints[C.C_THREAD]
        big = np.flatnonzero(flags & C.F_BIG_THREAD).tolist()
        thr[big] = -1  # read from their records below
        tracks = self.tracks
        track_of = lambda k: -1 if k == -1 else tracks.compile_track() if k == COMPILE_THREAD else tracks.host_thread(k)
        if n and thr.min() == thr.max():
            out["thread"] = np.full(n, track_of(int(thr[0])), np.int64)
        else:
            uthr, ithr = np.unique(thr, return_inverse=True)
            out["thread"] = np.array([track_of(k) for k in uthr.tolist()], np.int64)[ithr]
        for i in big:
            out["thread"][i] = track_of(todo[i][5])
        region = np.isin(out["cat"], np.fromiter(t.region_cats, np.int16))
        out["path"] = self._paths(todo, ints[C.C_PATH], out["name"], region)
        attrs = list(map(_ATTRS, todo)) if (flags & C.F_ATTRS).any() else [None] * n
        errors: dict[int, str] = {}
        err = (flags & C.F_ERROR) != 0
        for i in np.flatnonzero(err).tolist():
            errors[i] = todo[i][13]
        failed = dev & (status < 0)
        for i in np.flatnonzero(failed).tolist():
            self._device_failed(i, todo[i][9], todo[i][10], int(status[i]), attrs, errors, err)
        ok = dev & (status == 0)
        rows = np.flatnonzero(ok)
        track = np.zeros(n, np.int64)
        off = np.zeros(n, np.int64)
        off_end = np.zeros(n, np.int64)  # regions' END may be drawn with a later offset than their START
        lane_rows: list[int] = []
        lane_keys: dict[int, tuple[Any, int, Any]] = {}
        if len(rows):
            # Group rows by (queue object, submitting thread) with array operations; look each group up once.
            qid = ints[C.C_QUEUE][rows]
            uq, iq = np.unique(qid, return_inverse=True)
            key = iq.astype(np.int64) * (1 << 32) + out["thread"][rows]
            uk, kfirst, ik = np.unique(key, return_index=True, return_inverse=True)
            firsts = rows[kfirst].tolist()
            infos = [self.queue_info(todo[i][8], todo[i][5]) for i in firsts]
            track[rows] = np.array([inf[0] for inf in infos], np.int64)[ik]
            clocks: dict[int, tuple[Any, list[int]]] = {}
            for g, inf in enumerate(infos):
                clocks.setdefault(id(inf[1]), (inf[1], []))[1].append(g)
            for clock, groups in clocks.values():
                mine = rows[np.isin(ik, groups)] if len(clocks) > 1 else rows
                self._place(clock, mine, raw, region, off, off_end)
            for g, inf in enumerate(infos):
                if inf[2] is not None:  # an out-of-order queue: its commands go on lanes
                    for j in np.flatnonzero(ik == g).tolist():
                        i = int(rows[j])
                        if not region[i]:
                            lane_rows.append(i)
                            lane_keys[i] = (todo[i][8], todo[i][5], inf[2])
        raw_start = raw[:, _START].copy()
        raw_end = raw[:, _END].copy()
        self._nest(out, region, ok, track, off, off_end, raw_start, raw_end, lane_rows)
        out["track"] = track
        z = np.where(ok, off, 0)
        out["raw_start"] = np.where(ok, raw_start, 0)
        out["raw_end"] = np.where(ok, raw_end, 0)
        out["dev_queued"] = np.where(ok, raw[:, _QUEUED] - z, 0)
        out["dev_submit"] = np.where(ok, raw[:, _SUBMIT] - z, 0)
        out["dev_start"] = out["raw_start"] - z
        out["dev_end"] = out["raw_end"] - np.where(ok, off_end, 0)
        if lane_rows:
            self._assign_lanes(lane_rows, lane_keys, out)
        out["status"] = err.astype(np.int8)
        return SpanBatch(t, out, attrs, errors)

    @staticmethod
    def _place(clock: Any, rows: np.ndarray, raw: np.ndarray, region: np.ndarray, off: np.ndarray,
               off_end: np.ndarray) -> None:
        """Offsets of one device's rows: commands get one committed offset each (``placement``);
        a region's edges take the offset in force where they fall."""
        starts, ends = raw[rows, _START], raw[rows, _END]
        reg = region[rows]
        cmd = ~reg
        pl = clock.placement
        if cmd.any():
            o = pl.place(starts[cmd], ends[cmd], clock.offsets(starts[cmd]))
            off[rows[cmd]] = o
            off_end[rows[cmd]] = o
        if reg.any():
            try:
                off[rows[reg]] = pl.lookup(starts[reg])
                off_end[rows[reg]] = pl.lookup(ends[reg])
            except LookupError:  # regions before any command on this device: they start the placement
                o = pl.place(starts[reg], ends[reg], clock.offsets(starts[reg]))
                off[rows[reg]] = o
                off_end[rows[reg]] = o

    def _paths(self, todo: list[tuple], path_obj: np.ndarray, name_ids: np.ndarray, region: np.ndarray) -> np.ndarray:
        """Interned full path per row: a region's recorded path ends in its name; a launch's gets it added.

        Rows share path objects (a region's path tuple is every child's), so rows are grouped by
        (path object, name, category) with array operations and each distinct group is interned once.
        """
        uo, io = np.unique(path_obj, return_inverse=True)
        nn = len(self.tables.names.values) + 1
        key = (io.astype(np.int64) * nn + name_ids) * 2 + region
        uk, kfirst, ik = np.unique(key, return_index=True, return_inverse=True)
        names = self.tables.names.values
        intern = self.tables.paths.id
        ids = [intern(todo[r][4] if reg else todo[r][4] + (names[nm],))
               for r, reg, nm in zip(kfirst.tolist(), region[kfirst].tolist(), name_ids[kfirst].tolist())]
        return np.array(ids, np.int32)[ik]

    def _nest(self, out: dict[str, np.ndarray], region: np.ndarray, ok: np.ndarray, track: np.ndarray,
              off: np.ndarray, off_end: np.ndarray, raw_start: np.ndarray, raw_end: np.ndarray,
              lane_rows: list[int]) -> None:
        """Widen regions' device spans to their children's (markers can be stamped loosely), so nesting holds.

        Children's extents are gathered per (parent, track) in one sorted pass; regions are then taken in
        record order (an inner region is recorded before the region around it) and pass theirs upwards.
        """
        ext = self._child_ext
        parent = out["parent"]
        leaf = ok & ~region & (parent != 0)
        if lane_rows:
            leaf[lane_rows] = False  # on a lane: does not widen its region
        rows = np.flatnonzero(leaf)
        if len(rows):
            p, tr = parent[rows], track[rows]
            ds, de = raw_start[rows] - off[rows], raw_end[rows] - off_end[rows]
            order = np.lexsort((tr, p))
            p, tr, ds, de = p[order], tr[order], ds[order], de[order]
            first = np.flatnonzero(np.r_[True, (p[1:] != p[:-1]) | (tr[1:] != tr[:-1])])
            lo = np.minimum.reduceat(ds, first)
            hi = np.maximum.reduceat(de, first)
            for pp, tt, a, b in zip(p[first].tolist(), tr[first].tolist(), lo.tolist(), hi.tolist()):
                cur = ext.setdefault(pp, {}).get(tt)
                if cur is None:
                    ext[pp][tt] = [a, b]
                else:
                    if a < cur[0]:
                        cur[0] = a
                    if b > cur[1]:
                        cur[1] = b
        regs = np.flatnonzero(region)
        if not len(regs):
            return
        rs, re_ = raw_start[regs].tolist(), raw_end[regs].tolist()
        rows = zip(out["id"][regs].tolist(), ok[regs].tolist(), track[regs].tolist(), off[regs].tolist(),
                   off_end[regs].tolist(), parent[regs].tolist())
        pop = ext.pop
        for j, (sid, good, t, o, oe, pp) in enumerate(rows):
            mine = pop(sid, None)
            if not good:
                continue
            e = mine.get(t) if mine else None
            if e is not None:
                if e[0] + o < rs[j]:
                    rs[j] = e[0] + o
                if e[1] + oe > re_[j]:
                    re_[j] = e[1] + oe
            if pp:
                a, b = rs[j] - o, re_[j] - oe
                cur = ext.setdefault(pp, {}).get(t)
                if cur is None:
                    ext[pp][t] = [a, b]
                else:
                    if a < cur[0]:
                        cur[0] = a
                    if b > cur[1]:
                        cur[1] = b
        raw_start[regs] = rs
        raw_end[regs] = re_

    def _assign_lanes(self, rows: list[int], keys: dict[int, tuple[Any, int, Any]], out: dict[str, np.ndarray]) -> None:
        """Put out-of-order commands, in start order, on the first lane free at their start."""
        ds, de, track = out["dev_start"], out["dev_end"], out["track"]
        for i in sorted(rows, key=lambda r: int(ds[r])):
            queue, thread, key = keys[i]
            ends = self._lanes.setdefault(key, [])
            s, e = int(ds[i]), int(de[i])
            for j, last in enumerate(ends):
                if last <= s:
                    ends[j] = e
                    break
            else:
                ends.append(e)
                j = len(ends) - 1
            track[i] = self.tracks.device_queue(queue, thread, None, str(j + 1))

    @staticmethod
    def _device_failed(i: int, e0: Any, e1: Any, code: int, attrs: list[Any], errors: dict[int, str],
                       err: np.ndarray) -> None:
        """A failed command, or profiling info that does not exist: keep the host span and say why."""
        a = dict(attrs[i] or {})
        a["cltrace.device_time"] = f"unavailable: {stamps.describe(code)}"
        attrs[i] = a
        if _is_event_error(e0) or (e1 is not None and _is_event_error(e1)):
            err[i] = True
            errors.setdefault(i, f"command failed: {stamps.describe(code)}")


def _is_event_error(ev: Any) -> bool:
    try:
        return ev.command_execution_status < 0
    except Exception:
        return True


__all__ = ["Resolver", "NAMES"]
