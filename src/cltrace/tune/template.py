"""``KernelTemplate``: OpenCL C source whose performance knobs are compile-time defines."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np
import pyopencl as cl

from ..programs import tunedb
from ..programs.compiler import compile as _compile
from .config import Config, fmt_dims, standard_defines
from .limits import DeviceLimits, fit_workgroup


@dataclass(frozen=True)
class KernelTemplate:
    """A kernel whose performance knobs are compile-time defines.

    ``source`` must build on its own (without defines) to the untuned
    ``default`` configuration. ``global_size(args, config)`` gives the NDRange
    for a config (the local size is ``config.workgroup``); ``defines(config)``
    gives the ``-D`` macros (``standard_defines``: ``TILE_X``, ``TILE_Y``,
    ``UNROLL``, ``WG_X``, ``WG_Y``). Optional: ``local_mem_bytes(config)`` (checked
    against the device), ``constraint(args, config)`` (a reason a config cannot
    run these args, or None), ``tiles``/``unrolls`` (candidate lists for a
    device), ``flops(args)`` (for GFLOP/s), and the problem signature a winner is
    stored under: ``key`` (positions of the arguments whose values, for scalars, or
    sizes, for buffers, make it, as Triton's ``autotune(key=[...])``) or
    ``shape_key(args)``; with neither, every scalar and buffer size.
    """

    name: str
    source: str
    global_size: Callable[[Sequence[Any], Config], tuple[int, ...]]
    options: tuple[str, ...] = ()
    dims: int = 2
    default: Config = field(default_factory=Config)
    defines: Callable[[Config], Mapping[str, Any]] = standard_defines
    local_mem_bytes: Callable[[Config], int] | None = None
    constraint: Callable[[Sequence[Any], Config], str | None] | None = None
    tiles: Callable[[DeviceLimits], Sequence[tuple[int, ...] | None]] | None = None
    unrolls: Callable[[DeviceLimits], Sequence[int | None]] | None = None
    flops: Callable[[Sequence[Any]], float] | None = None
    shape_key: Callable[[Sequence[Any]], tuple] | None = None
    key: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "options", tunedb.normalize_options(self.options))
        if self.key is not None:
            object.__setattr__(self, "key", tuple(int(i) for i in self.key))

    def signature(self, args: Sequence[Any]) -> tuple:
        """The problem signature of ``args`` that a winner is stored and looked up under."""
        if self.shape_key is not None:
            return tuple(self.shape_key(args))
        if self.key is not None:
            return default_shape_key([args[i] for i in self.key])
        return default_shape_key(args)

    @property
    def source_hash(self) -> str:
        return tunedb.source_hash(self.source)

    def compile(self, config: Config | None = None, *, context: Any = None, device: Any = None,
                args: Sequence[Any] | None = None) -> Any:
        """Build through ``cltrace.compile``. ``config=None`` builds the base source, so a winner
        stored for this device, and for the signature of ``args`` when given, is applied; a
        config builds exactly that variant (its defines make a different tune-DB key, so no
        stored winner is merged into a trial)."""
        defines = None if config is None else dict(self.defines(config))
        tune_key = self.signature(args) if args is not None and config is None else None
        return _compile(self.source, self.options, context=context, device=device, defines=defines,
                        tune_key=tune_key)

    def config_of(self, program: Any) -> Config:
        """The configuration a program of this template was built with."""
        tuned = getattr(program, "tuned", None)
        if isinstance(tuned, Mapping) and isinstance(tuned.get("params"), Mapping):
            return Config.from_dict(tuned["params"])
        return self.default

    def launch(self, program: Any, queue: Any, args: Sequence[Any], config: Config | None = None) -> Any:
        """Enqueue the kernel with the global/local size its (tuned) configuration needs."""
        cfg = config if config is not None else self.config_of(program)
        gs = self.global_size(args, cfg)
        return program.kernel(self.name)[gs, cfg.workgroup, queue](*args)

    def fit(self, args: Sequence[Any], config: Config, limits: DeviceLimits) -> str | None:
        """Why ``config`` cannot run these args on this device, or None."""
        reason = fit_workgroup(config.workgroup, limits, self.dims)
        if reason:
            return reason
        if self.local_mem_bytes is not None:
            need = self.local_mem_bytes(config)
            if need > limits.local_mem_size:
                return (f"needs {need} B of local memory, the device has {limits.local_mem_size} B "
                        "(local_mem_size)")
        if self.constraint is not None:
            reason = self.constraint(args, config)
            if reason:
                return reason
        if config.workgroup is not None:
            gs = tuple(self.global_size(args, config))
            if len(gs) != len(config.workgroup) or any(g % w for g, w in zip(gs, config.workgroup)):
                return f"global size {fmt_dims(gs, '')} is not divisible by the work-group {fmt_dims(config.workgroup, '')}"
        return None


def default_shape_key(args: Sequence[Any]) -> tuple:
    """The scalars, buffer sizes and array shapes among ``args``: the signature when the kernel declares none."""
    key: list[Any] = []
    for a in args:
        if isinstance(a, (int, float, np.number)):
            key.append(a.item() if isinstance(a, np.number) else a)
        elif isinstance(a, cl.MemoryObjectHolder):
            key.append(("buffer", a.size))
        elif hasattr(a, "shape") and hasattr(a, "dtype"):
            key.append(("array", tuple(int(v) for v in a.shape), str(a.dtype)))
    return tuple(key)
