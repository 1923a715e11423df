"""cltrace._ext: the one C extension, its stated interface. Each stage of the data path is a sub-module
here with a pure-Python reference beside it; cltrace/_native.py picks one of the two per stage.

Built from src/cltrace/_ext.c (the module) and the stages' own .c files; _ext.h holds the layouts shared
with Python (the constants below, which tests/test_native_layout.py holds equal to Python's copies).
Arrays are passed as contiguous buffers (numpy arrays; ``_Buffer`` below) and filled in place where the
name says ``out``; the C side checks their sizes and raises ValueError naming what does not fit.
"""
from types import ModuleType
from typing import Any, Callable, Iterator, TypeAlias

_Buffer: TypeAlias = Any  # a contiguous buffer (a numpy array of the dtype the stage's Python side passes)

# A raw record (a tuple of N_FIELDS, as the hot path appends it): timeline/raw.py's R_*.
R_CAT: int
R_NAME: int
R_ID: int
R_PARENT: int
R_PATH: int
R_THREAD: int
R_HB: int
R_HE: int
R_QUEUE: int
R_EV0: int
R_EV1: int
R_ATTRS: int
R_STATUS: int
R_ERROR: int
R_SITE: int
N_FIELDS: int
# The resolver's int64 columns of a batch of records: timeline/stamps.py's C_*.
C_ID: int
C_PARENT: int
C_HB: int
C_HE: int
C_QUEUE: int
C_PATH: int
C_THREAD: int
C_NAME: int
C_CAT: int
C_FLAGS: int
C_SITE: int
N_COLS: int
# Bits of the C_FLAGS column: timeline/stamps.py's F_*.
F_DEV: int
F_TWO: int
F_ERROR: int
F_ATTRS: int
F_BIG_THREAD: int
F_TICKETS: int


class _Stamps(ModuleType):
    """timeline/_stamps.c (+ _reaper.c, _opencl.c): event stamps in bulk, the reaper thread. Python: timeline/stamps.py."""

    def init(self, path: str, /) -> None: ...
    def handles(self, events: list[Any] | tuple[Any, ...], out: _Buffer, /) -> None: ...
    def read(self, handles: _Buffer, status: _Buffer, stamps: _Buffer, /) -> None: ...
    def wait(self, handles: _Buffer, /) -> None: ...
    def transpose(self, records: list[tuple[Any, ...]], /) -> list[tuple[Any, ...]]: ...
    def columns(self, records: list[tuple[Any, ...]], ints: _Buffer, handles: _Buffer, names: dict[Any, int],
                cats: dict[Any, int], paths: dict[Any, int], /) -> None: ...
    def columns_read(self, records: list[tuple[Any, ...]], ints: _Buffer, handles: _Buffer, names: dict[Any, int],
                     cats: dict[Any, int], paths: dict[Any, int], status: _Buffer, stamps: _Buffer, /) -> None: ...
    def settle(self, ints: _Buffer, handles: _Buffer, status: _Buffer, stamps: _Buffer, failed: _Buffer,
               /) -> tuple[int, int, int]: ...
    def reaper(self) -> bool: ...
    def track(self, event: Any, /) -> int | None: ...
    def peek(self, tickets: _Buffer, status: _Buffer, stamps: _Buffer, failed: _Buffer, /) -> None: ...
    def wait_tickets(self, tickets: _Buffer, /) -> None: ...
    def done(self, tickets: _Buffer, /) -> None: ...
    def reaper_stats(self) -> dict[str, int]: ...
    def pause_reaper(self, on: bool, /) -> bool: ...
    def reaper_config(self, min_ns: int, max_ns: int, harvest_every: int = ..., quiet_ns: int = ..., stale_ns: int = ...,
                      shared_hold_ns: int = ..., spin_ns: int = ..., /) -> tuple[int, ...]: ...
    def stop_reaper(self) -> None: ...


class _Extents:
    def __len__(self) -> int: ...
    def nest(self, kind: _Buffer, ids: _Buffer, parent: _Buffer, track: _Buffer, off: _Buffer, off_end: _Buffer,
             raw_start: _Buffer, raw_end: _Buffer, /) -> None: ...


class _Resolve(ModuleType):
    """timeline/_resolve.c: the resolver's passes over whole columns. Python: timeline/passes.py, Resolver._columns (timeline/resolve.py)."""

    Extents: type[_Extents]

    def group(self, keys: _Buffer, width: int, first: _Buffer, inverse: _Buffer, /) -> int: ...
    def first_fit(self, starts: _Buffer, ends: _Buffer, room: _Buffer, used: int, lanes: _Buffer, /) -> int: ...
    def scan(self, ints: _Buffer, status: _Buffer, raw: _Buffer, lut: _Buffer, groups: _Buffer, /) -> Any: ...
    def finish(self, *, ints: _Buffer, status: _Buffer, raw: _Buffer, lut: _Buffer, groups: _Buffer,
               thread_track: _Buffer, site_id: _Buffer, queue_track: _Buffer, queue_clock: _Buffer,
               queue_lane: _Buffer, path_id: _Buffer, clocks: list[tuple[Any, ...]], extents: _Extents,
               out64: _Buffer, name: _Buffer, cat: _Buffer, path: _Buffer, site: _Buffer,
               status_out: _Buffer) -> None: ...
    def field(self, records: list[tuple[Any, ...]], index: int, lo: int, hi: int, /) -> list[Any]: ...


class _Table:
    def grow(self, slots: int, /) -> None: ...
    def add(self, lut: _Buffer, path: _Buffer, cat: _Buffer, host_begin: _Buffer, host_end: _Buffer,
            dev_start: _Buffer, dev_end: _Buffer, track: _Buffer, status: _Buffer, /) -> list[int]: ...
    def series(self, slot: int, device: bool, /) -> tuple[int, int, int, int, bytes]: ...
    def entry(self, slot: int, /) -> tuple[int, int]: ...


class _Stats(ModuleType):
    """timeline/_stats.c: per-path statistics over whole batches. Python: timeline/stats.py."""

    RESERVOIR: int
    Table: type[_Table]


class _Region:
    name: Any
    queue: Any
    attrs: dict[str, Any] | None
    cat: Any
    project: bool

    def __init__(self, name: Any, queue: Any = ..., attrs: Any = ..., cat: Any = ...) -> None: ...
    def __enter__(self) -> "_Region": ...
    def __exit__(self, *exc: Any) -> None: ...
    def set(self, key: str, value: Any, /) -> None: ...


class _Gate:
    __wrapped__: Callable[..., Any]
    hook: Callable[..., Any]

    def __init__(self, original: Callable[..., Any], hook: Callable[..., Any], /) -> None: ...
    def __call__(self, *args: Any, **kwargs: Any) -> Any: ...


class _RegionModule(ModuleType):
    """record/_region.c: region enter/exit, launch and call sites on the hot path. Python: record/regions.py,
    record/callsite.py."""

    NATIVE_CLOCK: int
    Region: type[_Region]
    Gate: type[_Gate]

    def init(self, tls: Any, ids: Iterator[int], pending: Any, recorder: Any, marker: Any, decorate: Any,
             status_error: Any, region_cat: Any, per_os_thread: bool, reaper: bool = False, /) -> None: ...
    def push(self, rec: tuple[Any, ...], /) -> None: ...
    def record_launch(self, name: Any, queue: Any, event: Any, host_begin: int, host_end: int, cat: Any, attrs: Any,
                      site: Any, /) -> int: ...
    def launch(self, kernel: Any, queue: Any, global_size: Any, local_size: Any, *args: Any, wait_for: Any = None,
               name: str | None = None) -> Any: ...
    def launch_init(self, state: Any, kernels: dict[Any, Any], attrs_cache: dict[Any, Any], launch_py: Any,
                    launch_attrs: Any, failed_launch: Any, cl_error: Any, kernel_cat: str, /) -> None: ...
    def own(self) -> bool: ...
    def set_own(self, flag: bool, /) -> bool: ...
    def now(self) -> int: ...
    def site(self, skip: int = 1, /) -> tuple[Any, ...] | None: ...
    def site_config(self, classify: Callable[[Any], bool], generation: int, depth: int, /) -> None: ...


class _Chrome(ModuleType):
    """export/_chrome.c: Chrome JSON event lines of a whole batch. Python: ``chrome_lines.encode_python`` on the
    rows export/chrome.py prepares."""

    def scan(self, cols: Any, luts: Any, ncat: int, attrs: Any, attrs_out: _Buffer, /) -> tuple[Any, Any, Any, Any]: ...
    def fill(self, out: _Buffer, at: int, start: int, stop: int, base: int, cols: Any, luts: Any, ncat: int,
             tables: Any, fd: int = ..., /) -> tuple[int, int, int]: ...


class _Writer:
    def prepare(self, attrs: list[Any], thread: _Buffer, status: _Buffer, site: _Buffer, cat: _Buffer, name: _Buffer,
                track: _Buffer, deep: Any, errors: Any, /) -> tuple[list[int], list[int], list[Any], list[Any]]: ...
    def write(self, *, id: _Buffer, parent: _Buffer, cat: _Buffer, thread: _Buffer, host_begin: _Buffer,
              host_end: _Buffer, track: _Buffer, dev_start: _Buffer, dev_end: _Buffer, raw_start: _Buffer,
              raw_end: _Buffer, leaf: _Buffer, region: _Buffer, hpids: _Buffer, dpids: _Buffer, extras: list[bytes],
              counters: _Buffer, pool: _Buffer, pool_off: _Buffer, pool_len: _Buffer, consts: _Buffer,
              mono: int) -> tuple[bytes, list[int], dict[int, int], int]: ...
    def drain(self, pool: _Buffer, pool_off: _Buffer, pool_len: _Buffer, consts: _Buffer, mono: int,
              /) -> tuple[bytes, list[int], dict[int, int], int]: ...
    def track(self, id: int, tail: int, h_span: int, h_parent: int, h_dev_start: int, h_dev_end: int, /) -> None: ...


class _WriterModule(ModuleType):
    """export/perfetto/_writer.c: a batch's columns to .pftrace packets in one pass. Python: export/perfetto/rows.py,
    order.py, packets.py, layout.py (driven by export/perfetto/fused.py where this runs)."""

    NCONSTS: int
    Writer: type[_Writer]


class _Scan(ModuleType):
    """read/_scan.c: cltrace's own trace files into columns. Python: the general readers (read/chrome.py, perfetto.py)."""

    def chrome(self, data: _Buffer, /) -> Any: ...
    def chrome_open(self) -> Any: ...
    def chrome_feed(self, state: Any, data: _Buffer, last: bool, /) -> Any: ...
    def pftrace(self, data: _Buffer, /) -> Any: ...
    def pftrace_open(self) -> Any: ...
    def pftrace_feed(self, state: Any, data: _Buffer, /) -> Any: ...
    def compressed(self, data: _Buffer, /) -> Any: ...
    def field_numbers(self) -> dict[str, int | tuple[int, ...]]: ...


stamps: _Stamps
resolve: _Resolve
stats: _Stats
region: _RegionModule
chrome: _Chrome
writer: _WriterModule
scan: _Scan
