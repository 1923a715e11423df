"""Merge: trace files of several processes into one trace, one process per pid on one timeline.

May import ``read`` (the loaders), ``export`` (the writers), ``timeline`` and ``errors``.
"""
from __future__ import annotations

from .merge import FORMATS, MergeResult, merge

__all__ = ["FORMATS", "MergeResult", "merge"]
