"""Where cltrace keeps its caches on disk, and writing a small file whole or not at all.

The program cache, the tune store and the device probe's verdicts all live under ``cache_dir()``;
each entry is written by ``write_atomically`` so a crash or a concurrent process never leaves a
half-written one.
"""
from __future__ import annotations

import os
import tempfile


def cache_dir() -> str:
    """Root of cltrace's on-disk caches: ``$CLTRACE_CACHE_DIR`` or ``~/.cache/cltrace``."""
    return os.environ.get("CLTRACE_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "cltrace")


def private_dirs(path: str) -> str:
    """Make the folder ``path`` and the missing folders above it, each readable by its owner only
    (0700: what other users could plant there, cltrace would trust). Returns ``path``."""
    missing = []
    d = os.path.abspath(path)
    while not os.path.isdir(d):
        missing.append(d)
        parent = os.path.dirname(d)
        if parent == d:
            break
        d = parent
    for d in reversed(missing):
        try:
            os.mkdir(d, 0o700)
        except FileExistsError:  # another process made it meanwhile, or it is a file (raised below)
            if not os.path.isdir(d):
                raise
    return path


def write_atomically(path: str, data: bytes) -> None:
    """Write ``path`` whole or not at all: a temporary file beside it, renamed over it; on any
    failure the temporary file is removed and the error raised."""
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
