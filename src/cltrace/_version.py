"""The installed cltrace version, written into every trace."""
from __future__ import annotations

import functools


@functools.lru_cache(maxsize=1)
def version() -> str:
    try:
        from importlib.metadata import version as _dist_version

        return _dist_version("cltrace")
    except Exception:
        return "0+unknown"
