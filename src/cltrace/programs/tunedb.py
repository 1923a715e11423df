"""Persistent store of autotuned configurations, shared by the autotuner and the program cache.

An entry is keyed on (source hash, build options, device key) where the device
key names platform, device and driver version; a different driver or device
is a different key, so stale winners are never applied. Each entry is one
small JSON file written atomically (rename), so concurrent processes and
crashes never leave a half-written entry; an unreadable entry is ignored.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from typing import Any, Sequence


def cache_dir() -> str:
    """Root of cltrace's on-disk caches: ``$CLTRACE_CACHE_DIR`` or ``~/.cache/cltrace``."""
    d = os.environ.get("CLTRACE_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "cltrace")
    return d


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


def _path(key: str, root: str | None) -> str:
    return os.path.join(root or cache_dir(), "tuned", key[:2], key + ".json")


def store(src_hash: str, options: Sequence[str], device_key: str, config: dict[str, Any],
          extra: dict[str, Any] | None = None, root: str | None = None) -> str:
    """Persist the winning ``config`` (``{"defines": {...}, "local_size": [...]}``); returns the file path."""
    key = entry_key(src_hash, options, device_key)
    path = _path(key, root)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    doc = {"source_hash": src_hash, "options": list(options), "device_key": device_key,
           "config": config, **(extra or {})}
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".tmp")
    with os.fdopen(fd, "w") as fh:
        json.dump(doc, fh, default=str)
    os.replace(tmp, path)
    return path


def lookup(src_hash: str, options: Sequence[str], device_key: str,
           root: str | None = None) -> dict[str, Any] | None:
    """The stored winning config for this exact (source, options, device+driver), or None."""
    path = _path(entry_key(src_hash, options, device_key), root)
    try:
        with open(path) as fh:
            doc = json.load(fh)
    except (OSError, ValueError):
        return None
    if doc.get("device_key") != device_key or doc.get("source_hash") != src_hash:
        return None
    cfg = doc.get("config")
    return cfg if isinstance(cfg, dict) else None
