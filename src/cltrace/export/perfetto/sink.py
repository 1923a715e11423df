"""PerfettoTraceSink: streams spans to a ``.pftrace`` file, batch by batch.

The file is a ``perfetto.protos.Trace``: a run of ``Trace.packet`` entries appended write by
write, so a run cut off after a flush still loads up to its last complete packet. Sequence 1 (see
``wire.META_SEQ``) carries the track descriptors, the dropped-spans counter, the live device-memory
counter of each context (samples from ``TraceContext.memory``, written at each flush) and the metadata,
with absolute MONOTONIC timestamps.

By default the packets of each flush are written compressed (``compress``: one
``TracePacket.compressed_packets`` a ``CHUNK`` of packets, as Perfetto's service writes with DEFLATE),
~17 B a launch's host slice, device slice and flow against ~74 B plain (``compress`` says which
compressor, at what cost), by a ``Packer`` thread so the
worker goes on meanwhile; the first packets (clock snapshot, descriptors, metadata) stay plain, and a
killed run still reads up to its last flush.
"""
from __future__ import annotations

import json
import os
import time
from typing import IO, Any

import numpy as np

from ...record.memory import counter_name
from ...timeline.batch import SpanBatch, as_batch
from ..base import TraceContext, abandon_file, close_synced, open_trace_file, start_writeback
from ..processes import program_name
from . import encoder, messages
from .compress import packed
from .packer import Packer
from .fused import FusedWriter
from .order import HoldBack
from .packets import encode
from .rows import batch_rows
from .tracks import Tracks
from .wire import BOOTTIME, DROPPED_TRACK, META_SEQ, METADATA_EVENT, MONOTONIC


class PerfettoTraceSink:
    """Streams spans to a Perfetto ``.pftrace`` file (layout: see the ``cltrace.export.perfetto`` package)."""

    CHUNK = 1 << 20  # raw bytes packed into one compressed packet at most (a flush packs what it has)
    # What a killed run may lose at most, beyond what the worker has not resolved yet: the packets of
    # the spans written are packed and on their way to the disk at least this often.
    FLUSH_S = 0.25

    def __init__(self, path: str | os.PathLike[str], flush_every: int = 65536, compress: bool = True) -> None:
        self.path = os.fspath(path)
        self.flush_every = flush_every
        self.compress = compress
        self._raw: list[bytes] = []  # packets waiting to be packed (compress)
        self._raw_n = 0
        self._flush_by = float("inf")  # set at the first flush: start() writes the first packets
        self._packer: Packer | None = None
        self._fh: IO[bytes] | None = None
        self._tracks = Tracks(None, 0)  # replaced at start, when the recorder's tracks are known
        self._hold = HoldBack()
        self._fused: FusedWriter | None = None  # the C pass, where the active row encoder carries it
        self._dropped_uuid = 0
        self._dropped_written = -1
        self._memory: Any = None
        self._memory_at = (-1, 0)  # position in the recorder's memory samples
        self._memory_first: list[tuple[int, int, int]] = []  # live bytes when the sink started
        self._memory_tracks: dict[int, int] = {}  # context key -> counter track uuid
        self._since_flush = 0
        self._synced = 0  # file offset up to which writeback was started
        self._clocks_written = ""
        self._clock = time.perf_counter_ns
        self.bytes_written = 0
        self.packets_written = 0

    def start(self, ctx: TraceContext) -> None:
        if self._fh is not None:
            return
        self._tables = ctx.tables
        self._memory = ctx.memory
        if self._memory is not None:
            self._memory_at, self._memory_first = self._memory.open()
        self._clock = ctx.now_ns  # a merged trace ends at its last span
        tracks = self._tracks = Tracks(ctx.tracks, _mono_offset(), ctx.process_names)
        native = encoder.NATIVE
        self._fused = FusedWriter(native, tracks) if native is not None else None
        self._fh = open_trace_file(self.path)
        if self.compress:
            self._packer = Packer(self._fh, packed, self._count)
        boot = getattr(time, "CLOCK_BOOTTIME", None)
        if getattr(ctx, "replay", False):
            # A merge's spans: this host's BOOTTIME now says nothing of their times, nor does any one host's for
            # several. Trace processor needs the two related all the same, so a fixed relation (equal), which
            # keeps a merged file the same bytes for the same inputs.
            clocks = [(MONOTONIC, ctx.start_ns, False), (BOOTTIME, ctx.start_ns, False)]
        elif boot is not None:  # lets the trace line up with system traces (BOOTTIME)
            m0 = time.monotonic_ns()
            b = time.clock_gettime_ns(boot)
            m1 = time.monotonic_ns()
            clocks = [(MONOTONIC, (m0 + m1) // 2, False), (BOOTTIME, b, False)]
        else:
            clocks = [(MONOTONIC, time.monotonic_ns(), False)]
        out = [messages.sequence_start(META_SEQ, clocks, MONOTONIC, MONOTONIC)]
        pid = ctx.tracks.pid
        name = ctx.process_names.get(pid) or program_name()
        out.append(messages.descriptor(tracks.process_uuid, process=messages.process(pid, name)))
        self._dropped_uuid = tracks.new_uuid()
        out.append(messages.descriptor(self._dropped_uuid, name=DROPPED_TRACK, parent=tracks.process_uuid,
                                       unit=messages.UNIT_COUNT))
        early = {k: v for k, v in ctx.metadata().items() if k not in ("dropped_spans", "recorded_spans")}
        out.append(self._metadata_packet(early))
        self._write(b"".join(out))  # plain: a reader without inflate still finds the clocks and tracks
        self._fh.flush()
        self._flush_by = time.monotonic() + self.FLUSH_S

    def write(self, batch: SpanBatch) -> None:
        if self._fh is None or not batch:
            return
        head: list[bytes] = []
        batch = as_batch(batch, self._tables)
        if self._fused is not None:
            parts, packets = self._fused.write(batch, head)
            self.packets_written += packets
            for part in (b"".join(head), *parts):
                self._emit(part)
        else:
            rows, extras, arrivals = batch_rows(batch, self._tracks, self._hold, head)
            rows, now = self._hold.hold_back(rows, extras, arrivals)
            self._emit(b"".join(head))
            self._emit(self._encode(rows, extras, now))
        self._since_flush += len(batch)
        if self._since_flush >= self.flush_every or time.monotonic() >= self._flush_by:
            self._flush_os()

    def flush(self, meta: dict[str, Any]) -> None:
        if self._fh is None:
            return
        out = self._dropped(int(meta.get("dropped_spans", 0))) + self._memory_packets()
        clocks = json.dumps([meta.get("clocks"), meta.get("devices")], default=str, sort_keys=True)
        if clocks != self._clocks_written:  # a trace cut off later still carries the calibration
            self._clocks_written = clocks
            # Without the final counts: a reader takes "recorded_spans" as the sign the file was closed.
            out += self._metadata_packet({k: v for k, v in meta.items() if k not in ("dropped_spans", "recorded_spans")})
        self._emit(out)
        self._flush_os()

    def close(self, meta: dict[str, Any]) -> None:
        fh = self._fh
        if fh is None:
            return
        if self._fused is not None:
            parts, packets = self._fused.drain()
            self._fused = None  # its scratch (a few MB at 16k-span batches) goes with it
            self.packets_written += packets
            self._emit(b"".join(parts))
        else:
            held = self._hold.drain()
            if held is not None:
                self._emit(self._encode(*held))
        self._emit(self._dropped(int(meta.get("dropped_spans", 0))) + self._memory_packets()
                   + self._metadata_packet(meta))
        self._pack()
        if self._packer is not None:
            self._packer, packer = None, self._packer
            packer.close()
        close_synced(fh)
        self._fh = None

    def _flush_os(self) -> None:
        self._since_flush = 0
        self._flush_by = time.monotonic() + self.FLUSH_S
        self._pack()
        if self._packer is not None:
            self._packer.wait()
        self._fh.flush()  # type: ignore[union-attr]
        self._synced = start_writeback(self._fh, self._synced)  # type: ignore[arg-type]

    def abandon(self) -> None:
        """In a forked child: the file is the parent's; drop it unwritten (``base.abandon_file``)."""
        abandon_file(self._fh)
        self._fh = None
        self._fused = None
        self._raw, self._raw_n = [], 0
        if self._packer is not None:
            self._packer.abandon()
            self._packer = None

    def _encode(self, rows: np.ndarray, extras: list[bytes], select: np.ndarray | None = None) -> bytes:
        data, packets = encode(self._tracks, rows, extras, select)
        self.packets_written += packets
        return data

    def _now(self) -> int:
        return self._clock() + self._tracks.mono

    def _dropped(self, n: int) -> bytes:
        if n == self._dropped_written:
            return b""
        self._dropped_written = n
        return messages.counter(self._now(), self._dropped_uuid, n)

    def _memory_packets(self) -> bytes:
        """Live device-memory samples not written yet, on a counter track per context."""
        ledger = self._memory
        if ledger is None:
            return b""
        samples, self._memory_at = ledger.since(self._memory_at)
        if self._memory_first:
            samples, self._memory_first = self._memory_first + samples, []
        out = []
        tracks = self._memory_tracks
        mono = self._tracks.mono
        for t, key, live in samples:
            uuid = tracks.get(key)
            if uuid is None:
                uuid = tracks[key] = self._tracks.new_uuid()
                out.append(messages.descriptor(uuid, name=counter_name(ledger.label(key)),
                                               parent=self._tracks.process_uuid, unit=messages.UNIT_SIZE_BYTES))
            out.append(messages.counter(t + mono, uuid, live))
        return b"".join(out)

    def _metadata_packet(self, meta: dict[str, Any]) -> bytes:
        text = json.dumps(meta, default=str, ensure_ascii=False)
        return messages.instant(self._now(), self._tracks.process_uuid, METADATA_EVENT, "cltrace", [("json", text)])

    def _emit(self, data: bytes) -> None:
        """Whole packets to the file, or to the next compressed packet."""
        if not data:
            return
        if not self.compress:
            self._write(data)
            return
        self._raw.append(data)
        self._raw_n += len(data)
        if self._raw_n >= self.CHUNK:
            self._pack()

    def _pack(self) -> None:
        """The packets waiting for compression, handed to the packer as one compressed packet."""
        if self._raw:
            raw = self._raw[0] if len(self._raw) == 1 else self._raw  # joined by the packer (compress.packed)
            self._raw, self._raw_n = [], 0
            self._packer.submit(raw)  # type: ignore[union-attr]

    def _write(self, data: bytes) -> None:
        self._fh.write(data)  # type: ignore[union-attr]
        self._count(len(data))

    def _count(self, n: int) -> None:
        self.bytes_written += n


def _mono_offset() -> int:
    """MONOTONIC - perf_counter_ns: zero where both read CLOCK_MONOTONIC (Linux)."""
    if time.get_clock_info("perf_counter").implementation == time.get_clock_info("monotonic").implementation:
        return 0
    samples = []
    for _ in range(9):
        p0 = time.perf_counter_ns()
        m = time.monotonic_ns()
        p1 = time.perf_counter_ns()
        samples.append((p1 - p0, m - (p0 + p1) // 2))
    return min(samples)[1]

