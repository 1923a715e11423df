"""Exporters: sinks that receive resolved spans (see base.SpanSink)."""
from .base import SpanSink
from .chrome import ChromeTraceSink

__all__ = ["SpanSink", "ChromeTraceSink"]
