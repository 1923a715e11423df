"""Which row encoder turns packet rows into bytes: the C extension ``_packets`` or the numpy fallback.

Both take the same arrays and give the same bytes (``layout.encode_rows`` documents the rules); with it
goes ``fill_rows``, which lays a batch's columns out as packet rows (the same rows either way). The C
ones write every row in one pass without the GIL; where it is not built (no compiler at install
time) or ``CLTRACE_NATIVE=0``, the numpy one runs. ``PATH`` says which ("native" or "python").
The native choice also carries ``_writer`` (``encode_rows.writer``), with which the sink skips packet rows
altogether (``fused``): where ``encode_rows`` is the numpy one, the sink runs the numpy path whole.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from ..._native import choose, extension

from .columns import NCOLS
from .layout import NCONSTS, RUN_COLS, Strings, encode_rows as _python_encode_rows, fill_rows as _python_fill_rows

EncodeRows = Callable[[np.ndarray, np.ndarray, np.ndarray, int, np.ndarray, Strings, Strings], bytes]
FillRows = Callable[..., None]


def _load_native() -> EncodeRows:
    _packets = extension(__package__, "_packets")
    built = (_packets.NCOLS, _packets.RUN_COLS, _packets.NCONSTS)
    if built != (NCOLS, RUN_COLS, NCONSTS):
        raise ImportError(f"C extension built for another row layout {built}: reinstall cltrace")
    _writer = extension(__package__, "_writer")
    if _writer.NCONSTS != NCONSTS:
        raise ImportError("C extension _writer built for another row layout: reinstall cltrace")

    def encode_rows(rows: np.ndarray, perm: np.ndarray, runs: np.ndarray, mono: int, consts: np.ndarray,
                    pool: Strings, extras: Strings) -> bytes:
        return _packets.encode(np.ascontiguousarray(rows, np.int64), np.ascontiguousarray(perm, np.int64), runs, mono,
                               consts, *pool, *extras)

    def fill_rows(rows: np.ndarray, *cols: np.ndarray) -> None:
        _packets.fill(rows, *(c if i == 7 else np.ascontiguousarray(c, np.int64) for i, c in enumerate(cols)))

    encode_rows.fill = fill_rows  # type: ignore[attr-defined]
    encode_rows.writer = _writer  # type: ignore[attr-defined]
    return encode_rows


PYTHON: EncodeRows = _python_encode_rows
_CHOICE = choose("the .pftrace row encoder", _load_native)
NATIVE: EncodeRows | None = _CHOICE.native
WHY: str = _CHOICE.why  # why NATIVE is None ("" when it is active)
PATH: str = _CHOICE.path
DETAIL: str = _CHOICE.detail
encode_rows: EncodeRows = NATIVE or PYTHON
# A batch's rows from its columns (``layout.fill_rows`` documents them): C, or numpy; the same rows.
fill_rows: FillRows = NATIVE.fill if NATIVE is not None else _python_fill_rows  # type: ignore[attr-defined]

__all__ = ["PATH", "DETAIL", "WHY", "NATIVE", "PYTHON", "encode_rows", "fill_rows"]
