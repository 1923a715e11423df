"""cltrace spans as the collector's ClickHouse exporter would store them, a column at a time.

The exporter stores what cltrace's OTLP export sends (``export/otlp/mapping.Mapper``): one row per
span, ``Timestamp`` the span's start, ``Duration`` end - start in ns, the span's attributes and
events, the resource attributes and ``ServiceName`` of its process. This module runs that same
``Mapper`` over a file's spans, so the file path and the OTLP path share one mapping, but only once
per *attribute set*: the rows that share category, thread, path, name, queue, record attributes,
call site and error text share every attribute but the two per-span ones
(``cltrace.host.duration_ns`` and ``cltrace.device.duration_ns``). Everything per row (times, ids,
durations) is numpy columns; ClickHouse joins the two (``load``), so no Python object is made per span.

Ids: a file has no OTLP trace id, so one is derived from the file's content hash (and the span-id
salt with it): loading a file again gives the same ids. The ``cltrace.run`` root span that the OTLP
sink sends at close is made from the file's metadata (``Mapper.root``).
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import numpy as np

from ..export.otlp.mapping import Mapper, attr_value
from ..record import job
from ..timeline.batch import SpanBatch
from . import values

PER_ROW = ("cltrace.host.duration_ns", "cltrace.device.duration_ns")
SCOPE_NAME = "cltrace"


class _Tracks:
    """What ``Mapper`` asks of a ``TrackRegistry``, rebuilt from a file's ``tracks`` and ``devices``."""

    def __init__(self, meta: dict[str, Any]) -> None:
        devs = meta.get("devices") or {}
        self.devices = {uid: SimpleNamespace(name=d.get("name", "?"), platform=d.get("platform", "?"))
                        for uid, d in devs.items() if isinstance(d, dict)}
        by_name = {d.name: uid for uid, d in self.devices.items()}
        self._tracks = {}
        for key, info in (meta.get("tracks") or {}).items():
            try:
                tid = int(key)
            except ValueError:
                continue
            process = (info or {}).get("process") or ""
            dev = process[len("OpenCL: "):] if process.startswith("OpenCL: ") else None
            self._tracks[tid] = SimpleNamespace(name=(info or {}).get("name") or f"track {tid}",
                                                device=by_name.get(dev) if dev else None)

    def get(self, tid: int) -> Any:
        return self._tracks[tid]


class FileRun:
    """What ``Mapper`` reads of a recorder, from a trace file's metadata."""

    def __init__(self, meta: dict[str, Any]) -> None:
        self.start_ns = int(meta.get("start_ns") or 0)
        self.start_unix_ns = int(meta.get("start_unix_ns") or self.start_ns)
        self.tracks = _Tracks(meta)
        self.steps = None


def ids_of(file_hash: str) -> tuple[int, int]:
    """(trace id, span-id salt) of a file, from its content hash."""
    d = hashlib.blake2b(file_hash.encode(), digest_size=20).digest()
    return int.from_bytes(d[:16], "big") or 1, int.from_bytes(d[16:], "big") or 1


def resource(meta: dict[str, Any], service_name: str | None = None, extra: dict[str, Any] | None = None) -> dict[str, str]:
    """Resource attributes of a file's process, as its OTLP export names them (``export/otlp/resource``),
    as far as the file records them; ``extra`` over them (``cltrace.run.id``/``cltrace.rank`` given
    when loading). The devices are on the ``cltrace.run`` root span (``Mapper.root``), not here."""
    attrs: dict[str, Any] = {"service.name": service_name or "cltrace"}
    host = meta.get("host") or {}
    if isinstance(host, dict) and host.get("name"):
        attrs["host.name"] = host["name"]
    if meta.get("pid") is not None:
        attrs["process.pid"] = meta["pid"]
    if meta.get("cltrace.version"):
        attrs["cltrace.version"] = meta["cltrace.version"]
    if meta.get("start_unix_ns") is not None and meta.get("start_ns") is not None:
        attrs["cltrace.host.unix_offset_ns"] = int(meta["start_unix_ns"]) - int(meta["start_ns"])
    j = meta.get("job")
    if isinstance(j, dict):
        attrs.update(job.resource_attributes(j))
    attrs.update(extra or {})
    return values.attributes({k: v for k, v in ((k, attr_value(v)) for k, v in attrs.items()) if v is not None})


@dataclass
class Sets:
    """The distinct attribute sets of a batch: per set the span name, attributes (strings, without the
    per-row ones), status code and message; ``row_set`` gives each row's set."""

    row_set: np.ndarray
    names: list[str]
    attrs: list[dict[str, str]]
    codes: list[str]
    messages: list[str]


def _dense(col: np.ndarray) -> tuple[np.ndarray, int]:
    """Each value's rank among the column's distinct values, and how many there are (``np.unique``'s
    inverse). Integers over a range not much wider than the column are ranked by a presence table: no sort."""
    col = np.asarray(col).reshape(-1)
    if col.dtype.kind in "iu" and col.size:
        lo, hi = int(col.min()), int(col.max())
        if hi - lo <= 4 * col.size + 1024:
            at = (col - lo).astype(np.intp)
            present = np.zeros(hi - lo + 1, bool)
            present[at] = True
            rank = np.cumsum(present, dtype=np.int64) - 1
            return rank[at], int(rank[-1]) + 1
    u, inv = np.unique(col, return_inverse=True)
    return inv.astype(np.int64).reshape(-1), len(u)


def attribute_sets(batch: SpanBatch, mapper: Mapper) -> Sets:
    """Group rows by everything their attributes depend on; map one row of each group."""
    n = batch.n
    err = np.zeros(n, np.int64)
    if batch.errors:
        texts: dict[str, int] = {}
        for i, e in batch.errors.items():
            err[i] = texts.setdefault(e, len(texts) + 1)
    # Mixed-radix codes of the columns' ranks, in their order: ranked again only where the product of the
    # counts would pass int64 (once at the end in practice), not after every column.
    key, size = np.zeros(n, np.int64), 1
    for col in (batch.cat, batch.thread, batch.path, batch.name, batch.track, batch.attrs_ids(), batch.site,
                batch.status, err):
        dense, k = _dense(np.asarray(col))
        if size * k >= 1 << 62:
            key, size = _dense(key)
        key, size = key * k + dense, size * k
    key, _ = _dense(key)
    first = np.full(int(key.max()) + 1 if n else 0, n, np.int64)
    np.minimum.at(first, key, np.arange(n))
    names, attrs, codes, messages = [], [], [], []
    for i in first.tolist():
        name, _sid, _pid, _start, _end, a, _ev, code, msg = mapper.convert(batch[i])
        names.append(name)
        attrs.append(values.attributes({k: v for k, v in a.items() if k not in PER_ROW}))
        codes.append(values.STATUS_CODES[code])
        messages.append(msg or "")
    return Sets(key, names, attrs, codes, messages)


def columns(batch: SpanBatch, mapper: Mapper, rows: slice) -> dict[str, np.ndarray]:
    """The per-row columns of ``rows``: times (Unix ns), ids, durations, device stamps."""
    off = mapper.offset
    hb, he = batch.host_begin[rows], batch.host_end[rows]
    dev = batch.track[rows] != 0
    de = batch.dev_end[rows]
    start = hb + off
    end = np.where(dev, np.maximum(he, de), he) + off
    key = np.uint64(mapper.key)
    return {
        "Ts": start, "Dur": (end - start).astype(np.uint64),
        "Sid": batch.id[rows].astype(np.uint64) ^ key, "Pid": batch.parent[rows].astype(np.uint64) ^ key,
        "HasParent": np.ones(len(hb), np.uint8), "HostDur": he - hb, "Dev": dev.astype(np.uint8),
        "DevDur": np.where(dev, batch.raw_end[rows] - batch.raw_start[rows], 0),
        "Q": np.where(dev, batch.dev_queued[rows] + off, 0), "Su": np.where(dev, batch.dev_submit[rows] + off, 0),
        "St": np.where(dev, batch.dev_start[rows] + off, 0), "En": np.where(dev, de + off, 0),
    }
