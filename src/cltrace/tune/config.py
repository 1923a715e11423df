"""``Config``: one point of an autotuning search space, and the ``-D`` defines it stands for."""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np

KEYS = ("workgroup", "tile", "unroll")
_AXES = "XYZ"


def as_dims(value: Any) -> tuple[int, ...] | None:
    """``None``, an int or a sequence of ints as a tuple of ints (``None`` stays ``None``)."""
    if value is None:
        return None
    if isinstance(value, (int, np.integer)):
        return (int(value),)
    return tuple(int(v) for v in value)


def fmt_dims(value: tuple[int, ...] | None, none: str) -> str:
    """``(8, 4)`` -> ``"8x4"``; ``none`` for ``None``."""
    return none if value is None else "x".join(str(v) for v in value)


@dataclass(frozen=True)
class Config(Mapping):
    """One point of the search space; a read-only mapping ``{"workgroup", "tile", "unroll"}``.

    ``workgroup`` is the local size (``None``: left to the driver); ``tile`` and
    ``unroll`` are compile-time parameters (``None``: not part of this sweep).
    """

    workgroup: tuple[int, ...] | None = None
    tile: tuple[int, ...] | None = None
    unroll: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "workgroup", as_dims(self.workgroup))
        object.__setattr__(self, "tile", as_dims(self.tile))
        if self.unroll is not None:
            object.__setattr__(self, "unroll", int(self.unroll))

    def __getitem__(self, key: str) -> Any:
        if key not in KEYS:
            raise KeyError(key)
        return getattr(self, key)

    def __iter__(self) -> Iterator[str]:
        return iter(KEYS)

    def __len__(self) -> int:
        return len(KEYS)

    def label(self) -> str:
        """Short human form, e.g. ``wg=8x4 tile=4x2 unroll=4`` (``wg=auto``: driver's choice)."""
        parts = [f"wg={fmt_dims(self.workgroup, 'auto')}"]
        if self.tile is not None:
            parts.append(f"tile={fmt_dims(self.tile, '-')}")
        if self.unroll is not None:
            parts.append(f"unroll={self.unroll}")
        return " ".join(parts)

    def as_dict(self) -> dict[str, Any]:
        """JSON-friendly form (tuples become lists)."""
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in zip(KEYS, dataclasses.astuple(self))}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Config":
        return cls(**{k: d.get(k) for k in KEYS})


def standard_defines(config: Config) -> dict[str, int]:
    """``TILE_X``/``TILE_Y``/``TILE_Z``, ``UNROLL`` and ``WG_X``/``WG_Y``/``WG_Z`` for a config."""
    out: dict[str, int] = {}
    for prefix, dims in (("TILE", config.tile), ("WG", config.workgroup)):
        for axis, v in zip(_AXES, dims or ()):
            out[f"{prefix}_{axis}"] = v
    if config.unroll is not None:
        out["UNROLL"] = config.unroll
    return out
