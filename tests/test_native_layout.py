"""The one native module's stated interface: the layouts it shares with Python are the same numbers on both
sides (one header, _ext.h, against Python's copies), and _ext.pyi declares exactly what the module holds.

The native tests fail, not skip, when the extension is not built: CI must exercise both paths. Only
``CLTRACE_NATIVE=0`` (the fallback-only run) skips them.
"""
from __future__ import annotations

import ast
import os
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from cltrace.timeline import raw
from cltrace.timeline import stamps

STUB = Path(__file__).resolve().parents[1] / "src" / "cltrace" / "_ext.pyi"
STAGES = ("stamps", "resolve", "stats", "region", "chrome", "writer", "scan")


@pytest.fixture(scope="module")
def ext() -> ModuleType:
    if os.environ.get("CLTRACE_NATIVE", "").strip() == "0":
        pytest.skip("CLTRACE_NATIVE=0: fallback-only run")
    try:
        import cltrace._ext as ext
    except ImportError as exc:
        pytest.fail(f"the C extension is not built ({exc}): reinstall with `pip install -e .` where a C compiler "
                    "exists, or run with CLTRACE_NATIVE=0")
    return ext


def python_copies() -> dict[str, int]:
    """Every R_* (timeline/raw.py), C_*, F_* and N_* constant of the Python side, by name."""
    out = {}
    for mod, prefixes in ((raw, ("R_",)), (stamps, ("C_", "F_", "N_COLS"))):
        out.update({k: v for k, v in vars(mod).items() if k.startswith(prefixes) and isinstance(v, int)})
    out["N_FIELDS"] = out.pop("R_FIELDS")  # the count of fields: C's name for it
    return out


def test_the_layouts_are_the_same_numbers_in_c_and_python(ext: ModuleType) -> None:
    py = python_copies()
    c = {k: v for k, v in vars(ext).items() if k[:2] in ("R_", "C_", "F_", "N_") and isinstance(v, int)}
    assert len([k for k in c if k.startswith("R_")]) == c["N_FIELDS"] == 15
    assert len([k for k in c if k.startswith("C_")]) == c["N_COLS"]
    assert {k: py[k] for k in py} == {k: c[k] for k in py}, "timeline/raw.py or timeline/stamps.py differs from _ext.h"
    assert set(py) == set(c), "a layout name on one side only"


def test_the_stub_declares_what_the_module_holds(ext: ModuleType) -> None:
    tree = ast.parse(STUB.read_text())
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    top = {t.target.id: t.annotation for t in tree.body  # type: ignore[union-attr]
           if isinstance(t, ast.AnnAssign) and not t.target.id.startswith("_")}  # type: ignore[union-attr]
    public = {k for k in vars(ext) if not k.startswith("_")}
    assert public == set(top), "cltrace/_ext.pyi and the built module differ"
    assert set(STAGES) <= public
    for stage in STAGES:
        cls = classes[top[stage].id]  # type: ignore[attr-defined]
        declared = {n.name for n in cls.body if isinstance(n, ast.FunctionDef)} | {
            n.target.id for n in cls.body if isinstance(n, ast.AnnAssign)}  # type: ignore[union-attr]
        held = {k for k in dir(getattr(ext, stage)) if not k.startswith("__")}
        assert declared == held, f"_ext.pyi's {stage}: {declared ^ held} on one side only"


def test_the_long_calls_take_keywords_only(ext: ModuleType) -> None:
    """``writer.Writer.write`` and ``resolve.finish`` (20-odd arrays each) are called by name; one missing is named."""
    with pytest.raises(TypeError):
        ext.resolve.finish(np.zeros(1))
    with pytest.raises(TypeError, match="missing keyword argument 'ints'"):
        ext.resolve.finish()
    with pytest.raises(TypeError, match="missing keyword argument 'status_out'"):
        z = np.zeros(0, np.int64)
        ext.resolve.finish(ints=z, status=z, raw=z, lut=z, groups=z, thread_track=z, site_id=z, queue_track=z,
                           queue_clock=z, queue_lane=z, path_id=z, clocks=[], extents=ext.resolve.Extents(), out64=z,
                           name=z, cat=z, path=z, site=z)
    with pytest.raises(TypeError):
        ext.writer.Writer().write(np.zeros(1))

