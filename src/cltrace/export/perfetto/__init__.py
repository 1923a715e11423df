"""Perfetto protobuf (``.pftrace``): a streaming writer and a reader for what it writes.

A span is a TYPE_SLICE_BEGIN/END pair on its host thread's track and, where it ran on a device,
another on its device queue's track; flows (varint ids: the span id) join a launch's host slice to
its device slice. Each track writes on its own packet sequence with interned names and an
incremental clock. Natively a batch's columns become bytes in one C pass (``fused``, ``cltrace._ext.writer``);
otherwise they become packet rows column by column with numpy on interned ids, and the rows bytes
with numpy: the same bytes either way.

Modules, in the order the data goes: ``tracks`` (descriptors, sequences, interning), ``fused`` (the C
pass and what Python gives it); its numpy twin: ``rows`` (spans to packet rows), ``order`` (hold-back
and tie-breaking that keep slices nested across batches), ``packets`` (runs per sequence), ``layout``
(rows to bytes); ``encoder`` (whether ``fused`` or the numpy twin runs); ``compress`` (isal or zlib); ``wire`` (field tags and
shared names), ``messages`` (descriptors, clock snapshots, counters and metadata, built by hand: writing
imports no protobuf), ``sink`` (the SpanSink; ``cltrace.read.perfetto`` reads it back).
"""
from .sink import PerfettoTraceSink
from .wire import (A_DEV_END, A_DEV_START, A_ERROR, A_PARENT, A_SPAN, A_STATUS, BEGIN, BOOTTIME, COUNTER,
                   DROPPED_TRACK, END, HOST_CLOCK, INSTANT, META_SEQ, METADATA_EVENT, MONOTONIC)

__all__ = ["PerfettoTraceSink", "A_DEV_END", "A_DEV_START", "A_ERROR", "A_PARENT",
           "A_SPAN", "A_STATUS", "BEGIN", "BOOTTIME", "COUNTER", "DROPPED_TRACK", "END", "HOST_CLOCK", "INSTANT",
           "META_SEQ", "METADATA_EVENT", "MONOTONIC"]
