"""Which path turns a batch into .pftrace packets: the C pass (``cltrace._ext.writer``, driven by ``fused``)
or the numpy path (``rows`` lays the batch out as packet rows with ``layout.fill_rows``, ``layout.encode_rows``
turns them into bytes). Both give the same bytes (tests/test_perfetto_native.py pins whole files); where the
C extension is not built (no compiler at install time) or ``CLTRACE_NATIVE=0``, the numpy path runs.
``PATH`` says which ("native" or "python").
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ..._native import choose, extension

from .layout import NCONSTS, Strings, encode_rows as _python_encode_rows, fill_rows as _python_fill_rows

EncodeRows = Callable[[np.ndarray, np.ndarray, np.ndarray, int, np.ndarray, Strings, Strings], bytes]
FillRows = Callable[..., None]


def _load_native() -> Any:
    writer = extension("writer")
    if writer.NCONSTS != NCONSTS:
        raise ImportError("C extension built for another row layout: reinstall cltrace")
    return writer


_CHOICE = choose("the .pftrace writer", _load_native)
NATIVE: Any = _CHOICE.native  # the C writer (``_ext.writer``: ``fused.FusedWriter`` drives it), or None
WHY: str = _CHOICE.why  # why NATIVE is None ("" when it is active)
PATH: str = _CHOICE.path
DETAIL: str = _CHOICE.detail
# The numpy path's two steps (``layout`` documents the rows and their bytes).
encode_rows: EncodeRows = _python_encode_rows
fill_rows: FillRows = _python_fill_rows

__all__ = ["PATH", "DETAIL", "WHY", "NATIVE", "encode_rows", "fill_rows"]
