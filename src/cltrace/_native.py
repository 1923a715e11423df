"""Choosing, per stage of the data path, its C implementation or its Python reference, the same way for each.

The C parts are the sub-modules of one extension, ``cltrace._ext`` (``_ext.pyi`` states them); each stage
has exactly these two implementations, which give the same results (twin tests hold them so):

=================  =====================  ================================================================
stage              C (``cltrace._ext.``)  Python reference
=================  =====================  ================================================================
event stamps       ``stamps``             ``timeline/stamps.py`` (pyopencl's ``profile`` per event)
resolver passes    ``resolve``            ``timeline/passes.py``, ``Resolver._columns`` (resolve.py)
statistics         ``stats``              ``timeline/stats.py``
regions, sites     ``region``             ``record/regions.py``, ``record/callsite.py``
Chrome JSON        ``chrome``             ``export/chrome_lines.py``
.pftrace writer    ``writer``             ``export/perfetto/rows.py`` + ``layout.py`` (numpy)
trace scanner      ``scan``               ``read/chrome.py``, ``read/perfetto.py``
=================  =====================  ================================================================

(The .pftrace compressor is chosen here too: the ``isal`` package's zlib, else Python's zlib.)

``CLTRACE_NATIVE=0`` forces the Python side everywhere; a stage whose C part is missing or does not load
falls back silently (a debug log line), and says why in its ``DETAIL`` ("native (C extension)" or
"python (fallback: <why>)"), which ``cltrace devices`` prints.
"""
from __future__ import annotations

import importlib
import logging
import os
from types import ModuleType
from typing import Any, Callable, NamedTuple

log = logging.getLogger("cltrace")


class Choice(NamedTuple):
    native: Any  # what the loader returned, or None
    why: str  # why the fallback runs ("" when the native part does)

    @property
    def path(self) -> str:
        return "python" if self.native is None else "native"

    @property
    def detail(self) -> str:
        return "native (C extension)" if self.native is not None else f"python (fallback: {self.why})"


def extension(stage: str) -> ModuleType:
    """The stage ``stage`` of the one C extension (``cltrace._ext.<stage>``, see _ext.pyi); ImportError
    saying it is not built where it is missing."""
    try:
        ext = importlib.import_module("cltrace._ext")
    except ImportError as exc:
        log.debug("cltrace: %s", exc)
        raise ImportError("C extension not built (no C compiler at install time?)") from None
    mod = getattr(ext, stage, None)
    if not isinstance(mod, ModuleType):
        raise ImportError(f"C extension built for another cltrace (no stage {stage!r}): reinstall cltrace")
    return mod


def choose(what: str, load: Callable[[], Any]) -> Choice:
    """Run ``load`` (which imports and checks the extension) unless CLTRACE_NATIVE=0; never raises."""
    if os.environ.get("CLTRACE_NATIVE", "").strip() == "0":
        choice = Choice(None, "CLTRACE_NATIVE=0")
    else:
        try:
            choice = Choice(load(), "")
        except ImportError as exc:
            choice = Choice(None, str(exc))
        except Exception as exc:  # built for another cltrace, or the driver lacks an entry point
            choice = Choice(None, f"{type(exc).__name__}: {exc}")
    if choice.native is None:
        log.debug("cltrace: %s runs the Python fallback (%s)", what, choice.why)
    return choice
