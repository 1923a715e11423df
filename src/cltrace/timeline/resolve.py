"""Resolution: a batch of raw records -> one ``SpanBatch`` on the host timeline.

Column by column: the records are transposed once, every event's four profiling stamps are read
in one call (``stamps``: native where built), names, categories and paths become interned ids,
and each device's stamps are mapped through its clock in one vectorised pass. Grouping, nesting and
out-of-order lanes are whole-column passes (``passes``: C without the GIL where built); Python loops
run over distinct queues, threads, sites and paths only, never over spans. Records whose events have
not completed stay in ``waiting`` for the next batch; with ``block=True`` the resolver first
waits for them (at flush or export, never per launch).

After the first pass (``stamps.columns_read``) every row still needs its interned ids, thread track, call
site, launch path, queue track, its device's clock map and placement, its region's nesting and its device
columns. Where the C extension ``_resolve`` is built that is two calls, each one pass over the rows without
the GIL (``Resolver._native_columns``): ``scan`` groups the rows (threads, sites, (queue, thread), (path,
name)), Python looks up each distinct group once, and ``finish`` places every device's commands (the map and
placement of ``clock.py``/``placement.py``, each placement lent through ``Placement.native``), nests the
regions and writes the final columns. The pure-Python resolver (``Resolver._columns``) is the reference:
tests/test_resolve_twins.py holds them equal on real records. Rare rows stay in Python, paid for only where
they occur: values not interned yet, thread keys beyond int64, failed commands, out-of-order lanes, records'
errors.

Raw records are read by the names of ``raw.py`` (``R_*``), bound to locals where a loop indexes them.
"""
from __future__ import annotations

import contextlib
import logging
from itertools import compress
from operator import itemgetter
from typing import Any

import numpy as np

from . import passes, stamps
from .batch import NAMES, SpanBatch, Tables
from .raw import R_ATTRS, R_CAT, R_ERROR, R_EV0, R_EV1, R_NAME, R_PATH, R_QUEUE, R_SITE, R_THREAD
from .sites import SiteTable
from .tracks import COMPILE_THREAD

log = logging.getLogger("cltrace")

_OUT_OF_ORDER = 1  # CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE
_QUEUED, _SUBMIT, _START, _END = range(4)
_QUEUE_STATS = 4  # per queue group: commands, their latest START, regions, theirs (_resolve.c Q_*)
_PART = 8192  # records per ``field`` call

_ATTRS = itemgetter(R_ATTRS)


class Resolver:
    """Raw records -> ``SpanBatch``es, batch after batch (state kept between them: records waiting for
    their commands, children waiting for their region, out-of-order lanes).

    ``python=True`` runs the pure-Python passes even where the C extensions are built (tests compare the two).
    """

    def __init__(self, tracks: Any, clocks: Any, tables: Tables | None = None, python: bool = False) -> None:
        self.tracks = tracks
        self.clocks = clocks
        self.tables = tables or Tables()
        self.sites = SiteTable(self.tables.sites)  # raw call-site captures -> site ids (lines looked up here)
        self.waiting: list[tuple] = []
        self._stamps = stamps.PYTHON if python else stamps.NATIVE or stamps.PYTHON
        self._passes = passes.PYTHON if python else passes.ACTIVE
        self._queues: dict[tuple[int, int, int, int], tuple[int, Any, Any]] = {}
        # (queue, thread) of an out-of-order queue -> end time of the last command on each lane
        self._lanes: dict[tuple[int, int, int], np.ndarray] = {}
        # device extents of resolved children whose region is not resolved yet
        self._extents = self._passes.Extents()
        self._launch_paths: dict[tuple[int, int], int] = {}  # (region path id, name id) -> a launch's path id
        # category id -> whether it is a region's (the region categories are interned first: small ids)
        self._region_lut = np.zeros(max(self.tables.region_cats) + 2, bool)
        self._region_lut[sorted(self.tables.region_cats)] = True
        self._failed = np.zeros(0, np.int8)  # the batch in hand: which failed commands are known failures
        self._native = self._passes.tail  # the C module ``_native_columns`` calls; None: ``_columns``
        self._thread_tracks: dict[int, int] = {}  # thread key (or stand-in) -> host thread track
        self._stand_ins: dict[int, int] = {}  # thread key beyond int64 -> its stand-in key (``_settle``)

    @property
    def path(self) -> str:
        """Which resolves the rows after the first pass: "native" (``_native_columns``) or "python" (``_columns``)."""
        return "python" if self._native is None else "native"

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
        st = self._stamps
        args = (todo, t.names.ids, t.cats.ids, t.paths.ids)
        if block:  # the handles first, to wait on; the stamps in a second pass
            ints, hs = st.columns(*args)
            flags = ints[stamps.C_FLAGS]
            upto = len(todo) if limit is None else min(limit, len(todo))
            must = np.flatnonzero((flags[:upto] & stamps.F_DEV) != 0)
            tick = (flags[must] & stamps.F_TICKETS) != 0
            for mine, wait in ((must[~tick], st.wait), (must[tick], stamps.wait_tickets)):
                if len(mine):
                    h1 = hs[1][mine]
                    wait(np.concatenate([hs[0][mine], h1[h1 != 0]]))
        ints, hs, status, raw = st.columns_read(*args)
        n = len(todo)
        failed = np.empty(n, np.int8)  # 1: the command failed, 0: it did not, -1: ask its event (_device_failed)
        pending, tickets, devices = st.settle(ints, hs, status, raw, failed)
        if pending:
            pending_rows = status > 0
            self._hold_regions(ints, pending_rows)
            self.waiting = list(compress(todo, pending_rows))
            keep = ~pending_rows
            todo = list(compress(todo, keep))
            if tickets:
                self._done(hs[:, keep & ((ints[stamps.C_FLAGS] & stamps.F_TICKETS) != 0)])
            if not todo:
                return SpanBatch.empty(self.tables)
            ints, status, raw, failed = ints[:, keep], status[keep], raw[keep], failed[keep]
        elif tickets:  # the rows' handles are tickets where they are not 0, unless events are mixed in
            self._done(hs if tickets == devices else hs[:, (ints[stamps.C_FLAGS] & stamps.F_TICKETS) != 0])
        self._failed = failed
        if self._native is not None:
            return self._native_columns(todo, ints, status, raw)
        return self._columns(todo, ints, (ints[stamps.C_FLAGS] & stamps.F_DEV) != 0, status, raw)

    def _hold_regions(self, ints: np.ndarray, pending_rows: np.ndarray) -> None:
        """Keep waiting (in place) every region behind a waiting record of its own thread. A region is widened
        to its children's device extents, and its children are the thread's records before it: resolved first,
        it would miss a child whose command completed later (on another queue, or read a moment before the
        region's own last command was), and an outer region on that child's track would begin after it."""
        waiting = np.flatnonzero(pending_rows)
        threads = ints[stamps.C_THREAD]
        lut = self._region_lut  # its last entry (False) stands for every category beyond the regions'
        regions = np.flatnonzero(lut[np.minimum(ints[stamps.C_CAT], len(lut) - 1)] & ~pending_rows)
        if not len(regions):
            return
        keys, first = np.unique(threads[waiting], return_index=True)  # each thread's first waiting record
        first = waiting[first]
        mine = threads[regions]
        at = np.minimum(np.searchsorted(keys, mine), len(keys) - 1)
        pending_rows[regions[(keys[at] == mine) & (first[at] < regions)]] = True

    @staticmethod
    def _done(hs: np.ndarray) -> None:
        """Tickets of resolved records (both rows of ``hs``; 0 where a record has no second event)."""
        stamps.done(hs.reshape(-1))

    def _sites(self, todo: list[tuple], obj: np.ndarray) -> np.ndarray:
        """Site ids of the rows: captures are shared objects, so each distinct one is looked up once."""
        first, inverse = self._passes.group(obj)
        return self._site_ids(todo, first.tolist())[inverse]

    def _site_ids(self, todo: list[tuple], rows: list[int]) -> np.ndarray:
        """The site ids of these rows' call-site captures."""
        site = R_SITE
        return self.sites.ids([todo[i][site] for i in rows], self._passes.group)

    def _interned(self, ids: np.ndarray, todo: list[tuple], field: int, table: Any) -> np.ndarray:
        """``ids`` with the values ``stamps.columns`` did not find (-1) interned now (each distinct object once);
        ``field``: the records' field (``R_*``) the values are in."""
        miss = np.flatnonzero(ids < 0)
        if len(miss):
            values = [todo[i][field] for i in miss.tolist()]
            first, inverse = self._passes.group(np.fromiter(map(id, values), np.int64, len(values)))
            ids[miss] = np.array([table.id(values[i]) for i in first.tolist()], np.int64)[inverse]
        return ids

    def _thread_track(self, key: int) -> int:
        """The host thread track of a thread key or stand-in (``_threads`` per distinct key, remembered)."""
        track = self._thread_tracks.get(key)
        if track is None:
            k = self._stand_ins.get(key, key) if key < -1 else key
            tracks = self.tracks
            track = -1 if k == -1 else tracks.compile_track() if k == COMPILE_THREAD else tracks.host_thread(k)
            self._thread_tracks[key] = track
        return track

    def _stand_in(self, key: int) -> int:
        """A negative int64 key below -1 standing for a thread key beyond int64 (one per key, kept)."""
        s = self._stand_ins.get(key)
        if s is None:
            s = self._stand_ins[key] = -2 - len(self._stand_ins) // 2
            self._stand_ins[s] = key
        return s

    def _launch_path(self, pid: int, name: int) -> int:
        """The path id of a launch named ``name`` under the recorded path ``pid`` (looked up once, kept)."""
        i = self._launch_paths.get((pid, name))
        if i is None:
            paths = self.tables.paths
            i = self._launch_paths[(pid, name)] = paths.id(paths.values[pid] + (self.tables.names.values[name],))
        return i

    def _threads(self, todo: list[tuple], thr: np.ndarray, flags: np.ndarray) -> np.ndarray:
        """Host thread track of each row (the compile track for compile work, -1 for none)."""
        n = len(thr)
        big = np.flatnonzero(flags & stamps.F_BIG_THREAD).tolist()
        thr[big] = -1  # read from their records below
        tracks = self.tracks
        track_of = lambda k: -1 if k == -1 else tracks.compile_track() if k == COMPILE_THREAD else tracks.host_thread(k)
        if n and thr.min() == thr.max():
            out = np.full(n, track_of(int(thr[0])), np.int64)
        else:
            first, inverse = self._passes.group(thr)
            out = np.array([track_of(k) for k in thr[first].tolist()], np.int64)[inverse]
        for i in big:
            out[i] = track_of(todo[i][R_THREAD])
        return out

    def _columns(self, todo: list[tuple], ints: np.ndarray, dev: np.ndarray, status: np.ndarray,
                 raw: np.ndarray) -> SpanBatch:
        n = len(todo)
        t = self.tables
        C = stamps
        flags = ints[C.C_FLAGS]
        out: dict[str, np.ndarray] = {
            "id": ints[C.C_ID], "parent": ints[C.C_PARENT], "host_begin": ints[C.C_HB], "host_end": ints[C.C_HE],
            "name": self._interned(ints[C.C_NAME], todo, R_NAME, t.names).astype(np.int32),
            "cat": self._interned(ints[C.C_CAT], todo, R_CAT, t.cats).astype(np.int16),
            "site": self._sites(todo, ints[C.C_SITE]),
            "thread": self._threads(todo, ints[C.C_THREAD], flags),
        }
        region = self._region_lut[np.minimum(out["cat"], len(self._region_lut) - 1)]
        out["path"] = self._paths(todo, ints[C.C_PATH], out["name"], region)
        attrs = list(map(_ATTRS, todo)) if (flags & C.F_ATTRS).any() else [None] * n
        err = (flags & C.F_ERROR) != 0
        errors = self._errors(todo, np.flatnonzero(err))
        self._failures(todo, np.flatnonzero(dev & (status < 0)), status, attrs, errors, err)
        ok = dev & (status == 0)
        queue, thread = R_QUEUE, R_THREAD
        rows = np.flatnonzero(ok)
        track = np.zeros(n, np.int64)
        off = np.zeros(n, np.int64)
        off_end = np.zeros(n, np.int64)  # regions' END may be drawn with a later offset than their START
        lanes: list[tuple[tuple[Any, int, Any], np.ndarray]] = []  # (queue, thread, lane key), its commands' rows
        on_lane = np.zeros(n, bool)
        if len(rows):
            # Group rows by (queue object, submitting thread); look each group up once.
            first, ik = self._passes.group(np.stack([ints[C.C_QUEUE][rows], out["thread"][rows]]))
            infos = [self.queue_info(todo[i][queue], todo[i][thread]) for i in rows[first].tolist()]
            track[rows] = np.array([inf[0] for inf in infos], np.int64)[ik]
            clocks: dict[int, tuple[Any, list[int]]] = {}
            for g, inf in enumerate(infos):
                clocks.setdefault(id(inf[1]), (inf[1], []))[1].append(g)
            for clock, groups in clocks.values():
                mine = rows[np.isin(ik, groups)] if len(clocks) > 1 else rows
                self._place(clock, mine, raw, region, off, off_end)
            for g, inf in enumerate(infos):
                if inf[2] is not None:  # an out-of-order queue: its commands go on lanes
                    mine = rows[ik == g]
                    mine = mine[~region[mine]]
                    if len(mine):
                        i = int(mine[0])
                        lanes.append(((todo[i][queue], todo[i][thread], inf[2]), mine))
                        on_lane[mine] = True
        raw_start = raw[:, _START].copy()
        raw_end = raw[:, _END].copy()
        parent = out["parent"]
        kind = np.where(region, np.where(ok, passes.REGION, passes.REGION_UNPLACED),
                        np.where(ok & ~on_lane & (parent != 0), passes.LEAF, 0))
        self._extents.nest(kind, out["id"], parent, track, off, off_end, raw_start, raw_end)
        out["track"] = track
        z = np.where(ok, off, 0)
        out["raw_start"] = np.where(ok, raw_start, 0)
        out["raw_end"] = np.where(ok, raw_end, 0)
        out["dev_queued"] = np.where(ok, raw[:, _QUEUED] - z, 0)
        out["dev_submit"] = np.where(ok, raw[:, _SUBMIT] - z, 0)
        out["dev_start"] = out["raw_start"] - z
        out["dev_end"] = out["raw_end"] - np.where(ok, off_end, 0)
        for key, mine in lanes:
            self._assign_lanes(key, mine, out)
        out["status"] = err.astype(np.int8)
        return SpanBatch(t, out, attrs, errors)

    def _native_columns(self, todo: list[tuple], ints: np.ndarray, status: np.ndarray, raw: np.ndarray) -> SpanBatch:
        """What ``_columns`` gives for these rows, from the C module ``_resolve``: see the module's docstring."""
        native = self._native
        C = stamps
        n = len(todo)
        ints, status, raw = np.ascontiguousarray(ints), np.ascontiguousarray(status), np.ascontiguousarray(raw)
        groups = np.empty((4, n), np.int32)
        found = native.scan(ints, status, raw, self._region_lut, groups)
        if found[0] or found[1]:
            self._settle(todo, ints, found[0], found[1])
            found = native.scan(ints, status, raw, self._region_lut, groups)
        _, _, failed, errs, attrs_n, thread_rows, site_rows, queue_rows, path_rows, qstats = found
        thread_track = np.array(list(map(self._thread_track, ints[C.C_THREAD].take(thread_rows).tolist())), np.int64)
        if len(site_rows) == 1 and todo[site_rows[0]][R_SITE] is None:
            site_id = np.full(1, -1, np.int32)
        else:
            site_id = self._site_ids(todo, site_rows)
        queue, thread = R_QUEUE, R_THREAD
        infos = [self.queue_info(todo[i][queue], todo[i][thread]) for i in queue_rows]
        pid, nid = ints[C.C_PATH].take(path_rows).tolist(), ints[C.C_NAME].take(path_rows).tolist()
        path_id = np.array(list(map(self._launch_path, pid, nid)), np.int32)
        clocks: dict[int, int] = {}
        per_clock: list[list[int]] = []  # commands, latest START, regions, theirs
        q_clock = np.empty(len(infos), np.int64)
        for g, inf in enumerate(infos):
            k = clocks.setdefault(id(inf[1]), len(clocks))
            if k == len(per_clock):
                per_clock.append([0, 0, 0, 0])
            q_clock[g] = k
            s, acc = qstats[_QUEUE_STATS * g:_QUEUE_STATS * g + _QUEUE_STATS], per_clock[k]
            if s[0]:
                acc[1] = s[1] if not acc[0] else max(acc[1], s[1])
                acc[0] += s[0]
            if s[2]:
                acc[3] = s[3] if not acc[2] else max(acc[3], s[3])
                acc[2] += s[2]
        clock_objs = list({id(inf[1]): inf[1] for inf in infos}.values())
        out64 = np.empty((8, n), np.int64)
        name, cat, path = np.empty(n, np.int32), np.empty(n, np.int16), np.empty(n, np.int32)
        site, err = np.empty(n, np.int32), np.empty(n, np.int8)
        placements = [clk.placement for clk in clock_objs]
        knots = []
        for clk, pl, (ncmd, cmax, nreg, rmax) in zip(clock_objs, placements, per_clock):
            # The map's offsets are what ``offsets`` of these STARTs would give: note them as mapped the same way.
            knots.append(clk.knots(cmax if ncmd else rmax if nreg and pl.empty else None))
        with contextlib.ExitStack() as lent:  # each placement locked, and what ``finish`` placed taken back
            args = [(*kn, *lent.enter_context(pl.native(ncmd + nreg + 1)))
                    for pl, kn, (ncmd, _, nreg, _) in zip(placements, knots, per_clock)]
            native.finish(ints=ints, status=status, raw=raw, lut=self._region_lut, groups=groups,
                          thread_track=thread_track, site_id=site_id,
                          queue_track=np.array([inf[0] for inf in infos], np.int64), queue_clock=q_clock,
                          queue_lane=np.array([inf[2] is not None for inf in infos], np.uint8), path_id=path_id,
                          clocks=args, extents=self._extents.table, out64=out64, name=name, cat=cat, path=path,
                          site=site, status_out=err)
        out = {"id": ints[C.C_ID], "parent": ints[C.C_PARENT], "host_begin": ints[C.C_HB], "host_end": ints[C.C_HE],
               "name": name, "cat": cat, "site": site, "thread": out64[0], "path": path, "track": out64[1],
               "dev_queued": out64[2], "dev_submit": out64[3], "dev_start": out64[4], "dev_end": out64[5],
               "raw_start": out64[6], "raw_end": out64[7], "status": err}
        attrs = [None] * n
        if attrs_n:  # the records' attrs, a part at a time (the GIL held for ~0.1 ms each, not ~1 ms on 64k rows)
            attrs = native.field(todo, R_ATTRS, 0, min(n, _PART))
            for lo in range(_PART, n, _PART):
                attrs += native.field(todo, R_ATTRS, lo, min(n, lo + _PART))
        errors = self._errors(todo, np.flatnonzero(ints[C.C_FLAGS] & C.F_ERROR)) if errs else {}
        if failed:
            self._failures(todo, np.flatnonzero(((ints[C.C_FLAGS] & C.F_DEV) != 0) & (status < 0)), status, attrs,
                           errors, err)
        lanes = [g for g, inf in enumerate(infos) if inf[2] is not None]
        if lanes:  # out-of-order queues: their commands, placed above, go on lanes
            region = self._region_lut[np.minimum(cat, len(self._region_lut) - 1)]
            for g in lanes:
                mine = np.flatnonzero((groups[2] == g) & ~region)
                if len(mine):
                    i = int(mine[0])
                    self._assign_lanes((todo[i][queue], todo[i][thread], infos[g][2]), mine, out)
        return SpanBatch(self.tables, out, attrs, errors)

    def _settle(self, todo: list[tuple], ints: np.ndarray, misses: int, big: int) -> None:
        """The rare rows ``scan`` cannot group yet, made groupable in place: names, categories and paths interned;
        thread keys beyond int64 replaced by a stand-in key (negative, below -1) that ``_thread_track`` maps
        back."""
        C = stamps
        t = self.tables
        if misses:
            for row, field, table in ((C.C_NAME, R_NAME, t.names), (C.C_CAT, R_CAT, t.cats), (C.C_PATH, R_PATH, t.paths)):
                self._interned(ints[row], todo, field, table)
        if big:
            thr = ints[C.C_THREAD]
            for i in np.flatnonzero(ints[C.C_FLAGS] & C.F_BIG_THREAD).tolist():
                thr[i] = self._stand_in(todo[i][R_THREAD])

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

    def _paths(self, todo: list[tuple], pid: np.ndarray, name_ids: np.ndarray, region: np.ndarray) -> np.ndarray:
        """Interned full path per row: a region's recorded path ends in its name; a launch's gets it added.

        ``pid`` holds the recorded paths' ids (``stamps.columns``; -1: not interned yet). A launch's path is
        looked up once per distinct (recorded path, name) in the batch, from a table kept between batches.
        """
        paths = self.tables.paths
        pid = self._interned(pid, todo, R_PATH, paths)
        launch = np.flatnonzero(~region)
        if not len(launch):
            return pid.astype(np.int32)
        first, inverse = self._passes.group(np.stack([pid[launch], name_ids[launch]]))
        known, names = self._launch_paths, self.tables.names.values
        ids = []
        for key in zip(pid[launch[first]].tolist(), name_ids[launch[first]].tolist()):
            i = known.get(key)
            if i is None:
                i = known[key] = paths.id(paths.values[key[0]] + (names[key[1]],))
            ids.append(i)
        out = pid.astype(np.int32)
        out[launch] = np.array(ids, np.int32)[inverse]
        return out

    def _assign_lanes(self, key: tuple[Any, int, Any], rows: np.ndarray, out: dict[str, np.ndarray]) -> None:
        """Put one out-of-order queue's commands, in start order, on the first lane free at their start."""
        queue, thread, lane_key = key
        ds, de, track = out["dev_start"], out["dev_end"], out["track"]
        rows = rows[np.argsort(ds[rows], kind="stable")]
        lanes, self._lanes[lane_key] = self._passes.first_fit(
            ds[rows], de[rows], self._lanes.get(lane_key, np.zeros(0, np.int64)))
        used = np.unique(lanes)
        lane_track = np.zeros(int(used[-1]) + 1, np.int64)
        for j in used.tolist():
            lane_track[j] = self.tracks.device_queue(queue, thread, None, str(j + 1))
        track[rows] = lane_track[lanes]

    @staticmethod
    def _errors(todo: list[tuple], rows: np.ndarray) -> dict[int, str]:
        """Row -> the record's error message, for these rows (records whose ``R_ERROR`` is set)."""
        error = R_ERROR
        return {i: todo[i][error] for i in rows.tolist()}

    def _failures(self, todo: list[tuple], rows: np.ndarray, status: np.ndarray, attrs: list[Any],
                  errors: dict[int, str], err: np.ndarray) -> None:
        """Failed commands among ``rows`` (a negative ``status``): ``_device_failed`` each."""
        known, ev0, ev1 = self._failed, R_EV0, R_EV1
        for i in rows.tolist():
            rec = todo[i]
            self._device_failed(i, rec[ev0], rec[ev1], int(status[i]), int(known[i]), attrs, errors, err)

    @staticmethod
    def _device_failed(i: int, e0: Any, e1: Any, code: int, known: int, attrs: list[Any], errors: dict[int, str],
                       err: np.ndarray) -> None:
        """A failed command, or profiling info that does not exist: keep the host span and say why.
        ``known``: 1 the command failed, 0 it did not, -1 ask its events."""
        a = dict(attrs[i] or {})
        a["cltrace.device_time"] = f"unavailable: {stamps.describe(code)}"
        attrs[i] = a
        if known == 1 or (known == -1 and (_is_event_error(e0) or (e1 is not None and _is_event_error(e1)))):
            err[i] = True
            errors.setdefault(i, f"command failed: {stamps.describe(code)}")


def _is_event_error(ev: Any) -> bool:
    try:
        return ev.command_execution_status < 0
    except Exception:
        return True


__all__ = ["Resolver", "NAMES"]
