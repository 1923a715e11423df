"""Opening a store: a folder (embedded chDB) or a ClickHouse server over HTTP, one client API for both.

``STORE`` is a folder path (created where missing; chDB keeps its data there), ``chdb://PATH``, or
a server: ``http(s)://[user:password@]host:port[/database]`` or ``clickhouse(s)://...`` (the same,
over HTTP(S)). ``CLTRACE_STORE`` gives the default. Both go through ``clickhouse-connect``, whose
``get_client(dsn="chdb://PATH")`` runs chDB in this process: the same SQL runs on either. chDB keeps
one data folder per process: close a store before opening one in another folder.
"""
from __future__ import annotations

import os
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from ..errors import CltraceError, MissingExtraError

ENV = "CLTRACE_STORE"


class StoreError(CltraceError):
    """A store cannot be opened or used; the message says what to do."""


class StoreExtraError(StoreError, MissingExtraError):
    """The store's driver (clickhouse-connect, and chDB for a folder) is not installed."""


def require_driver(store: str | os.PathLike[str] | None) -> None:
    """The store's packages are installed (chDB too unless ``store`` names a server), else one line
    naming the extra; checked before a folder is made or a trace is read."""
    import importlib

    spec = os.fspath(store) if store is not None else os.environ.get(ENV, "")
    server = urlsplit(spec).scheme.lower() in ("http", "https", "clickhouse", "clickhouses")
    try:
        for name in ["clickhouse_connect"] + ([] if server else ["chdb"]):
            importlib.import_module(name)  # the store imports them next anyway
    except ModuleNotFoundError:
        raise StoreExtraError("the store", "clickhouse") from None


def resolve(store: str | os.PathLike[str] | None, create: bool = True) -> tuple[str, str | None]:
    """(clickhouse-connect DSN, database named in the URL or None) of a ``STORE`` argument; a folder
    is created where missing unless ``create`` is false (then a missing one is an error)."""
    spec = os.fspath(store) if store is not None else os.environ.get(ENV, "")
    if not spec:
        raise StoreError(f"no store given: pass --store FOLDER|URL or set {ENV}")
    parts = urlsplit(spec)
    scheme = parts.scheme.lower()
    if scheme == "chdb":
        return spec, None
    if scheme in ("http", "https", "clickhouse", "clickhouses"):
        web = {"clickhouse": "http", "clickhouses": "https"}.get(scheme, scheme)
        db = parts.path.strip("/") or None
        return urlunsplit((web, parts.netloc, "", parts.query, "")), db
    if scheme and len(scheme) > 1:
        raise StoreError(f"{spec}: a store is a folder, chdb://PATH, http(s)://HOST:PORT or clickhouse://HOST:PORT")
    path = os.path.abspath(spec)
    if os.path.exists(path) and not os.path.isdir(path):
        raise StoreError(f"{spec}: is a file; an embedded store is a folder")
    if not create and not os.path.isdir(path):
        raise StoreError(f"no store at {spec}: load traces into it first (cltrace load FILE... --store {spec})")
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        raise StoreError(f"cannot create the store folder {spec}: {exc.strerror}") from None
    return f"chdb://{path}", None


def open_client(dsn: str) -> Any:
    """A clickhouse-connect client for a DSN from ``resolve``; one line naming the fix where it fails."""
    try:
        import clickhouse_connect
    except ModuleNotFoundError:
        raise StoreExtraError("the store", "clickhouse") from None
    try:
        return clickhouse_connect.get_client(dsn=dsn, settings={"mutations_sync": 1} if not dsn.startswith("chdb") else None)
    except ImportError:
        raise StoreExtraError("an embedded store", "clickhouse") from None
    except Exception as exc:  # the driver's own exceptions: connection refused, auth, a chDB folder clash
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise StoreError(f"cannot open the store {dsn}: {first}") from None
