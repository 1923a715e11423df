"""The trace's tracks, each written on its own packet sequence.

Tracks (TrackDescriptor), the tree the Chrome JSON shows too (``export.processes``): the host
process, named after the program; one thread track per host thread; the compile track inside the
process; per device a process ("OpenCL: <device>") whose threads are its (queue, submitting
thread) tracks, named as the TrackRegistry names them; counter tracks for bytes transferred.

Each sequence opens with TracePacketDefaults that name its track and a sequence-scoped incremental
clock (id 64, tied by a ClockSnapshot to BUILTIN_CLOCK_MONOTONIC, which ``perf_counter_ns`` reads on
Linux). Event names, categories, annotation names and annotation string values (a launch's program
hash, a stack) are interned per sequence; the byte templates that packet rows share (sequence fields,
name and category iids, annotation headers) live in one pool.
Device slices carry the name only: their category is their span's, on the host slice.
"""
from __future__ import annotations

import threading
from typing import Any, Mapping

import numpy as np

from ...timeline.spans import STATUS_ERROR
from ...timeline.tracks import DEVICE_QUEUE, HOST_THREAD
from ...timeline.arrays import distinct, unique
from ..processes import device_pid
from . import messages
from .layout import Pool
from ...timeline.sites import STACK
from .wire import (A_DEV_END, A_DEV_START, A_ERROR, A_PARENT, A_SPAN, A_STATUS, CATS, DA_INT, DA_NAME_IID,
                   DA_STRING_IID, DNAMES, HOST_CLOCK, I_SITES, MONOTONIC, NAMES, P_SEQ, P_TE, ROW_CONSTANTS,
                   SL_FILE, SVALUES,
                   SL_FUNCTION, SL_IID, SL_LINE, SYNTHETIC_UUID, TABLES, TE_CAT, TE_DEBUG, TE_NAME, TE_SITE, TE_UUID,
                   uv, value)

# Int annotations with a pooled header per value length, in the order the encoder writes them.
STANDARD_ANNS = (A_SPAN, A_PARENT, A_DEV_START, A_DEV_END)
# Distinct string values interned per sequence; later ones are written inline (values unique to a span
# would only grow the table).
MAX_STRING_VALUES = 4096


class Seq:
    """One packet sequence (one track): interning tables, incremental clock, row templates."""

    __slots__ = ("id", "uuid", "device", "last", "offset", "iids", "pending", "tail", "anns", "counter",
                 "counter_prefix", "moved", "extras", "sites")

    def __init__(self, seq_id: int, uuid: int, device: bool = False) -> None:
        self.id = seq_id
        self.uuid = uuid
        self.device = device
        self.last: int | None = None  # None until the sequence's first packet is written
        self.offset: int | None = None  # raw - mapped device start last written as "device.start"
        self.iids: list[dict[str, int]] = [{}, {}, {}, {}]  # by table: wire.CATS, NAMES, DNAMES, SVALUES
        self.pending = bytearray()  # interned entries not yet written
        self.tail = -1  # pool id: the fields between the timestamp and the TrackEvent
        self.anns: dict[str, int] = {}  # annotation name -> pool id of its header for a 1-byte value
        self.counter: int | None = None  # uuid of this track's bytes counter
        self.counter_prefix = -1
        self.moved = 0  # bytes transferred so far
        self.extras: dict[Any, bytes] = {}
        self.sites: dict[Any, int] = {}  # CallSite -> its interned source location iid

    def site(self, site: Any) -> int:
        """The iid of a call site as an interned SourceLocation (file, function, line)."""
        iid = self.sites.get(site)
        if iid is None:
            iid = self.sites[site] = len(self.sites) + 1
            f, fn = site.file.encode("utf-8", "replace"), site.function.encode("utf-8", "replace")
            entry = (SL_IID + uv(iid) + SL_FILE + uv(len(f)) + f + SL_FUNCTION + uv(len(fn)) + fn
                     + SL_LINE + uv(max(int(site.line), 0)))
            self.pending += I_SITES + uv(len(entry)) + entry
        return iid

    def intern(self, table: int, text: str) -> int:
        ids = self.iids[table]
        iid = ids.get(text)
        if iid is None:
            iid = ids[text] = len(ids) + 1
            t_table, t_iid, t_name = TABLES[table]
            raw = text.encode("utf-8", "replace")
            entry = t_iid + uv(iid) + t_name + uv(len(raw)) + raw
            self.pending += t_table + uv(len(entry)) + entry
        return iid

    def dname(self, name: str) -> bytes:
        return DA_NAME_IID + uv(self.intern(DNAMES, name))

    def annotation(self, name: str, v: bytes) -> bytes:
        inner = self.dname(name) + v
        return TE_DEBUG + uv(len(inner)) + inner

    def value(self, v: Any) -> bytes:
        """``wire.value``, with a string as an interned ``string_value_iid`` while the table has room."""
        if isinstance(v, str) and (len(self.iids[SVALUES]) < MAX_STRING_VALUES or str(v) in self.iids[SVALUES]):
            return DA_STRING_IID + uv(self.intern(SVALUES, str(v)))
        return value(v)

    def extra(self, a: dict[str, Any] | None, failed: bool, error: str | None, stack: str | None = None) -> bytes:
        """Annotations for status, error and attributes, and a call site's callers ("code.stacktrace",
        with ``stack_depth`` > 1); cached when the values are hashable."""
        try:
            key = (failed, error, tuple(a.items()) if a else (), stack)
            hit = self.extras.get(key)
        except TypeError:
            key, hit = None, None
        if hit is not None:
            return hit
        parts = []
        if failed:
            parts.append(self.annotation(A_STATUS, self.value(STATUS_ERROR)))
            parts.append(self.annotation(A_ERROR, self.value(error or "")))
        for k, v in (a or {}).items():
            if v is not None:
                parts.append(self.annotation(str(k), self.value(v)))
        if stack is not None:
            parts.append(self.annotation(STACK, self.value(stack)))
        out = b"".join(parts)
        if key is not None and len(self.extras) < 4096:
            self.extras[key] = out
        return out


class Tracks:
    """Descriptors and sequences of the tracks spans are written on, and the templates in ``pool``."""

    def __init__(self, registry: Any, mono: int, process_names: Mapping[int, str] | None = None) -> None:
        self.registry = registry  # the trace's tracks (``base.TraceContext.tracks``)
        self.process_names = process_names or {}  # pid -> name of another host process (a merge's inputs)
        self.mono = mono  # MONOTONIC - perf_counter_ns
        self.seqs: dict[int, Seq] = {}  # track id -> its sequence
        self.pool = Pool()
        self.consts = np.array([self.pool.add(b) for b in ROW_CONSTANTS], np.int64)  # see wire.ROW_CONSTANTS
        self.process_uuid = SYNTHETIC_UUID
        self._next_uuid = SYNTHETIC_UUID + 1
        self._device_uuids: dict[str, int] = {}
        self._host_uuids: dict[int, int] = {}  # pid of another host process (merged traces) -> uuid
        self._prefixes: dict[int, int] = {}  # prefix key (track, cat id, name id) -> pool id
        self._site_prefixes: dict[tuple[int, int], int] = {}  # (prefix key, site id) -> pool id

    def new_uuid(self) -> int:
        u = self._next_uuid
        self._next_uuid += 1
        return u

    def host_process(self, pid: int, head: list[bytes]) -> int:
        """The uuid of a host process's track: the sink's own (0 or the registry's pid), else another
        process of a merged trace, described on first use."""
        if not pid or pid == self.registry.pid:
            return self.process_uuid
        uuid = self._host_uuids.get(pid)
        if uuid is None:
            uuid = self._host_uuids[pid] = self.new_uuid()
            name = self.process_names.get(pid, f"pid {pid}")
            head.append(messages.descriptor(uuid, process=messages.process(pid, name)))
        return uuid

    def open(self, track_ids: Any, head: list[bytes]) -> None:
        """Descriptors (into ``head``) and sequences for the tracks not seen yet (None: no track)."""
        for t in track_ids:
            if t is not None and t not in self.seqs:
                self._open(t, head)

    def _open(self, track_id: int, head: list[bytes]) -> None:
        track = self.registry.get(track_id)
        if track.kind == HOST_THREAD:
            pid = track.pid or self.registry.pid
            self.host_process(pid, head)
            desc = messages.descriptor(track.id, thread=messages.thread(
                pid, _native_tid(track.attrs.get("thread.id")) or track.id, track.name))
        elif track.kind == DEVICE_QUEUE:  # a thread of the device's process, as in the Chrome JSON
            dpid = device_pid(self.registry, track.device)
            if track.process not in self._device_uuids:
                parent = self._device_uuids[track.process] = self.new_uuid()
                head.append(messages.descriptor(parent, process=messages.process(dpid, track.process),
                                                ordering=messages.EXPLICIT))
            desc = messages.descriptor(track.id, thread=messages.thread(dpid, track.id, track.name), rank=track.id)
        else:  # the compile track, or any other host-side track
            desc = messages.descriptor(track.id, name=track.name, parent=self.host_process(track.pid, head))
        head.append(desc)
        seq = self.seqs[track_id] = Seq(track_id + 1, track.id, track.kind == DEVICE_QUEUE)
        seq.tail = self.pool.add(P_SEQ + uv(seq.id) + P_TE)
        for name in STANDARD_ANNS:
            dn = seq.dname(name)
            seq.anns[name] = len(self.pool.items)
            for vlen in range(1, 11):
                self.pool.add(TE_DEBUG + uv(len(dn) + len(DA_INT) + vlen) + dn + DA_INT)

    def header(self, seq: Seq, t0: int) -> bytes:
        """The packet that opens a sequence: defaults and the clock snapshot for its first time ``t0``."""
        return messages.sequence_start(seq.id, [(HOST_CLOCK, t0, True), (MONOTONIC, t0 + self.mono, False)],
                                       MONOTONIC, HOST_CLOCK, seq.uuid, first=True)

    def prefix_ids(self, tables: Any, tracks: np.ndarray, cats: np.ndarray, names: np.ndarray,
                   sites: np.ndarray | None = None) -> np.ndarray:
        """Pool ids of the BEGIN templates (category and name iids, and with ``sites`` the call site's
        interned source location) of rows on the given tracks, from the tracks' and the ``tables``'
        interned ids; each distinct one is looked up once."""
        if not len(tracks):
            return np.zeros(0, np.int64)
        key = (tracks.astype(np.int64) << 44) | (cats.astype(np.int64) << 28) | names.astype(np.int64)
        if sites is not None and (sites >= 0).any():
            return self._site_prefix_ids(tables, key, sites)
        first = key[0]
        if (key == first).all():
            uniq, inverse = [int(first)], None
        else:
            u, _, inverse = unique(key)
            uniq = u.tolist()
        get = self._prefixes.get
        ids = [get(k) for k in uniq]
        if None in ids:
            ids = [self._prefix(tables, k) if i is None else i for k, i in zip(uniq, ids)]
        out = np.array(ids, np.int64)
        return np.full(len(key), ids[0], np.int64) if inverse is None else out[inverse]

    def _site_prefix_ids(self, tables: Any, key: np.ndarray, sites: np.ndarray) -> np.ndarray:
        """``prefix_ids`` of rows with call sites: one template per distinct (prefix key, site)."""
        u, _, inverse = unique(key)
        m = len(tables.sites.values) + 1
        u2, inv2 = distinct(inverse * m + sites + 1)
        get = self._prefixes.get
        ids = []
        for k2 in u2.tolist():
            base, site = int(u[k2 // m]), k2 % m - 1
            if site < 0:
                ids.append(get(base) or self._prefix(tables, base))
                continue
            pid = self._site_prefixes.get((base, site))
            if pid is None:
                pool = get(base) or self._prefix(tables, base)
                seq = self.seqs[base >> 44]
                body = self.pool.items[pool] + TE_SITE + uv(seq.site(tables.sites.values[site]))
                pid = self._site_prefixes[base, site] = self.pool.add(body)
            ids.append(pid)
        return np.array(ids, np.int64)[inv2]

    def prefix(self, tables: Any, key: int, site: int) -> int:
        """The pool id of one BEGIN template (``prefix_ids``' key and a site id, -1: none), made where new."""
        if site >= 0:
            pid = self._site_prefixes.get((key, site))
            if pid is not None:
                return pid
        base = self._prefixes.get(key) or self._prefix(tables, key)
        if site < 0:
            return base
        seq = self.seqs[key >> 44]
        body = self.pool.items[base] + TE_SITE + uv(seq.site(tables.sites.values[site]))
        pid = self._site_prefixes[key, site] = self.pool.add(body)
        return pid

    def _prefix(self, tables: Any, key: int) -> int:
        track, cat, name = key >> 44, (key >> 28) & 0xFFFF, key & 0xFFFFFFF
        seq = self.seqs[track]
        body = TE_NAME + uv(seq.intern(NAMES, tables.names.values[name]))
        if not seq.device:
            body = TE_CAT + uv(seq.intern(CATS, tables.cats.values[cat])) + body
        pid = self._prefixes[key] = self.pool.add(body)
        return pid

    def counter(self, track_id: int, head: list[bytes]) -> Seq:
        """The sequence of a track whose bytes counter is written, its counter track described."""
        seq = self.seqs[track_id]
        if seq.counter is None:
            track = self.registry.get(track_id)
            seq.counter = self.new_uuid()
            parent = (self._device_uuids.get(track.process, self.process_uuid) if track.kind == DEVICE_QUEUE
                      else self.host_process(track.pid, head))
            head.append(messages.descriptor(seq.counter, name=f"{track.name} · bytes transferred", parent=parent,
                                            unit=messages.UNIT_SIZE_BYTES))
            seq.counter_prefix = self.pool.add(TE_UUID + uv(seq.counter))
        return seq


def _native_tid(ident: Any) -> int | None:
    for t in threading.enumerate():
        if t.ident == ident:
            return t.native_id
    return None
