"""The native parts, each a small C extension with a pure-Python fallback that writes the same bytes:
``timeline._stamps`` (event stamps in bulk), ``timeline._resolve`` (the resolver's passes over columns), ``timeline._stats`` (per-path statistics),
``record._region`` (region enter/exit), ``export._chrome`` (Chrome JSON lines), ``export.perfetto._packets`` (Perfetto packets),
``export.perfetto._writer`` (the .pftrace writer's whole batch pass), ``export.perfetto._deflate``
(compressing its packets), ``read._scan`` (reading traces back): nine modules from ten files.
Project metadata lives in pyproject.toml.

``optional=True``: where no C compiler exists the install still succeeds and cltrace runs its
pure-Python fallbacks (``cltrace devices`` says which path is active; ``CLTRACE_NATIVE=0`` forces them).
"""
import os
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_py import build_py

PTH = "cltrace.pth"  # the CLTRACE=1 start-up hook (src/_cltrace_hook.py says what it does)


class BuildPyWithPth(build_py):
    """Also install ``src/cltrace.pth`` at the root of site-packages, beside the package: a wheel
    carries it at its root; an editable install (PEP 660), whose build folder is not installed, puts
    it under the wheel's ``.data/purelib``, which installers place in site-packages too."""

    def run(self) -> None:
        super().run()
        if not self.editable_mode:
            self.copy_file(os.path.join("src", PTH), os.path.join(self.build_lib, PTH), preserve_mode=False)
            return
        data = Path(self.get_finalized_command("install").install_data)  # <wheel>/<name>.data/data
        purelib = data.parent / "purelib"
        purelib.mkdir(parents=True, exist_ok=True)
        self.copy_file(os.path.join("src", PTH), str(purelib / PTH), preserve_mode=False)

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        extra = [] if self.editable_mode else [os.path.join(self.build_lib, PTH)]
        return [*super().get_outputs(include_bytecode), *extra]

_O2 = [] if sys.platform == "win32" else ["-O2"]


def _ext(name: str, source: str, extra_sources: list[str] = [], **kw: object) -> Extension:
    return Extension(name, sources=[source, *extra_sources], extra_compile_args=_O2, optional=True, **kw)


setup(
    cmdclass={"build_py": BuildPyWithPth},
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
