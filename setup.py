"""The one native part: ``cltrace.timeline._stamps``. Project metadata lives in pyproject.toml.

``optional=True``: where no C compiler exists the install still succeeds and cltrace runs its
pure-Python fallback (``cltrace devices`` says which path is active).
"""
import sys

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "cltrace.record._region",
            sources=["src/cltrace/record/_region.c"],
            extra_compile_args=[] if sys.platform == "win32" else ["-O2"],
            optional=True,
        ),
        Extension(
            "cltrace.timeline._stamps",
            sources=["src/cltrace/timeline/_stamps.c"],
            libraries=[] if sys.platform == "win32" else ["dl"],
            extra_compile_args=[] if sys.platform == "win32" else ["-O2"],
            optional=True,
        )
    ],
)
