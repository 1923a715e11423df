"""Which row encoder turns packet rows into bytes: the C extension ``_packets`` or the numpy fallback.

Both take the same arrays and give the same bytes (``layout.encode_rows`` documents the rules). The C
one writes every row in one pass without the GIL; where it is not built (no compiler at install
time) or ``CLTRACE_NATIVE=0``, the numpy one runs. ``PATH`` says which ("native" or "python").
"""
from __future__ import annotations

import importlib
import logging
import os
from typing import Callable

import numpy as np

from .columns import NCOLS
from .layout import NCONSTS, RUN_COLS, Strings, encode_rows as _python_encode_rows

log = logging.getLogger("cltrace")

EncodeRows = Callable[[np.ndarray, np.ndarray, int, np.ndarray, Strings, Strings], bytes]


def _load_native() -> EncodeRows:
    try:  # by name: the extension is a leaf (it imports nothing), not the package that imports this module
        _packets = importlib.import_module(f"{__package__}._packets")
    except ImportError as exc:
        log.debug("cltrace: %s", exc)
        raise ImportError("C extension not built (no C compiler at install time?)") from None
    built = (_packets.NCOLS, _packets.RUN_COLS, _packets.NCONSTS)
    if built != (NCOLS, RUN_COLS, NCONSTS):
        raise ImportError(f"C extension built for another row layout {built}: reinstall cltrace")

    def encode_rows(rows: np.ndarray, runs: np.ndarray, mono: int, consts: np.ndarray, pool: Strings,
                    extras: Strings) -> bytes:
        return _packets.encode(np.ascontiguousarray(rows, np.int64), runs, mono, consts, *pool, *extras)

    return encode_rows


def _select() -> tuple[EncodeRows | None, str]:
    if os.environ.get("CLTRACE_NATIVE", "").strip() == "0":
        return None, "CLTRACE_NATIVE=0"
    try:
        return _load_native(), ""
    except ImportError as exc:
        return None, str(exc)


PYTHON: EncodeRows = _python_encode_rows
NATIVE: EncodeRows | None
WHY: str  # why NATIVE is None ("" when it is active)
NATIVE, WHY = _select()
if NATIVE is None:
    log.debug("cltrace: .pftrace rows encoded by the numpy fallback (%s)", WHY)
PATH: str = "python" if NATIVE is None else "native"
DETAIL: str = "native (C extension)" if NATIVE is not None else f"python (fallback: {WHY})"
encode_rows: EncodeRows = NATIVE or PYTHON

__all__ = ["PATH", "DETAIL", "WHY", "NATIVE", "PYTHON", "encode_rows"]
