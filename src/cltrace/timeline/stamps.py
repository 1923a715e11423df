"""Profiling stamps of many events at once: arrays in, arrays out.

``read(handles)`` gives each event's status and its QUEUED, SUBMIT, START, END stamps. Reading them
one ``ev.profile.x`` attribute at a time costs microseconds each; here a batch is read by the C
extension ``_stamps`` in one loop without the GIL, from the OpenCL library pyopencl has loaded.
Where the extension is not built (no compiler) or ``CLTRACE_NATIVE=0``, a pure-Python fallback with
the same semantics runs instead; ``PATH`` says which ("native" or "python").

Handles are raw ``cl_event`` pointers (``ev.int_ptr``): the caller keeps the events alive while
it reads or waits on them.

Tickets (native path, ``_reaper.c``): the hot path trades a command's Event for a ticket, an int kept
in the record. A native thread reads the stamps as soon as the command is done and releases the
event, without the GIL: a launch loop that starves every other Python thread (the resolver included)
no longer makes the driver hold every event it ever issued. ``peek`` reads tickets as ``read`` reads
handles; ``done`` frees them once their record is resolved or dropped. ``CLTRACE_REAPER=0`` keeps
the Events in the records instead.
"""
from __future__ import annotations

import contextlib
import functools
import os
from itertools import compress, repeat
from operator import attrgetter, itemgetter
from typing import Any, Callable, Iterator, NamedTuple, Sequence

import numpy as np

from .._native import choose, extension
from .raw import R_EV0, R_EV1, R_FIELDS


_COMPLETE = 0
_PROFILING_INFO_NOT_AVAILABLE = -7
_QUEUED, _SUBMIT, _START, _END = 0x1280, 0x1281, 0x1282, 0x1283


class Impl(NamedTuple):
    """One implementation of the interface below."""
    handles: Callable[[Sequence[Any]], np.ndarray]
    read: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]
    wait: Callable[[np.ndarray], None]
    transpose: Callable[[list], list]
    columns: Callable[[list, dict, dict, dict], tuple[np.ndarray, np.ndarray]]
    columns_read: Callable[[list, dict, dict, dict], tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]
    settle: Callable[[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray], tuple[int, int, int]]


def _as_handles(handles: Any) -> np.ndarray:
    return np.ascontiguousarray(handles, dtype=np.uint64).reshape(-1)


def _outputs(n: int) -> tuple[np.ndarray, np.ndarray]:
    return np.zeros(n, np.int32), np.zeros((n, 4), np.int64)


# --- pure Python: pyopencl's own calls on events rebuilt from their handles -------------------
# Measured faster than ctypes on the same library (benchmarks/bench_stamps.py): pyopencl's
# get_profiling_info is one cheap binding call, where ctypes converts every argument.

def _python_handles(events: Sequence[Any]) -> np.ndarray:
    return np.fromiter(map(attrgetter("int_ptr"), events), np.uint64, count=len(events))


def _python_read(handles: np.ndarray, end_only: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """``end_only``: a region's second marker, whose END alone is used (one call where it completed; the other
    stamps 0)."""
    import pyopencl as cl

    event = cl.Event.from_int_ptr
    return _read_events([event(h, True) for h in _as_handles(handles).tolist()], end_only)


def _read_events(events: list[Any], end_only: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """``_python_read`` of pyopencl Events themselves: a record's own Event is read without rebuilding it
    from its handle (0.65 against 1.05-1.5 us an event on PoCL). Each stamp of the whole batch is one
    ``map`` over pyopencl's unbound method (no bytecode per call: ~0.25 against ~0.45 us an event); a
    batch where any read fails is read again event by event, which tells each one's status."""
    import pyopencl as cl

    n = len(events)
    status, stamps = _outputs(n)
    if not n:
        return status, stamps
    read = cl.Event.get_profiling_info
    try:
        for j, what in ((3, _END),) if end_only else enumerate((_QUEUED, _SUBMIT, _START, _END)):
            stamps[:, j] = np.fromiter(map(read, events, repeat(what)), np.int64, n)
        return status, stamps
    except cl.Error:
        stamps[:] = 0  # columns read before the failure: the loop below writes every row again
    error = cl.Error
    flat: list[int] = []
    for i, ev in enumerate(events):
        get = ev.get_profiling_info
        try:
            flat += (0, 0, 0, get(_END)) if end_only else (get(_QUEUED), get(_SUBMIT), get(_START), get(_END))
        except error as exc:
            status[i] = _not_read(ev, exc.code, error, flat)
    if len(flat) == 4 * len(events):
        stamps[:] = np.array(flat, np.int64).reshape(-1, 4)
    elif flat:
        stamps[status == _COMPLETE] = np.array(flat, np.int64).reshape(-1, 4)
    return status, stamps


def _not_read(ev: Any, code: int, error: type, flat: list[int]) -> int:
    """Status of an event whose stamps did not read; 0 (stamps added to ``flat``) if it just completed."""
    if code != _PROFILING_INFO_NOT_AVAILABLE:
        return code
    try:
        st = ev.command_execution_status
    except error as exc:
        return exc.code
    if st != _COMPLETE:
        return st
    get = ev.get_profiling_info
    try:  # it completed between the two calls
        flat += (get(_QUEUED), get(_SUBMIT), get(_START), get(_END))
        return _COMPLETE
    except error:
        return _PROFILING_INFO_NOT_AVAILABLE  # complete without stamps: no profiling on its queue


def _originals() -> tuple[Any, Any]:
    """pyopencl's own waits, as they were before ``cltrace.instrument()`` could hook them: cltrace's
    waits are not the program's."""
    import pyopencl._cl as _cl

    return _cl.wait_for_events, _cl.Event.wait


_WAIT_EVENTS, _EVENT_WAIT = _originals()


def _python_wait(handles: np.ndarray) -> None:
    import pyopencl as cl

    hs = _as_handles(handles)
    if not len(hs):
        return
    events = [cl.Event.from_int_ptr(h, True) for h in hs.tolist()]
    try:
        _WAIT_EVENTS(events)
    except cl.Error:
        for ev in events:  # a failed command must not stop the others
            try:
                _EVENT_WAIT(ev)
            except cl.Error:
                pass


def _python_transpose(records: list) -> list:
    return list(zip(*records))


# Rows of ``columns``' int64 output, and the bits of its FLAGS row (the C extension's layout).
C_ID, C_PARENT, C_HB, C_HE, C_QUEUE, C_PATH, C_THREAD, C_NAME, C_CAT, C_FLAGS, C_SITE, N_COLS = range(12)
F_DEV, F_TWO, F_ERROR, F_ATTRS, F_BIG_THREAD, F_TICKETS = 1, 2, 4, 8, 16, 32


def _python_columns(records: list, names: dict, cats: dict, paths: dict,
                    handles: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """``handles`` False: the rows holding Events get no handle (``_python_columns_read`` reads the Events
    themselves, and only tickets are used after it); tickets still do."""
    n = len(records)
    ints = np.zeros((N_COLS, n), np.int64)
    hs = np.zeros((2, n), np.uint64)
    if not n:
        return ints, hs
    cols = list(zip(*records))
    cat, name, sid, parent, path, thread, hb, he, queue, ev0, ev1, attrs, rstatus, _, site = cols[:R_FIELDS]  # R_*
    for row, col in ((C_ID, sid), (C_PARENT, parent), (C_HB, hb), (C_HE, he)):
        ints[row] = np.fromiter(col, np.int64, n)
    flags = ints[C_FLAGS]
    try:
        ints[C_THREAD] = np.fromiter(thread, np.int64, n)
    except OverflowError:  # a reused thread ident's key (generation above bit 64): the caller reads it
        big = np.fromiter((k >= 1 << 63 for k in thread), bool, n)
        ints[C_THREAD] = [0 if b else k for k, b in zip(thread, big.tolist())]
        flags[big] |= F_BIG_THREAD
    none = id(None)
    q = ints[C_QUEUE]
    q[:] = np.fromiter(map(id, queue), np.int64, n)
    q[q == none] = 0
    ints[C_PATH] = _ids_of_objects(path, paths)
    ints[C_SITE] = np.fromiter(map(id, site), np.int64, n)
    ints[C_NAME] = np.fromiter(map(names.get, name, repeat(-1)), np.int64, n)
    ints[C_CAT] = np.fromiter(map(cats.get, cat, repeat(-1)), np.int64, n)
    dev = (q != 0) & (np.fromiter(map(id, ev0), np.int64, n) != none)
    two = dev & (np.fromiter(map(id, ev1), np.int64, n) != none)
    flags |= (dev * F_DEV) | (two * F_TWO)
    if rstatus.count(None) != n:  # most batches have neither: one C loop says so
        flags[np.fromiter(map(id, rstatus), np.int64, n) != none] |= F_ERROR
    if attrs.count(None) != n:
        flags[np.fromiter(map(id, attrs), np.int64, n) != none] |= F_ATTRS
    if REAPER is not None:  # records whose events the hot path traded for tickets
        tick = dev & np.fromiter((type(e) is int for e in ev0), bool, n)
        if tick.any():
            flags[tick] |= F_TICKETS
            hs[0][tick] = np.fromiter(compress(ev0, tick.tolist()), np.uint64, int(tick.sum()))
            t1 = tick & two
            hs[1][t1] = np.fromiter(compress(ev1, t1.tolist()), np.uint64, int(t1.sum()))
            dev, two = dev & ~tick, two & ~tick
    if not handles:
        return ints, hs
    ptr = attrgetter("int_ptr")
    hs[0][dev] = np.fromiter(map(ptr, compress(ev0, dev.tolist())), np.uint64, int(dev.sum()))
    hs[1][two] = np.fromiter(map(ptr, compress(ev1, two.tolist())), np.uint64, int(two.sum()))
    return ints, hs


def _ids_of_objects(values: tuple, ids: dict) -> np.ndarray:
    """``ids.get(v, -1)`` of each value, looked up once per distinct object (rows share path tuples)."""
    obj = np.fromiter(map(id, values), np.int64, len(values))
    _, first, inverse = np.unique(obj, return_index=True, return_inverse=True)
    get = ids.get
    return np.array([get(values[i], -1) for i in first.tolist()], np.int64)[inverse]


def _python_columns_read(records: list, names: dict, cats: dict, paths: dict) -> tuple[np.ndarray, ...]:
    ints, hs = _python_columns(records, names, cats, paths, handles=False)
    status, raw = _outputs(len(records))
    flags = ints[C_FLAGS]
    ev = np.flatnonzero((flags & (F_DEV | F_TICKETS)) == F_DEV)
    if len(ev):
        e0, e1 = itemgetter(R_EV0), itemgetter(R_EV1)
        st0, s0 = _read_events(list(map(e0, map(records.__getitem__, ev.tolist()))))
        status[ev], raw[ev] = st0, s0
        two = (flags[ev] & F_TWO) != 0
        if two.any():
            rows = ev[two]
            st1, s1 = _read_events(list(map(e1, map(records.__getitem__, rows.tolist()))), end_only=True)
            raw[rows, 2] = raw[rows, 3]
            raw[rows, 3] = s1[:, 3]
            status[rows] = combined(st0[two], st1)
    return ints, hs, status, raw


def _python_settle(ints: np.ndarray, hs: np.ndarray, status: np.ndarray, raw: np.ndarray,
                   failed: np.ndarray) -> tuple[int, int, int]:
    flags = ints[C_FLAGS]
    tick = (flags & (F_DEV | F_TICKETS)) == (F_DEV | F_TICKETS)
    failed[:] = -1
    rows = np.flatnonzero(tick)
    if len(rows):
        st0, s0, f0 = peek(hs[0][rows])
        status[rows], raw[rows], failed[rows] = st0, s0, f0
        two = (flags[rows] & F_TWO) != 0
        if two.any():
            r2 = rows[two]
            st1, s1, f1 = peek(hs[1][r2])
            raw[r2, 2] = raw[r2, 3]
            raw[r2, 3] = s1[:, 3]
            status[r2] = combined(st0[two], st1)
            failed[r2] = f0[two] | f1
    return int((status > 0).sum()), len(rows), int(((flags & F_DEV) != 0).sum())


def combined(st0: np.ndarray, st1: np.ndarray) -> np.ndarray:
    """A region's status from its two markers': the first failure, else the later of the two."""
    return np.where(st0 < 0, st0, np.where(st1 < 0, st1, np.maximum(st0, st1))).astype(np.int32)


PYTHON = Impl(_python_handles, _python_read, _python_wait, _python_transpose, _python_columns,
              _python_columns_read, _python_settle)


# --- native: the C extension -------------------------------------------------------------------

@functools.lru_cache(maxsize=1)
def opencl_library() -> str | None:
    """Path of the OpenCL library pyopencl has loaded (from /proc/self/maps), else the system's.
    Read once: the extension's init and device identification (on the worker) share it."""
    import ctypes.util

    import pyopencl

    mapped: list[str] = []
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                parts = line.split(maxsplit=5)
                if len(parts) == 6 and "libOpenCL" in os.path.basename(parts[5]):
                    path = parts[5].rstrip("\n")
                    if path not in mapped:
                        mapped.append(path)
    except OSError:
        pass
    own = os.path.dirname(os.path.abspath(pyopencl.__file__))  # wheels bundle it in pyopencl/.libs
    mapped.sort(key=lambda p: not p.startswith(own))
    return mapped[0] if mapped else ctypes.util.find_library("OpenCL")


def _reaper_off() -> bool:
    return os.environ.get("CLTRACE_REAPER", "").strip() == "0"


def _load_native() -> Impl:
    _stamps = extension("stamps")

    path = opencl_library()
    if path is None:
        raise OSError("no OpenCL library found")
    _stamps.init(path)

    def handles(events: Sequence[Any]) -> np.ndarray:
        if not isinstance(events, (list, tuple)):
            events = list(events)
        out = np.empty(len(events), np.uint64)
        _stamps.handles(events, out)
        return out

    def read(handles: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        hs = _as_handles(handles)
        status, stamps = np.empty(len(hs), np.int32), np.empty((len(hs), 4), np.int64)
        _stamps.read(hs, status, stamps)
        return status, stamps

    def columns(records: list, names: dict, cats: dict, paths: dict) -> tuple[np.ndarray, np.ndarray]:
        n = len(records)
        ints, hs = np.empty((N_COLS, n), np.int64), np.empty((2, n), np.uint64)
        _stamps.columns(records, ints, hs, names, cats, paths)
        return ints, hs

    def columns_read(records: list, names: dict, cats: dict, paths: dict) -> tuple[np.ndarray, ...]:
        n = len(records)
        ints, hs = np.empty((N_COLS, n), np.int64), np.empty((2, n), np.uint64)
        status, raw = np.empty(n, np.int32), np.empty((n, 4), np.int64)
        _stamps.columns_read(records, ints, hs, names, cats, paths, status, raw)
        return ints, hs, status, raw

    def wait(handles: np.ndarray) -> None:
        _stamps.wait(_as_handles(handles))

    global REAPER, _reaper
    if not _reaper_off():
        REAPER = True if _stamps.reaper() else None
        _reaper = _stamps if REAPER else None
    return Impl(handles, read, wait, _stamps.transpose, columns, columns_read, _stamps.settle)


REAPER: bool | None = None  # True where the reaper runs (record/_region.c then trades events for tickets), None without
_reaper: Any = None
_CHOICE = choose("reading event stamps", _load_native)
REAPER_DETAIL: str = ("launching thread harvests once its queue catches up; native thread reads the rest"
                      if REAPER else
                      "off (CLTRACE_REAPER=0: records keep their events)" if _reaper_off() else
                      "off (records keep their events until resolved)")
NATIVE: Impl | None = _CHOICE.native
WHY: str = _CHOICE.why  # why NATIVE is None ("" when it is active)
PATH: str = _CHOICE.path
DETAIL: str = _CHOICE.detail
_active = NATIVE or PYTHON


def handles(events: Sequence[Any]) -> np.ndarray:
    """uint64 ``cl_event`` handles (``ev.int_ptr``) of pyopencl Events."""
    return _active.handles(events)


def read(handles: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(status int32 (N,), stamps int64 (N, 4): QUEUED, SUBMIT, START, END) of each event.

    status 0: complete, all four stamps read; > 0: not complete yet (3 queued, 2 submitted,
    1 running); < 0: the command failed (its error status) or its stamps cannot be read (the
    OpenCL error, e.g. -7 PROFILING_INFO_NOT_AVAILABLE). Stamps are 0 unless the status is 0.
    """
    return _active.read(handles)


def wait(handles: np.ndarray) -> None:
    """Wait until every event completes or fails (GIL released); a failed one does not stop the rest."""
    _active.wait(handles)


def transpose(records: list) -> list:
    """The columns of a list of raw records (``list(zip(*records))``), as the resolver reads them."""
    return _active.transpose(records)


def columns(records: list, names: dict, cats: dict, paths: dict) -> tuple[np.ndarray, np.ndarray]:
    """The resolver's first pass: int64[N_COLS, N] (rows C_ID... C_SITE; SITE the identity of the site
    object; NAME/CAT/PATH the value's id in ``names``/``cats``/``paths``, dicts value -> id, or -1 where
    it is not there yet; THREAD 0 and flag F_BIG_THREAD where the key does not fit int64) and
    uint64[2, N] handles of ev0 and ev1 (0: none)."""
    return _active.columns(records, names, cats, paths)


def columns_read(records: list, names: dict, cats: dict, paths: dict) -> tuple[np.ndarray, ...]:
    """``columns`` and, in the same pass, ``read`` of the records' events: (ints, handles, status int32[N],
    stamps int64[N, 4]). A record with two events (a region's markers) gets one row: START is the first
    marker's END, END the second's, its status ``combined``. Rows without events, and rows holding tickets
    (``peek`` reads those), are 0. The handles are ``columns``' for tickets; rows holding Events may have
    theirs (native) or 0 (Python): nothing after this pass uses them."""
    return _active.columns_read(records, names, cats, paths)


def settle(ints: np.ndarray, hs: np.ndarray, status: np.ndarray, raw: np.ndarray, failed: np.ndarray) -> tuple[int, int, int]:
    """After ``columns_read``: the rows holding tickets get what the reaper read (``peek``; a region's two
    markers combined as ``columns_read`` combines events), in place; ``failed`` (int8[N]) 1/0 for them (the
    command failed or not), -1 for the other rows (ask the event). Returns (rows still pending: status > 0,
    rows with tickets, rows with device work)."""
    return _active.settle(ints, hs, status, raw, failed)


def wait_events(events: Sequence[Any]) -> None:
    """``wait`` on pyopencl Events: cltrace's own waits, never recorded as the program's (``instrument``)."""
    if events:
        wait(handles(events))


def track(event: Any) -> Any:
    """The ticket standing for ``event`` in a record (the reaper holds the event), or ``event`` itself
    where there is no reaper or it cannot take it."""
    if _reaper is None or event is None:
        return event
    t = _reaper.track(event)
    return event if t is None else t


def peek(tickets: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(status, stamps, failed) of tickets, as ``read`` gives them for handles; ``failed`` (bool) says the
    command failed (a negative status otherwise means its stamps cannot be read). A ticket not done yet
    can be peeked again."""
    ts = _as_handles(tickets)
    n = len(ts)
    status, st, failed = np.empty(n, np.int32), np.empty((n, 4), np.int64), np.empty(n, np.uint8)
    if n:
        _reaper.peek(ts, status, st, failed)
    return status, st, failed.astype(bool)


def wait_tickets(tickets: np.ndarray) -> None:
    """Wait until the tickets' commands complete or fail (GIL released)."""
    ts = _as_handles(tickets)
    if len(ts):
        _reaper.wait_tickets(ts)


def done(tickets: Any) -> None:
    """The records holding these tickets are resolved or dropped: their slots are freed (0s ignored)."""
    ts = _as_handles(tickets)
    if len(ts) and _reaper is not None:
        _reaper.done(ts)


def reaper_stats() -> dict[str, Any] | None:
    """The reaper's counters (tracked, reaped, read_inline, held, rounds, blocks, running), None without it."""
    return None if _reaper is None else _reaper.reaper_stats()


def stop_reaper() -> None:
    """Stop the reaper thread (at exit, after the last flush); tickets still held are read inline."""
    if _reaper is not None:
        _reaper.stop_reaper()


@contextlib.contextmanager
def events_kept() -> Iterator[None]:
    """Within: the hot path keeps commands' Events in their records instead of trading them for tickets
    (tests that resolve the same records twice; a ticket is read for one resolver)."""
    was = _reaper.pause_reaper(True) if _reaper is not None else False
    try:
        yield
    finally:
        if _reaper is not None:
            _reaper.pause_reaper(was)


def running(ref: Any) -> bool:
    """Whether the command behind a record's event or ticket is still queued or running."""
    if type(ref) is int:
        return bool(peek(np.array([ref], np.uint64))[0][0] > 0)
    return ref.command_execution_status > 0


def wait_ref(ref: Any) -> None:
    """Wait for the command behind a record's event or ticket (GIL released)."""
    if type(ref) is int:
        wait_tickets(np.array([ref], np.uint64))
    else:
        wait(handles([ref]))


__all__ = ["PATH", "DETAIL", "handles", "read", "wait", "wait_events", "transpose", "columns"]


def describe(code: int) -> str:
    """An OpenCL status or error code by name, for messages ("PROFILING_INFO_NOT_AVAILABLE (-7)")."""
    try:
        import pyopencl as cl

        for name in dir(cl.status_code):
            if not name.startswith("_") and getattr(cl.status_code, name) == code:
                return f"{name} ({code})"
    except Exception:
        pass
    return f"OpenCL error {code}"
