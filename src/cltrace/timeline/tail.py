"""The resolver's tail in native code: a batch's first-pass columns -> its ``SpanBatch``, two passes over the rows.

After ``stamps.columns_read`` every row still needs its interned ids, thread track, call site, launch path,
queue track, its device's clock map and placement, its region's nesting and its device columns. Here that is
two calls of the C extension ``_resolve``, each one pass over the rows without the GIL: ``scan`` groups the
rows (threads, sites, (queue, thread), (path, name)), Python looks up each distinct group once, and
``finish`` places every device's commands (the map and placement of ``clock.py``/``placement.py``, state
passed as arrays and taken back), nests the regions and writes the final columns. The pure-Python resolver
(``Resolver._columns``) is the reference: tests/test_resolve_twins.py holds them equal on real records.

Rare rows stay in Python, paid for only where they occur: values not interned yet, thread keys beyond int64,
failed commands, out-of-order lanes, records' errors.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from . import stamps
from .batch import SpanBatch

_QUEUE_STATS = 4  # per queue group: commands, their latest START, regions, theirs (_resolve.c Q_*)
_PART = 8192  # records per ``field`` call


def columns(res: Any, native: Any, todo: list[tuple], ints: np.ndarray, status: np.ndarray,
            raw: np.ndarray) -> SpanBatch:
    """What ``Resolver._columns`` gives for these rows, from ``native`` (the ``_resolve`` module)."""
    C = stamps
    n = len(todo)
    ints, status, raw = np.ascontiguousarray(ints), np.ascontiguousarray(status), np.ascontiguousarray(raw)
    groups = np.empty((4, n), np.int32)
    found = native.scan(ints, status, raw, res._region_lut, groups)
    if found[0] or found[1]:
        _settle(res, todo, ints, found[0], found[1])
        found = native.scan(ints, status, raw, res._region_lut, groups)
    _, _, failed, errs, attrs_n, thread_rows, site_rows, queue_rows, path_rows, qstats = found
    thread_track = np.array(list(map(res._thread_track, ints[C.C_THREAD].take(thread_rows).tolist())), np.int64)
    if len(site_rows) == 1 and todo[site_rows[0]][14] is None:
        site_id = np.full(1, -1, np.int32)
    else:
        site_id = res.sites.ids([todo[i][14] for i in site_rows], res._passes.group)
    infos = [res.queue_info(todo[i][8], todo[i][5]) for i in queue_rows]
    pid, nid = ints[C.C_PATH].take(path_rows).tolist(), ints[C.C_NAME].take(path_rows).tolist()
    path_id = np.array(list(map(res._launch_path, pid, nid)), np.int32)
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
        knots.append(clk.knots(cmax if ncmd else rmax if nreg and not len(pl._t) else None))
    for pl in placements:
        pl._lock.acquire()
    try:
        args = []
        for pl, kn, (ncmd, _, nreg, _) in zip(placements, knots, per_clock):
            room = ncmd + nreg + 1
            args.append((*kn, pl._t, pl._o, np.empty(room, np.int64), np.empty(room, np.int64), pl.state()))
        native.finish(ints=ints, status=status, raw=raw, lut=res._region_lut, groups=groups, thread_track=thread_track,
                      site_id=site_id, queue_track=np.array([inf[0] for inf in infos], np.int64), queue_clock=q_clock,
                      queue_lane=np.array([inf[2] is not None for inf in infos], np.uint8), path_id=path_id,
                      clocks=args, extents=res._extents._x, out64=out64, name=name, cat=cat, path=path, site=site,
                      status_out=err)
        for pl, a in zip(placements, args):
            pl.update(a[7], a[5], a[6])
    finally:
        for pl in placements:
            pl._lock.release()
    out = {"id": ints[C.C_ID], "parent": ints[C.C_PARENT], "host_begin": ints[C.C_HB], "host_end": ints[C.C_HE],
           "name": name, "cat": cat, "site": site, "thread": out64[0], "path": path, "track": out64[1],
           "dev_queued": out64[2], "dev_submit": out64[3], "dev_start": out64[4], "dev_end": out64[5],
           "raw_start": out64[6], "raw_end": out64[7], "status": err}
    attrs = [None] * n
    if attrs_n:  # the records' attrs, a part at a time (the GIL held for ~0.1 ms each, not ~1 ms on 64k rows)
        attrs = native.field(todo, 11, 0, min(n, _PART))
        for lo in range(_PART, n, _PART):
            attrs += native.field(todo, 11, lo, min(n, lo + _PART))
    errors: dict[int, str] = {}
    if errs:
        for i in np.flatnonzero(ints[C.C_FLAGS] & C.F_ERROR).tolist():
            errors[i] = todo[i][13]
    if failed:
        known = res._failed
        for i in np.flatnonzero(((ints[C.C_FLAGS] & C.F_DEV) != 0) & (status < 0)).tolist():
            res._device_failed(i, todo[i][9], todo[i][10], int(status[i]), int(known[i]), attrs, errors, err)
    lanes = [g for g, inf in enumerate(infos) if inf[2] is not None]
    if lanes:  # out-of-order queues: their commands, placed above, go on lanes
        region = res._region_lut[np.minimum(cat, len(res._region_lut) - 1)]
        for g in lanes:
            mine = np.flatnonzero((groups[2] == g) & ~region)
            if len(mine):
                i = int(mine[0])
                res._assign_lanes((todo[i][8], todo[i][5], infos[g][2]), mine, out)
    return SpanBatch(res.tables, out, attrs, errors)


def _settle(res: Any, todo: list[tuple], ints: np.ndarray, misses: int, big: int) -> None:
    """The rare rows ``scan`` cannot group yet, made groupable in place: names, categories and paths interned;
    thread keys beyond int64 replaced by a stand-in key (negative, below -1) that ``_thread_track`` maps back."""
    C = stamps
    t = res.tables
    if misses:
        for row, field, table in ((C.C_NAME, 1, t.names), (C.C_CAT, 0, t.cats), (C.C_PATH, 4, t.paths)):
            res._interned(ints[row], todo, field, table)
    if big:
        thr = ints[C.C_THREAD]
        for i in np.flatnonzero(ints[C.C_FLAGS] & C.F_BIG_THREAD).tolist():
            thr[i] = res._stand_in(todo[i][5])

