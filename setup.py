"""The native part: ONE C extension, ``cltrace._ext``, built from the stages' own .c files (``src/cltrace/_ext.c``
lists them; ``_ext.h`` holds their shared layouts; ``_ext.pyi`` states the interface). Its sub-modules:
``stamps`` (event stamps in bulk, with the reaper thread), ``resolve`` (the resolver's passes over columns),
``stats`` (per-path statistics), ``region`` (region enter/exit), ``chrome`` (Chrome JSON lines), ``writer``
(the .pftrace writer's whole batch pass), ``scan`` (reading traces back). Each has a pure-Python reference
that writes the same bytes; ``cltrace/_native.py`` picks one per stage.
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
_SRC = "src/cltrace/"
_STAGES = ["timeline/_opencl.c", "timeline/_reaper.c", "timeline/_stamps.c", "timeline/_resolve.c", "timeline/_stats.c",
           "record/_region.c", "export/_chrome.c", "export/perfetto/_writer.c", "read/_scan.c"]
_HEADERS = ["_ext.h", "_mix.h", "timeline/_opencl.h", "timeline/_reaper.h", "export/perfetto/_wire.h"]


setup(
    cmdclass={"build_py": BuildPyWithPth},
    ext_modules=[
        Extension("cltrace._ext", sources=[_SRC + "_ext.c", *(_SRC + f for f in _STAGES)],
                  depends=[_SRC + h for h in _HEADERS], extra_compile_args=_O2, optional=True,
                  libraries=[] if sys.platform == "win32" else ["dl", "pthread", "m"]),
    ],
)
