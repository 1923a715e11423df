"""Persistent store of autotuned configurations, shared by the autotuner and the program cache.

An entry is keyed on (source hash, build options, device key) and on a problem
signature: the argument sizes and scalars a kernel declares as its tuning key
(as Triton's ``autotune(key=[...])``), so a 256³ winner never replaces the
512³ one. The device key names platform, device and driver version; a
different driver or device is a different key, so stale winners are never
applied. Each entry is one small JSON file
``tuned/<kk>/<key>/<signature hash>.json``, written atomically (temporary file,
rename; a failed write removes the temporary file), so concurrent processes and
crashes never leave a half-written entry. An entry that is not a JSON object,
or names another key, is ignored with one warning per file and process; one
that does not parse (cut short, nested too deep, larger than any entry cltrace
writes) is removed with one warning. The store's defines become compiler
options, so it is trusted only in folders of the user's own that no one else
can write (``files.refusal``): elsewhere it is neither read nor written, with
one warning; its folders are made 0700.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
from typing import Any, Sequence

from ..record.files import cache_dir, private_dirs, refusal, warn_refused, write_atomically

log = logging.getLogger("cltrace")

_warned: set[str] = set()
_MAX_ENTRY = 1 << 20  # bytes; cltrace writes entries of a few hundred


def source_hash(source: str) -> str:
    return hashlib.sha256(source.encode("utf-8")).hexdigest()


def normalize_options(options: str | Sequence[str] | None) -> tuple[str, ...]:
    if not options:
        return ()
    if isinstance(options, str):
        options = options.split()
    return tuple(str(o) for o in options)


def entry_key(src_hash: str, options: Sequence[str], device_key: str) -> str:
    blob = json.dumps([src_hash, list(options), device_key])
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def signature_of(signature: Sequence[Any] | None) -> list[Any] | None:
    """A problem signature in its stored (JSON) form: tuples become lists; None stays None."""
    if signature is None:
        return None
    return [signature_of(v) if isinstance(v, (tuple, list)) else v for v in signature]


def _sig_name(signature: Sequence[Any] | None) -> str:
    if signature is None:
        return "any"
    blob = json.dumps(signature_of(signature), default=str)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:24]


def _dir(key: str, root: str | None) -> str:
    return os.path.join(root or cache_dir(), "tuned", key[:2], key)


def entry_path(src_hash: str, options: Sequence[str], device_key: str, signature: Sequence[Any] | None,
               root: str | None = None) -> str:
    """Where the entry for this (source, options, device, signature) lives."""
    return os.path.join(_dir(entry_key(src_hash, options, device_key), root), _sig_name(signature) + ".json")


def store(src_hash: str, options: Sequence[str], device_key: str, config: dict[str, Any],
          extra: dict[str, Any] | None = None, root: str | None = None,
          signature: Sequence[Any] | None = None) -> str:
    """Persist the winning ``config`` (``{"defines": {...}, "local_size": [...]}``) for ``signature``;
    returns the file path. Raises OSError (or the encoder's error) with no file left behind."""
    path = entry_path(src_hash, options, device_key, signature, root)
    reason = refusal(root or cache_dir(), os.path.dirname(path))
    if reason is not None:
        raise PermissionError(f"not writing to the tune store: {reason}")
    private_dirs(os.path.dirname(path))
    doc = {"source_hash": src_hash, "options": list(options), "device_key": device_key,
           "signature": signature_of(signature), "config": config, **(extra or {})}
    write_atomically(path, json.dumps(doc, default=str).encode("utf-8"))
    return path


def warn_once(path: str, what: str) -> None:
    """One warning per entry and process: the entry at ``path`` is not used, and why."""
    if path not in _warned:
        _warned.add(path)
        log.warning("cltrace: ignoring tune store entry %s: %s (delete it, or re-run the tuner)", path, what)


def _read(path: str, src_hash: str, device_key: str, root: str | None = None) -> dict[str, Any] | None:
    """The document at ``path`` if it is this key's entry; None (with one warning if malformed or not
    trusted: the file and the folders above it up to the store's root) otherwise."""
    try:
        with open(path, "rb") as fh:  # judged once open: a miss costs no more than the open
            reason = refusal(root or cache_dir(), path, os.fstat(fh.fileno()))
            if reason is not None:
                warn_refused("tune store", reason)
                return None
            data = fh.read(_MAX_ENTRY + 1)
    except FileNotFoundError:
        return None
    except OSError as exc:
        warn_once(path, f"unreadable ({exc})")
        return None
    try:
        if len(data) > _MAX_ENTRY:
            raise ValueError(f"larger than {_MAX_ENTRY} bytes")
        doc = json.loads(data)
    except (ValueError, RecursionError) as exc:  # RecursionError: nested deeper than the parser goes
        _remove(path)
        warn_once(path, f"does not parse ({type(exc).__name__}: {str(exc)[:200]}); removed")
        return None
    if not isinstance(doc, dict):
        warn_once(path, f"a JSON {type(doc).__name__}, not an object")
        return None
    if doc.get("device_key") != device_key or doc.get("source_hash") != src_hash:
        warn_once(path, "written for another source or device")
        return None
    if not isinstance(doc.get("config"), dict):
        warn_once(path, "its config is not an object")
        return None
    return doc


def lookup_entry(src_hash: str, options: Sequence[str], device_key: str, signature: Sequence[Any] | None = None,
                 root: str | None = None) -> dict[str, Any] | None:
    """The stored document (``config``, ``signature``, ``path``, figures) for this key, or None.

    With a ``signature``: the entry tuned for exactly that problem. Without one: the
    only entry of this (source, options, device), if there is exactly one signature
    stored; with several, none (which one would be a guess).
    """
    d = _dir(entry_key(src_hash, options, device_key), root)
    if signature is not None:
        path = entry_path(src_hash, options, device_key, signature, root)
        doc = _read(path, src_hash, device_key, root)
        return {**doc, "path": path} if doc is not None else None
    try:
        names = [n for n in os.listdir(d) if n.endswith(".json")]
    except OSError:
        return None
    docs = [(p, _read(p, src_hash, device_key, root)) for p in (os.path.join(d, n) for n in sorted(names))]
    found = [{**doc, "path": p} for p, doc in docs if doc is not None]
    return found[0] if len(found) == 1 else None


def lookup(src_hash: str, options: Sequence[str], device_key: str, root: str | None = None,
           signature: Sequence[Any] | None = None) -> dict[str, Any] | None:
    """The stored winning config for this (source, options, device+driver[, signature]), or None."""
    doc = lookup_entry(src_hash, options, device_key, signature, root)
    return doc["config"] if doc is not None else None


def evict(src_hash: str, options: Sequence[str], device_key: str, signature: Sequence[Any] | None = None,
          root: str | None = None, path: str | None = None) -> bool:
    """Remove a stored winner (the given ``path``, or the entry ``lookup_entry`` would return); True if removed."""
    if path is None:
        doc = lookup_entry(src_hash, options, device_key, signature, root)
        if doc is None:
            return False
        path = doc["path"]
    return _remove(path)


def _remove(path: str) -> bool:
    try:
        os.unlink(path)
    except OSError:
        return False
    return True
