"""The program cache: built programs in memory, checksummed program binaries on disk.

``ProgramCache`` says the on-disk entry format; ``default_cache()`` is the one
``compile`` uses when given none.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import threading
from typing import Any, Sequence

from . import tunedb
from ..record.files import private_dirs, refusal, warn_refused

# Where a compile found its program (the ``cache`` attribute of compile spans, ``Program.cache_hit``).
CACHE_MEMORY = "memory"
CACHE_DISK = "disk"
CACHE_MISS = "miss"

_MAGIC = b"CLTRACE-PROGRAM 1\n"
_MAX_HEADER = 16 << 20  # the header line holds the build log: generous, but bounded


class ProgramCache:
    """Built programs in memory and program binaries on disk.

    On disk, keyed on (source hash, build options, device key incl. driver version): the
    device *model*, so identical devices share one binary. In memory, a program is kept per
    context and set of devices it was built for. A disk entry is one file: a magic line, a
    JSON header (key, size, sha256) and the binary; it is written to a temporary file and
    renamed, and checked against its checksum before the driver sees it, so a truncated or
    garbled entry is removed and rebuilt, never loaded. The header's source hash, options and
    device key must be the ones asked for: a binary built from another source is refused even
    when its checksum is right. The checksum only catches accidents, so a folder or entry that
    another user owns or group/others can write is not used at all (``files.refusal``: one
    warning, then the program is built from source and not stored); folders are made 0700.
    """

    def __init__(self, directory: str | os.PathLike[str] | None = None, memory: bool = True) -> None:
        self._directory = os.fspath(directory) if directory is not None else None
        self.memory = memory
        self._mem: dict[tuple[Any, ...], tuple[Any, Any, str]] = {}  # -> (context, cl.Program, build log)
        self._lock = threading.Lock()

    @property
    def directory(self) -> str:
        """``<tunedb.cache_dir()>/programs`` unless given."""
        return self._directory or os.path.join(tunedb.cache_dir(), "programs")

    @staticmethod
    def entry_key(src_hash: str, options: Sequence[str], dev_key: str) -> str:
        return tunedb.entry_key(src_hash, options, dev_key)

    def path(self, key: str) -> str:
        return os.path.join(self.directory, key[:2], key + ".clbin")

    def _refused(self, path: str, st: os.stat_result | None = None) -> bool:
        """Whether ``path`` (an entry's folder, or with ``st`` the entry opened, and the folders above it up
        to the cache's) must not be used; says so once."""
        reason = refusal(self._directory or tunedb.cache_dir(), path, st)
        if reason is not None:
            warn_refused("program cache", reason)
        return reason is not None

    # memory
    def get_memory(self, context: Any, devices: Sequence[Any], keys: Sequence[str]) -> tuple[Any, str] | None:
        """(program, build log) built earlier in this process for these devices of this context, or None."""
        if not self.memory:
            return None
        # The entry holds its context, so a live entry's context address cannot be reused.
        entry = self._mem.get(_memory_key(context, devices, keys))
        return entry[1:] if entry is not None else None

    def put_memory(self, context: Any, devices: Sequence[Any], keys: Sequence[str], program: Any,
                   build_log: str = "") -> None:
        if self.memory:
            with self._lock:
                self._mem[_memory_key(context, devices, keys)] = (context, program, build_log)

    # disk
    def load(self, key: str, src_hash: str, options: Sequence[str], dev_key: str) -> tuple[bytes | None, str | None]:
        """(binary, None) for a valid entry; (None, None) if absent; (None, reason) if it was corrupt (and is now removed)."""
        path = self.path(key)
        try:
            with open(path, "rb") as fh:  # judged once open (a miss costs no more than the open)
                if self._refused(path, os.fstat(fh.fileno())):
                    return None, None  # rebuilt; the build replaces the entry where its folder is trusted
                data = fh.read()
        except FileNotFoundError:
            return None, None
        except OSError as exc:
            return None, f"unreadable: {exc}"
        try:
            return _parse(data, src_hash, options, dev_key), None
        except (ValueError, UnicodeDecodeError, AttributeError, RecursionError) as exc:
            reason = f"corrupt entry ({type(exc).__name__}: {str(exc)[:200]})"
        self.remove(key)
        return None, reason

    def store(self, key: str, src_hash: str, options: Sequence[str], dev_key: str, binary: bytes,
              build_log: str = "") -> str | None:
        """Write one entry atomically (temporary file + rename); returns its path, or None where its
        folder is refused (``files.refusal``)."""
        path = self.path(key)
        if self._refused(os.path.dirname(path)):
            return None
        private_dirs(os.path.dirname(path))
        head = {"source_hash": src_hash, "options": list(options), "device_key": dev_key,
                "size": len(binary), "sha256": hashlib.sha256(binary).hexdigest(), "build_log": build_log}
        tunedb.write_atomically(path, _MAGIC + json.dumps(head).encode("utf-8") + b"\n" + binary)
        return path

    def remove(self, key: str) -> None:
        try:
            os.unlink(self.path(key))
        except OSError:
            pass

    def clear(self, disk: bool = False) -> None:
        """Forget in-memory programs; with ``disk`` also delete this cache's binaries."""
        with self._lock:
            self._mem.clear()
        if disk:
            shutil.rmtree(self.directory, ignore_errors=True)


def _memory_key(context: Any, devices: Sequence[Any], keys: Sequence[str]) -> tuple[Any, ...]:
    return (context.int_ptr, tuple(d.int_ptr for d in devices), tuple(keys))


def _parse(data: bytes, src_hash: str, options: Sequence[str], dev_key: str) -> bytes:
    """The binary of an entry's bytes; ValueError (or a decode error) if it is not this key's intact entry."""
    if not data.startswith(_MAGIC):
        raise ValueError("bad magic")
    nl = data.find(b"\n", len(_MAGIC), len(_MAGIC) + _MAX_HEADER)
    if nl < 0:
        raise ValueError(f"no header line within {_MAX_HEADER} bytes")
    head = json.loads(data[len(_MAGIC):nl].decode("utf-8"))  # too deep: RecursionError, caught as corrupt
    if not isinstance(head, dict):
        raise ValueError(f"header is a JSON {type(head).__name__}, not an object")
    binary = data[nl + 1:]
    if (head.get("source_hash"), head.get("options"), head.get("device_key")) != (src_hash, list(options), dev_key):
        raise ValueError("key mismatch")
    if head.get("size") != len(binary):
        raise ValueError(f"size {len(binary)} != {head.get('size')}")
    if head.get("sha256") != hashlib.sha256(binary).hexdigest():
        raise ValueError("checksum mismatch")
    return binary


_default_cache: ProgramCache | None = None


def default_cache() -> ProgramCache:
    """The process-wide cache ``compile`` uses when none is given."""
    global _default_cache
    if _default_cache is None:
        _default_cache = ProgramCache()
    return _default_cache
