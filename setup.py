"""The native parts, each a small C extension with a pure-Python fallback that writes the same bytes:
``timeline._stamps`` (event stamps in bulk), ``timeline._resolve`` (the resolver's passes over columns), ``timeline._stats`` (per-path statistics),
``record._region`` (region enter/exit), ``export._chrome`` (Chrome JSON lines), ``export.perfetto._packets`` (Perfetto packets),
``export.perfetto._writer`` (the .pftrace writer's whole batch pass), ``export.perfetto._deflate``
(compressing its packets).
Project metadata lives in pyproject.toml.

``optional=True``: where no C compiler exists the install still succeeds and cltrace runs its
pure-Python fallbacks (``cltrace devices`` says which path is active; ``CLTRACE_NATIVE=0`` forces them).
"""
import sys

from setuptools import Extension, setup

_O2 = [] if sys.platform == "win32" else ["-O2"]


def _ext(name: str, source: str, extra_sources: list[str] = [], **kw: object) -> Extension:
    return Extension(name, sources=[source, *extra_sources], extra_compile_args=_O2, optional=True, **kw)


setup(
    ext_modules=[
        _ext("cltrace.timeline._stamps", "src/cltrace/timeline/_stamps.c", extra_sources=["src/cltrace/timeline/_reaper.c"],
             depends=["src/cltrace/timeline/_opencl.h", "src/cltrace/timeline/_reaper.h"],
             libraries=[] if sys.platform == "win32" else ["dl", "pthread"]),
        _ext("cltrace.timeline._resolve", "src/cltrace/timeline/_resolve.c", depends=["src/cltrace/_mix.h"],
             libraries=[] if sys.platform == "win32" else ["m"]),
        _ext("cltrace.timeline._stats", "src/cltrace/timeline/_stats.c", depends=["src/cltrace/_mix.h"]),
        _ext("cltrace.record._region", "src/cltrace/record/_region.c"),
        _ext("cltrace.export._chrome", "src/cltrace/export/_chrome.c"),
        _ext("cltrace.export.perfetto._packets", "src/cltrace/export/perfetto/_packets.c",
             depends=["src/cltrace/export/perfetto/_wire.h"]),
        _ext("cltrace.export.perfetto._writer", "src/cltrace/export/perfetto/_writer.c",
             depends=["src/cltrace/export/perfetto/_wire.h", "src/cltrace/_mix.h"]),
        _ext("cltrace.export.perfetto._deflate", "src/cltrace/export/perfetto/_deflate.c"),
        _ext("cltrace.read._scan", "src/cltrace/read/_scan.c"),
    ],
)
