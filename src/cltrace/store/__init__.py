"""Store: spans in ClickHouse, in the OpenTelemetry Collector ClickHouse exporter's schema.

Embedded by default (chDB in this process, at a folder), or any ClickHouse server or cluster over
HTTP; the same SQL runs on both (``connect``). ``schema`` applies the exporter's own DDL; ``rows`` and
``load`` write cltrace's trace files as the exporter writes OTLP spans, so rows a collector wrote
and rows cltrace loaded are read by one analysis; ``questions/`` are that analysis, one SQL question
per module, run inside ClickHouse (only aggregates come back); ``store.Store`` is the facade.
May import ``read``, ``export``, ``record``, ``timeline`` and ``analyze``.
"""
from __future__ import annotations

from .connect import StoreError
from .store import Store

__all__ = ["Store", "StoreError"]
