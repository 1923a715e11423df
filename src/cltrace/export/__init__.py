"""Export: sinks that receive resolved spans (see ``base.SpanSink``) and write Chrome JSON, Perfetto, OTLP.

Sinks know spans and tracks, never events, queues or the recorder's internals: what they read about the
trace is ``base.TraceContext``. May import ``timeline``,
``record`` (never imported by it) and the top-level ``errors``/``_version``.
"""
from .base import FixedTrace, SpanSink, TraceContext
from .chrome import ChromeTraceSink

__all__ = ["SpanSink", "TraceContext", "FixedTrace", "ChromeTraceSink"]
