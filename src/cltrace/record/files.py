"""Where cltrace keeps its caches on disk, whether it may trust what it finds there, and writing a
small file whole or not at all.

The program cache, the tune store and the device probe's verdicts all live under ``cache_dir()``.
What is read there changes what kernels compute (a program binary, ``-D`` options) or which device
is used, so, like ssh with ``~/.ssh`` and pip with its cache, cltrace trusts only folders and files
of the user's own that no one else can write: its folders are made 0700 whatever the umask, and
``refusal`` names a folder or file another user owns or group/others can write, which the stores
then neither read nor write (one warning line per path and process, ``warn_refused``). Each entry
is written by ``write_atomically`` (a 0600 temporary file renamed into place), so a crash or a
concurrent process never leaves a half-written one.
"""
from __future__ import annotations

import logging
import os
import stat
import tempfile

log = logging.getLogger("cltrace")

_refused: set[str] = set()  # refusals already said (each names its path), this process


def cache_dir() -> str:
    """Root of cltrace's on-disk caches: ``$CLTRACE_CACHE_DIR`` or ``~/.cache/cltrace``."""
    return os.environ.get("CLTRACE_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "cltrace")


def make_dirs(path: str, mode: int) -> str:
    """Make the folder ``path`` and the missing folders above it, each with ``mode`` (narrowed by the
    umask, never widened: ``os.makedirs`` under umask 000 makes them 0777). Folders that exist are
    left as they are. Returns ``path``."""
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
            os.mkdir(d, mode)
        except FileExistsError:  # another process made it meanwhile, or it is a file (raised below)
            if not os.path.isdir(d):
                raise
    return path


def private_dirs(path: str) -> str:
    """``make_dirs(path, 0o700)``: folders readable by their owner only, for the caches (what other
    users could plant there, cltrace would refuse)."""
    return make_dirs(path, 0o700)


def refusal(root: str, path: str, st: os.stat_result | None = None) -> str | None:
    """Why cltrace must not trust ``path`` (a folder or file at or under the cache folder ``root``),
    or None: ``root`` and every folder from it down to ``path``, and ``path`` itself, must be owned by
    this user and not writable by group or others. What does not exist yet is not judged (cltrace
    makes it, 0700). ``st``: ``path``'s ``os.fstat`` of an open file (judged as what was opened)."""
    root = os.path.abspath(root)
    target = os.path.abspath(path)
    chain = [target]
    while chain[-1] != root:
        parent = os.path.dirname(chain[-1])
        if parent == chain[-1]:  # not under root: judge it alone
            chain = [target]
            break
        chain.append(parent)
    me = os.getuid()
    for p in reversed(chain):
        try:
            s = st if (st is not None and p == target) else os.stat(p)
        except FileNotFoundError:
            return None
        except OSError as exc:
            return f"{p} cannot be examined ({exc.strerror or exc})"
        kind = "folder" if stat.S_ISDIR(s.st_mode) else "file"
        if s.st_uid != me:
            return f"the {kind} {p} is owned by uid {s.st_uid}, not by you (uid {me})"
        if s.st_mode & 0o022:
            return f"the {kind} {p} can be written by {_who(s.st_mode)} (mode {stat.S_IMODE(s.st_mode):04o})"
    return None


def _who(mode: int) -> str:
    return " and ".join(w for w, bit in (("its group", 0o020), ("other users", 0o002)) if mode & bit)


def warn_refused(what: str, reason: str) -> None:
    """One warning line per refused path and process: what is not used, why, and the fix."""
    if reason in _refused:
        return
    _refused.add(reason)
    log.warning("cltrace: not using the %s: %s; going on without it (fix: chmod go-w, or point "
                "CLTRACE_CACHE_DIR at a folder of your own)", what, reason)


def write_atomically(path: str, data: bytes) -> None:
    """Write ``path`` whole or not at all: a temporary file beside it (mode 0600), renamed over it; on
    any failure the temporary file is removed and the error raised."""
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
