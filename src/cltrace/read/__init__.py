"""Read: trace files (.json, .pftrace) back into spans and metadata.

May import ``export`` (for the format definitions it reads), ``timeline`` and ``errors``.
"""
from __future__ import annotations

from .load import detect, load, load_columns

__all__ = ["detect", "load", "load_columns"]
