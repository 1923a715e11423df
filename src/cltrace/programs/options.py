"""The build options a ``compile`` call uses: the caller's options, its defines, then tuned defines.

The order is fixed so that the same inputs always give the same options, and so
the same program cache and tune DB keys.
"""
from __future__ import annotations

import logging
import math
import re
from typing import Any, Mapping, Sequence

import pyopencl as cl

from . import tunedb

log = logging.getLogger("cltrace")

_IDENT = re.compile(r"[A-Za-z_]\w*", re.ASCII)
# A C integer or floating literal (optional minus, hex, exponent, suffixes): what a tuned define's value may be.
_NUMBER = re.compile(r"-?(?:0[xX][0-9a-fA-F]+|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)[uUlLfF]{0,3}", re.ASCII)


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


def _safe_value(value: Any) -> bool:
    """Whether a stored define's value can become ``-DNAME=VALUE`` and nothing more: None, a number,
    or a string that is one C identifier or number (no space, quote or dash that could start an option)."""
    if value is None or isinstance(value, bool) or (isinstance(value, int)):
        return True
    if isinstance(value, float):
        return math.isfinite(value)
    return isinstance(value, str) and bool(_IDENT.fullmatch(value) or _NUMBER.fullmatch(value))


def tuned_problem(cfg: Any) -> str | None:
    """What makes a stored config unusable here, or None. Its defines become compiler options, so
    only identifier names with numeric or identifier values pass (issue 30: a value of
    ``"1 -DINJECTED=1"`` would add an option the tuner never chose)."""
    if not isinstance(cfg, dict):
        return f"its config is a {type(cfg).__name__}, not an object"
    defs = cfg.get("defines") or {}
    if not isinstance(defs, dict):
        return f"its defines are a {type(defs).__name__}, not an object"
    bad = [k for k in defs if not (isinstance(k, str) and _IDENT.fullmatch(k))]
    if bad:
        return f"the define name {str(bad[0])[:80]!r} is not a C identifier"
    bad = [k for k, v in defs.items() if not _safe_value(v)]
    if bad:
        return (f"the define {bad[0]}={str(defs[bad[0]])[:80]!r} is not a number or an identifier "
                "(it would become compiler options)")
    ls = cfg.get("local_size")
    if not (ls is None or _dims(ls)):
        return f"its local_size {str(ls)[:80]} is not 1 to 3 positive integers"
    params = cfg.get("params")
    if params is not None and not (isinstance(params, dict) and all(
            v is None or _dims(v) or _dims([v]) for v in params.values())):
        return f"its params {str(params)[:80]} are not positive integers"
    return None


def _dims(value: Any) -> bool:
    return (isinstance(value, (list, tuple)) and 1 <= len(value) <= 3
            and all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in value))


def resolve_options(src_hash: str, options: str | Sequence[str], defines: Mapping[str, Any] | None,
                    dev_key: str, tune_key: Sequence[Any] | None = None,
                    use_tuned: bool = True) -> tuple[tuple[str, ...], dict[str, Any] | None]:
    """(build options, tuned config or None) for a source on a device.

    The tune DB is looked up under the caller's options and defines and the problem
    signature ``tune_key`` (None: the only stored signature, if there is one); a config
    found there adds its defines, except names those options already define.
    ``use_tuned=False``: the untuned options.
    """
    opts = tunedb.normalize_options(options) + define_options(defines)
    if not use_tuned:
        return opts, None
    doc = tunedb.lookup_entry(src_hash, opts, dev_key, signature=tune_key)
    tuned = doc["config"] if doc is not None else None
    problem = tuned_problem(tuned) if tuned is not None else None
    if problem is not None:
        tunedb.warn_once(doc["path"], f"{problem}; building without it")
        tuned = None
    if tuned is not None:
        opts = opts + define_options(tuned.get("defines"), skip=defined_names(opts))
    return opts, tuned


def tuned_fit_error(program: Any, device: Any, tuned: Mapping[str, Any]) -> str | None:
    """Why a program built with a stored config cannot run that config's local size here, or None."""
    ls = tuned.get("local_size")
    kname = tuned.get("kernel")
    if kname is not None:
        try:
            knl = cl.Kernel(program, kname)
        except cl.Error as exc:
            return f"its program has no kernel {kname!r} ({exc})"
        if ls:
            cap = int(knl.get_work_group_info(cl.kernel_work_group_info.WORK_GROUP_SIZE, device))
            if math.prod(ls) > cap:
                return f"its local size {ls} exceeds the kernel's CL_KERNEL_WORK_GROUP_SIZE {cap}"
    if ls:
        if math.prod(ls) > device.max_work_group_size or len(ls) > len(device.max_work_item_sizes) or any(
                v > m for v, m in zip(ls, device.max_work_item_sizes)):
            return (f"its local size {ls} does not fit the device (max_work_group_size "
                    f"{device.max_work_group_size}, max_work_item_sizes {list(device.max_work_item_sizes)})")
    return None


def forget_tuned(src_hash: str, options: str | Sequence[str], defines: Mapping[str, Any] | None, dev_key: str,
                 tune_key: Sequence[Any] | None, reason: str) -> None:
    """Evict a stored config that no longer works, with one warning, so the untuned build is used."""
    opts = tunedb.normalize_options(options) + define_options(defines)
    doc = tunedb.lookup_entry(src_hash, opts, dev_key, tune_key)
    where = doc["path"] if doc is not None else "the tune DB"
    tunedb.evict(src_hash, opts, dev_key, tune_key)
    log.warning("cltrace: the stored tuned configuration %s is dropped: %s; using the untuned default",
                where, reason)
