"""The build options a ``compile`` call uses: the caller's options, its defines, then tuned defines.

The order is fixed so that the same inputs always give the same options, and so
the same program cache and tune DB keys.
"""
from __future__ import annotations

import logging
import re
from typing import Any, Mapping, Sequence

from . import tunedb

log = logging.getLogger("cltrace")

_IDENT = re.compile(r"[A-Za-z_]\w*")


def define_options(defines: Mapping[str, Any] | None, skip: frozenset[str] = frozenset()) -> tuple[str, ...]:
    """``-DNAME=VALUE`` options, sorted by name (``-DNAME`` for a value of None)."""
    if not defines:
        return ()
    out = []
    for name in sorted(defines, key=str):
        if not isinstance(name, str) or not _IDENT.fullmatch(name):
            raise ValueError(f"define name {name!r} is not a C identifier")
        if name in skip:
            continue
        value = defines[name]
        out.append(f"-D{name}" if value is None else f"-D{name}={value}")
    return tuple(out)


def defined_names(options: Sequence[str]) -> frozenset[str]:
    """Macro names that ``-D`` options define."""
    names = set()
    it = iter(options)
    for tok in it:
        if tok == "-D":
            tok = "-D" + next(it, "")
        if tok.startswith("-D"):
            names.add(tok[2:].split("=", 1)[0])
    return frozenset(names)


def _valid_tuned(cfg: Any) -> dict[str, Any] | None:
    """A tune DB config usable here, or None (a malformed entry is ignored, with a warning)."""
    if cfg is None:
        return None
    defs = cfg.get("defines") or {} if isinstance(cfg, dict) else None
    ls = cfg.get("local_size") if isinstance(cfg, dict) else None
    ok = (isinstance(defs, dict) and all(isinstance(k, str) and _IDENT.fullmatch(k) for k in defs)
          and (ls is None or (isinstance(ls, (list, tuple)) and 1 <= len(ls) <= 3
                              and all(isinstance(x, int) and x > 0 for x in ls))))
    if not ok:
        log.warning("cltrace: ignoring malformed tune DB config %r", cfg)
        return None
    return cfg


def resolve_options(src_hash: str, options: str | Sequence[str], defines: Mapping[str, Any] | None,
                    dev_key: str) -> tuple[tuple[str, ...], dict[str, Any] | None]:
    """(build options, tuned config or None) for a source on a device.

    The tune DB is looked up under the caller's options and defines; a config found
    there adds its defines, except names those options already define.
    """
    opts = tunedb.normalize_options(options) + define_options(defines)
    tuned = _valid_tuned(tunedb.lookup(src_hash, opts, dev_key))
    if tuned is not None:
        opts = opts + define_options(tuned.get("defines"), skip=defined_names(opts))
    return opts, tuned
