"""Autotuning: sweep a kernel's work-group shape, tile sizes and unroll factor on the device.

Every trial is built through ``cltrace.compile`` (the tile/unroll/work-group
values become ``-D`` defines, so builds are cached and show as compile spans),
launched ``n_warmup + n`` times without waiting per launch (one wait after the
first timed launch when a cutoff applies), and timed by its device events
(END - START). A candidate that does not fit the device, fails
to build, fails to launch or computes a wrong result becomes a failed trial
with its reason; the sweep goes on. The winner of a kernel-template sweep is
stored in the tune DB under the untuned (source, options, device+driver) key,
so a later ``cltrace.compile`` of the same source, in any process, builds the
tuned variant without being asked.

What can be tuned (``kernel_fn``):

* a ``KernelTemplate``: OpenCL C source whose performance knobs are
  compile-time defines (``TILE_X``/``TILE_Y``/``UNROLL``, and ``WG_X``/``WG_Y``
  for a fixed work-group shape), the kernel name, and how the global size
  follows from ``(args, config)``. The work-group shape is the local size
  (``None``: the driver chooses).
* a plain callable ``kernel_fn(config, *args) -> cl.Event`` (or a list of
  events) for sweeps cltrace cannot build itself; only the device limits are
  checked, the rest is up to the callable.
"""
from __future__ import annotations

import dataclasses
import itertools
import math
import re
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import pyopencl as cl

from . import tunedb
from .compiler import BuildError, compile as _compile, default_queue, device_key
from .queues import active_queue, require_profiling
from .regions import category_region
from .spans import AUTOTUNE, TRIAL
from .timing import _events_of, _span_ns

OK = "ok"
FAILED = "failed"
_KEYS = ("workgroup", "tile", "unroll")
_AXES = "XYZ"


def _dims(value: Any) -> tuple[int, ...] | None:
    if value is None:
        return None
    if isinstance(value, (int, np.integer)):
        return (int(value),)
    return tuple(int(v) for v in value)


def _fmt_dims(value: tuple[int, ...] | None, none: str) -> str:
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
        object.__setattr__(self, "workgroup", _dims(self.workgroup))
        object.__setattr__(self, "tile", _dims(self.tile))
        if self.unroll is not None:
            object.__setattr__(self, "unroll", int(self.unroll))

    def __getitem__(self, key: str) -> Any:
        if key not in _KEYS:
            raise KeyError(key)
        return getattr(self, key)

    def __iter__(self) -> Iterator[str]:
        return iter(_KEYS)

    def __len__(self) -> int:
        return len(_KEYS)

    def label(self) -> str:
        """Short human form, e.g. ``wg=8x4 tile=4x2 unroll=4`` (``wg=auto``: driver's choice)."""
        parts = [f"wg={_fmt_dims(self.workgroup, 'auto')}"]
        if self.tile is not None:
            parts.append(f"tile={_fmt_dims(self.tile, '-')}")
        if self.unroll is not None:
            parts.append(f"unroll={self.unroll}")
        return " ".join(parts)

    def as_dict(self) -> dict[str, Any]:
        """JSON-friendly form (tuples become lists)."""
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in zip(_KEYS, dataclasses.astuple(self))}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Config":
        return cls(**{k: d.get(k) for k in _KEYS})


def standard_defines(config: Config) -> dict[str, int]:
    """``TILE_X``/``TILE_Y``/``TILE_Z``, ``UNROLL`` and ``WG_X``/``WG_Y``/``WG_Z`` for a config."""
    out: dict[str, int] = {}
    for prefix, dims in (("TILE", config.tile), ("WG", config.workgroup)):
        for axis, v in zip(_AXES, dims or ()):
            out[f"{prefix}_{axis}"] = v
    if config.unroll is not None:
        out["UNROLL"] = config.unroll
    return out


@dataclass(frozen=True)
class DeviceLimits:
    """The limits candidate generation and the fit checks use, queried once per device.

    ``preferred_multiple`` and ``kernel_work_group_size`` come from a built kernel
    (``CL_KERNEL_PREFERRED_WORK_GROUP_SIZE_MULTIPLE`` / ``CL_KERNEL_WORK_GROUP_SIZE``)
    when one is known, else from the device.
    """

    device_key: str
    device_name: str
    max_work_group_size: int
    max_work_item_sizes: tuple[int, ...]
    local_mem_size: int
    preferred_vector_width: int
    preferred_multiple: int = 1
    kernel_work_group_size: int | None = None

    @classmethod
    def query(cls, device: Any, kernel: Any = None) -> "DeviceLimits":
        try:
            multiple = int(device.preferred_work_group_size_multiple)
        except (cl.Error, AttributeError):
            multiple = 1
        limits = cls(
            device_key=device_key(device),
            device_name=device.name.strip(),
            max_work_group_size=int(device.max_work_group_size),
            max_work_item_sizes=tuple(int(v) for v in device.max_work_item_sizes),
            local_mem_size=int(device.local_mem_size),
            preferred_vector_width=max(1, int(device.preferred_vector_width_float)),
            preferred_multiple=max(1, multiple),
        )
        return limits.with_kernel(kernel, device) if kernel is not None else limits

    def with_kernel(self, kernel: Any, device: Any) -> "DeviceLimits":
        info = cl.kernel_work_group_info
        return replace(
            self,
            preferred_multiple=max(1, int(kernel.get_work_group_info(info.PREFERRED_WORK_GROUP_SIZE_MULTIPLE, device))),
            kernel_work_group_size=int(kernel.get_work_group_info(info.WORK_GROUP_SIZE, device)),
        )

    def workgroup_candidates(self, dims: int = 2, count: int = 3) -> list[tuple[int, ...] | None]:
        """``None`` (driver's choice), then ``count`` shapes of m, 4m, 16m... work-items.

        m is the preferred multiple; each size gets its most square shape that
        fits ``max_work_item_sizes``; sizes over the (kernel's) maximum are left out.
        """
        cap = self.max_work_group_size
        if self.kernel_work_group_size:
            cap = min(cap, self.kernel_work_group_size)
        out: list[tuple[int, ...] | None] = [None]
        size = self.preferred_multiple
        while len(out) <= count and size <= cap:
            shape = _squarest(size, dims, self.max_work_item_sizes)
            if shape is not None and shape not in out:
                out.append(shape)
            size *= 4
        return out

    def tile_candidates(self, dims: int = 2) -> list[tuple[int, ...]]:
        """Powers of two per axis: up to the preferred vector width (at least 4) along X, up to 4 along the rest."""
        xs = _pow2_upto(max(4, self.preferred_vector_width))
        rest = _pow2_upto(4)
        axes = [xs] + [rest] * (dims - 1)
        return list(itertools.product(*axes))

    @staticmethod
    def unroll_candidates() -> list[int]:
        return [1, 2, 4, 8]


def _pow2_upto(n: int) -> list[int]:
    out, v = [], 1
    while v <= n:
        out.append(v)
        v *= 2
    return out


def _squarest(size: int, dims: int, max_items: Sequence[int]) -> tuple[int, ...] | None:
    """The shape of ``size`` work-items closest to a square (ties: larger X first) within ``max_items``."""
    fits = [s for s in _factorizations(size, dims) if all(v <= m for v, m in zip(s, max_items))]
    if not fits:
        return None
    return min(fits, key=lambda s: (max(s) / min(s), tuple(-v for v in s)))


def _factorizations(size: int, dims: int) -> Iterator[tuple[int, ...]]:
    if dims == 1:
        yield (size,)
        return
    for d in range(1, size + 1):
        if size % d == 0:
            for rest in _factorizations(size // d, dims - 1):
                yield (d,) + rest


def _default_shape_key(args: Sequence[Any]) -> tuple:
    key: list[Any] = []
    for a in args:
        if isinstance(a, (int, float, np.number)):
            key.append(a.item() if isinstance(a, np.number) else a)
        elif isinstance(a, cl.MemoryObjectHolder):
            key.append(("buffer", a.size))
    return tuple(key)


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
    device), ``flops(args)`` (for GFLOP/s) and ``shape_key(args)``.
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

    def __post_init__(self) -> None:
        object.__setattr__(self, "options", tunedb.normalize_options(self.options))

    @property
    def source_hash(self) -> str:
        return tunedb.source_hash(self.source)

    def compile(self, config: Config | None = None, *, context: Any = None, device: Any = None) -> Any:
        """Build through ``cltrace.compile``. ``config=None`` builds the base source, so a winner
        stored for this device is applied; a config builds exactly that variant (its defines
        make a different tune-DB key, so no stored winner is merged into a trial)."""
        defines = None if config is None else dict(self.defines(config))
        return _compile(self.source, self.options, context=context, device=device, defines=defines)

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
        reason = _fit_workgroup(config, limits, self.dims)
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
                return f"global size {_fmt_dims(gs, '')} is not divisible by the work-group {_fmt_dims(config.workgroup, '')}"
        return None


def _fit_workgroup(config: Config, limits: DeviceLimits, dims: int | None) -> str | None:
    wg = config.workgroup
    if wg is None:
        return None
    label = _fmt_dims(wg, "")
    if any(w < 1 for w in wg):
        return f"work-group {label} has a dimension < 1"
    if dims is not None and len(wg) != dims:
        return f"work-group {label} has {len(wg)} dimensions, the kernel has {dims}"
    if len(wg) > len(limits.max_work_item_sizes):
        return f"work-group {label} has more dimensions than the device ({len(limits.max_work_item_sizes)})"
    total = math.prod(wg)
    if total > limits.max_work_group_size:
        return f"work-group {label} = {total} work-items exceeds max_work_group_size {limits.max_work_group_size}"
    for axis, (w, m) in enumerate(zip(wg, limits.max_work_item_sizes)):
        if w > m:
            return f"work-group {label}: {w} exceeds max_work_item_sizes[{axis}] = {m}"
    return None


@dataclass(frozen=True)
class Trial:
    """One measured (or failed) configuration. Times are device ns (event END - START)."""

    config: Config
    status: str
    reason: str | None = None
    stage: str | None = None  # where a failed trial stopped: "limits", "build", "launch", "check"
    times_ns: tuple[int, ...] = ()
    mean_ns: float | None = None
    std_ns: float | None = None
    min_ns: int | None = None
    compile_ns: int | None = None
    from_cache: bool | None = None

    @classmethod
    def measured(cls, config: Config, times_ns: Sequence[int], **kw: Any) -> "Trial":
        ts = tuple(int(t) for t in times_ns)
        mean = sum(ts) / len(ts)
        std = math.sqrt(sum((t - mean) ** 2 for t in ts) / (len(ts) - 1)) if len(ts) > 1 else 0.0
        return cls(config, OK, times_ns=ts, mean_ns=mean, std_ns=std, min_ns=min(ts), **kw)

    @classmethod
    def failed(cls, config: Config, stage: str, reason: str, **kw: Any) -> "Trial":
        return cls(config, FAILED, reason=reason, stage=stage, **kw)

    @property
    def ok(self) -> bool:
        return self.status == OK

    def gflops(self, flops: float | None) -> float | None:
        if not flops or not self.mean_ns:
            return None
        return flops / self.mean_ns

    def as_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["config"] = self.config.as_dict()
        d["times_ns"] = list(self.times_ns)
        return d


@dataclass(frozen=True)
class AutotuneResult:
    """The winner (``best_config``) and every trial in the order run (``measurements``)."""

    best_config: Config | None
    measurements: tuple[Trial, ...]
    kernel: str
    device: str
    shape_key: tuple | None = None
    flops: float | None = None
    baseline: Config | None = None
    strategy: str = "grid"
    persisted: str | None = None

    @property
    def best(self) -> Trial | None:
        return self.trial(self.best_config) if self.best_config is not None else None

    @property
    def baseline_trial(self) -> Trial | None:
        return self.trial(self.baseline) if self.baseline is not None else None

    def trial(self, config: Config) -> Trial | None:
        for t in self.measurements:
            if t.config == config:
                return t
        return None

    def ranked(self) -> list[Trial]:
        """Successful trials, fastest (lowest mean) first."""
        return sorted((t for t in self.measurements if t.ok), key=lambda t: t.mean_ns)

    def failures(self) -> list[Trial]:
        return [t for t in self.measurements if not t.ok]

    def speedup(self) -> float | None:
        """Baseline mean / best mean, when both ran."""
        b, w = self.baseline_trial, self.best
        if b is None or w is None or not b.ok or not w.ok:
            return None
        return b.mean_ns / w.mean_ns

    def table(self, top: int | None = None) -> str:
        """Ranked text table of the trials (fastest first), then the failed ones with reasons."""
        ranked = self.ranked()
        fails = self.failures()
        shape = f" shape={_fmt_dims(self.shape_key, '-')}" if self.shape_key and all(
            isinstance(v, int) for v in self.shape_key) else ""
        lines = [f"autotune {self.kernel} on {self.device}{shape} ({self.strategy}): "
                 f"{len(ranked)} ok, {len(fails)} failed"]
        base = self.baseline_trial
        head = (f"{'#':>3}  {'workgroup':<10} {'tile':<7} {'unroll':>6} {'mean':>11} {'std':>10} "
                f"{'min':>11} {'runs':>5}")
        if self.flops:
            head += f" {'GFLOP/s':>9}"
        if base is not None and base.ok:
            head += f" {'vs base':>8}"
        lines += [head, "-" * len(head)]
        for i, t in enumerate(ranked[:top] if top else ranked, 1):
            c = t.config
            row = (f"{i:>3}  {_fmt_dims(c.workgroup, 'auto'):<10} {_fmt_dims(c.tile, '-'):<7} "
                   f"{'-' if c.unroll is None else c.unroll:>6} {_ns(t.mean_ns):>11} {_ns(t.std_ns):>10} "
                   f"{_ns(t.min_ns):>11} {len(t.times_ns):>5}")
            if self.flops:
                row += f" {t.gflops(self.flops):>9.2f}"
            if base is not None and base.ok:
                row += f" {base.mean_ns / t.mean_ns:>7.2f}x"
            marks = (["best"] if c == self.best_config else []) + (["baseline"] if c == self.baseline else [])
            if marks:
                row += "  <- " + ", ".join(marks)
            lines.append(row)
        if top and len(ranked) > top:
            lines.append(f"     ... {len(ranked) - top} more")
        if fails:
            lines.append("failed:")
            for t in fails:
                lines.append(f"     {t.config.label():<34} [{t.stage}] {t.reason}")
        return "\n".join(lines)

    def plot(self, path: str) -> str:
        """Save a bar chart of the sweep (mean ± std per trial, fastest first) to ``path``."""
        try:
            import matplotlib

            matplotlib.use("Agg", force=False)
            import matplotlib.pyplot as plt
        except ImportError:
            raise ImportError("AutotuneResult.plot needs matplotlib: pip install 'cltrace[plot]'") from None
        ranked = self.ranked()
        if not ranked:
            raise ValueError("AutotuneResult.plot: no successful trial to plot")
        use_gflops = bool(self.flops)
        vals = [t.gflops(self.flops) if use_gflops else t.mean_ns / 1e6 for t in ranked]
        errs = [(t.std_ns / t.mean_ns) * v for t, v in zip(ranked, vals)]
        colors = ["tab:green" if t.config == self.best_config else
                  "tab:orange" if t.config == self.baseline else "tab:blue" for t in ranked]
        fig, ax = plt.subplots(figsize=(8, max(2.5, 0.28 * len(ranked) + 1.2)))
        ys = list(range(len(ranked)))
        ax.barh(ys, vals, xerr=errs, color=colors)
        ax.set_yticks(ys, [t.config.label() for t in ranked], fontsize=7)
        ax.invert_yaxis()
        ax.set_xlabel("GFLOP/s (device time)" if use_gflops else "mean device time per launch (ms)")
        from matplotlib.patches import Patch

        ax.legend(handles=[Patch(color="tab:green", label="best"), Patch(color="tab:orange", label="baseline"),
                           Patch(color="tab:blue", label="trial")], loc="lower right", fontsize=7)
        fails = len(self.failures())
        ax.set_title(f"autotune {self.kernel} on {self.device}: {len(ranked)} ok, {fails} failed", fontsize=9)
        fig.tight_layout()
        fig.savefig(path)
        plt.close(fig)
        return path

    def as_dict(self) -> dict[str, Any]:
        return {
            "kernel": self.kernel, "device": self.device, "strategy": self.strategy,
            "shape_key": list(self.shape_key) if self.shape_key is not None else None,
            "flops": self.flops, "persisted": self.persisted,
            "best_config": self.best_config.as_dict() if self.best_config is not None else None,
            "baseline": self.baseline.as_dict() if self.baseline is not None else None,
            "measurements": [t.as_dict() for t in self.measurements],
        }


def _ns(ns: float | None) -> str:
    if ns is None:
        return "-"
    if ns >= 1e6:
        return f"{ns / 1e6:.3f}ms"
    if ns >= 1e3:
        return f"{ns / 1e3:.2f}us"
    return f"{ns:.0f}ns"


class _Output:
    """The buffer a kernel writes, poisoned before each trial and read back after it."""

    def __init__(self, output: Any, reference: Any) -> None:
        import pyopencl.array as cla

        if isinstance(output, cla.Array):
            self.buffer, self.shape, self.dtype = output.base_data, output.shape, output.dtype
            self.offset = output.offset
        elif isinstance(output, cl.MemoryObjectHolder):
            if reference is None:
                raise ValueError("autotune: output= is a plain cl.Buffer, so reference= is needed "
                                 "(its shape and dtype say how to read the buffer); or pass a pyopencl Array")
            ref = np.asarray(reference)
            self.buffer, self.shape, self.dtype, self.offset = output, ref.shape, ref.dtype, 0
        else:
            raise TypeError(f"autotune: output= must be a cl.Buffer or pyopencl Array, not {type(output).__name__}")
        self.nbytes = int(np.prod(self.shape)) * np.dtype(self.dtype).itemsize
        self.reference = None if reference is None else np.asarray(reference)

    def poison(self, queue: Any) -> None:
        cl.enqueue_fill_buffer(queue, self.buffer, np.uint8(0xFF), self.offset, self.nbytes)

    def read(self, queue: Any) -> np.ndarray:
        host = np.empty(self.shape, self.dtype)
        cl.enqueue_copy(queue, host, self.buffer, src_offset=self.offset)
        return host


def compare(got: np.ndarray, want: np.ndarray, rtol: float, atol: float) -> str | None:
    """None when ``got`` matches ``want`` within tolerance, else what is wrong."""
    got = np.asarray(got).reshape(np.shape(want))
    bad = ~np.isclose(got, want, rtol=rtol, atol=atol)
    if not bad.any():
        return None
    idx = tuple(int(i) for i in np.unravel_index(int(np.argmax(bad)), bad.shape))
    return (f"wrong result: {int(bad.sum())} of {bad.size} elements differ "
            f"(first at {idx}: {got[idx].item()!r}, expected {want[idx].item()!r})")


_LOCATION = re.compile(r"^\S+?:\d+:\d+:\s*")


def _first_error(log: str, limit: int = 200) -> str:
    """The first error line of a build log, without the compiler's temporary file location."""
    lines = [ln.strip() for ln in (log or "").splitlines() if ln.strip()]
    for line in lines:
        head, sep, rest = line.partition("error:")
        if sep:
            return ("error: " + _LOCATION.sub("", rest.strip()))[:limit]
    return lines[0][:limit] if lines else ""


class Autotuner:
    """A reusable tuner: one queue, device limits queried once, best configs remembered.

    Use ``tune()`` per kernel and shape; ``best(template, shape_key)`` answers
    from this tuner's sweeps, then from the tune DB (other processes' sweeps).
    ``queue`` None: the active queue (``cltrace.set_queue``), else cltrace's default
    profiling queue. ``cutoff``: a trial whose first timed launch takes more than ``cutoff`` times the
    best mean so far stops there (one timed run, shown in the table); None: always ``n``.
    """

    def __init__(self, queue: Any = None, *, n_warmup: int = 3, n: int = 20, strategy: str = "grid",
                 progress: bool | None = None, persist: bool = True, cutoff: float | None = 4.0) -> None:
        queue = queue if queue is not None else active_queue() or default_queue()
        require_profiling(queue, "Autotuner")
        self.queue = queue
        self.context = queue.context
        self.device = queue.device
        self.limits = DeviceLimits.query(self.device)
        self.n_warmup = n_warmup
        self.n = n
        self.strategy = strategy
        self.progress = progress
        self.persist = persist
        self.cutoff = cutoff
        self._results: dict[tuple, AutotuneResult] = {}
        self._kernel_limits: dict[tuple, DeviceLimits] = {}

    # ---- search space -----------------------------------------------------------
    def limits_for(self, template: KernelTemplate) -> DeviceLimits:
        """Device limits refined by the template's built default kernel (preferred multiple, max size)."""
        key = (template.source_hash, template.options, template.name)
        lim = self._kernel_limits.get(key)
        if lim is None:
            program = template.compile(template.default, context=self.context, device=self.device)
            raw = cl.Kernel(program.program, template.name)
            lim = self._kernel_limits[key] = self.limits.with_kernel(raw, self.device)
        return lim

    def space(self, kernel_fn: Any, workgroup_sizes: Sequence[Any] | None = None,
              tile_sizes: Sequence[Any] | None = None,
              unroll_factors: Sequence[Any] | None = None) -> dict[str, list[Any]]:
        """The values swept per parameter. A list given is used as is; ``None`` is generated:
        work-group shapes from the device (and kernel) limits; for a template also tiles and
        unroll factors (the template's own lists, else powers of two); for a callable,
        tile and unroll are then not swept."""
        template = kernel_fn if isinstance(kernel_fn, KernelTemplate) else None
        lim = self.limits_for(template) if template is not None and workgroup_sizes is None else self.limits
        if workgroup_sizes is None:
            wgs: list[Any] = lim.workgroup_candidates(template.dims if template else 2)
        else:
            wgs = [_dims(w) for w in workgroup_sizes]
        if tile_sizes is not None:
            tiles: list[Any] = [_dims(t) for t in tile_sizes]
        elif template is None:
            tiles = [None]
        else:
            tiles = list(template.tiles(lim)) if template.tiles else lim.tile_candidates(template.dims)
        if unroll_factors is not None:
            unrolls: list[Any] = [None if u is None else int(u) for u in unroll_factors]
        elif template is None:
            unrolls = [None]
        else:
            unrolls = list(template.unrolls(lim)) if template.unrolls else lim.unroll_candidates()
        return {"workgroup": _dedupe(wgs), "tile": _dedupe(tiles), "unroll": _dedupe(unrolls)}

    def candidates(self, kernel_fn: Any, workgroup_sizes: Sequence[Any] | None = None,
                   tile_sizes: Sequence[Any] | None = None,
                   unroll_factors: Sequence[Any] | None = None) -> list[Config]:
        """Every configuration of the grid, in sweep order (work-group, then tile, then unroll)."""
        sp = self.space(kernel_fn, workgroup_sizes, tile_sizes, unroll_factors)
        return [Config(w, t, u) for w, t, u in itertools.product(sp["workgroup"], sp["tile"], sp["unroll"])]

    # ---- sweeps -----------------------------------------------------------------
    def tune(self, kernel_fn: Any, args: Sequence[Any] = (), workgroup_sizes: Sequence[Any] | None = None,
             tile_sizes: Sequence[Any] | None = None, unroll_factors: Sequence[Any] | None = None, *,
             n_warmup: int | None = None, n: int | None = None, strategy: str | None = None,
             baseline: bool | Config | None = True, output: Any = None, reference: Any = None,
             rtol: float = 1e-3, atol: float = 1e-4, flops: float | None = None,
             shape_key: tuple | None = None, progress: bool | None = None,
             persist: bool | None = None) -> AutotuneResult:
        """Sweep ``kernel_fn`` over its configurations on ``args``; the lowest mean device time wins.

        ``strategy``: ``"grid"`` runs every candidate (same configs, same order, every
        time); ``"coordinate"`` starts from the baseline and sweeps one parameter at a
        time around the best so far (every tile, then every unroll factor, then every
        work-group): far fewer builds on a large space, at the risk of a local optimum.
        ``baseline=True`` also measures a template's untuned ``default`` (or pass a
        Config), so the result says what tuning bought. With ``output`` (the buffer the
        kernel writes, a pyopencl Array or a cl.Buffer) each trial's result is checked
        against ``reference`` (or the first successful trial's) and a mismatch fails it.
        """
        template = kernel_fn if isinstance(kernel_fn, KernelTemplate) else None
        if template is None and not callable(kernel_fn):
            raise TypeError("autotune: kernel_fn must be a cltrace.KernelTemplate or a callable "
                            f"kernel_fn(config, *args) -> cl.Event, not {type(kernel_fn).__name__}")
        args = tuple(args)
        n_warmup = self.n_warmup if n_warmup is None else n_warmup
        n = self.n if n is None else n
        if n < 1 or n_warmup < 0:
            raise ValueError("autotune: need n >= 1 timed runs and n_warmup >= 0")
        strategy = strategy or self.strategy
        if strategy not in ("grid", "coordinate"):
            raise ValueError(f"autotune: strategy must be 'grid' or 'coordinate', not {strategy!r}")
        name = template.name if template else getattr(kernel_fn, "__name__", type(kernel_fn).__name__)
        if shape_key is None:
            shape_key = template.shape_key(args) if template and template.shape_key else _default_shape_key(args)
        if flops is None and template is not None and template.flops is not None:
            flops = template.flops(args)
        base: Config | None
        if isinstance(baseline, Config):
            base = baseline
        elif baseline and template is not None:
            base = template.default
        else:
            base = None
        out = _Output(output, reference) if output is not None else None
        show = self.progress if progress is None else progress
        if show is None:
            show = sys.stderr.isatty()

        with category_region(f"autotune {name}", self.queue, {"kernel": name, "device": self.limits.device_key,
                                                              "strategy": strategy}, AUTOTUNE) as region:
            sp = self.space(kernel_fn, workgroup_sizes, tile_sizes, unroll_factors)
            runner = _Runner(self, kernel_fn, template, args, n_warmup, n, out, rtol, atol)
            if strategy == "grid":
                grid = [Config(w, t, u) for w, t, u in itertools.product(sp["workgroup"], sp["tile"], sp["unroll"])]
                todo = ([base] if base is not None and base not in grid else []) + grid
                total = len(todo)
            else:
                todo = []
                start = base or _first(sp)
                total = 1 + sum(len(sp[k]) - (start[k] in sp[k]) for k in _KEYS)
            bar = _progress(show, total, f"autotune {name}")
            try:
                runner.on_trial = lambda t: _tick(bar, runner)
                if strategy == "grid":
                    for cfg in todo:
                        runner.run(cfg)
                else:
                    _coordinate(runner, sp, base)
            finally:
                if bar is not None:
                    bar.close()
            best = runner.best_config()
            region.set("trials", len(runner.trials))
            region.set("best", best.label() if best is not None else None)

        persisted = None
        if template is not None and best is not None and (self.persist if persist is None else persist):
            persisted = self._store(template, best, runner.trial_of(best), shape_key)
        result = AutotuneResult(best, tuple(runner.trials), name, self.limits.device_key, shape_key,
                                flops, base, strategy, persisted)
        self._results[(_fn_key(kernel_fn), shape_key)] = result
        self._results[(_fn_key(kernel_fn), None)] = result
        return result

    def measure(self, kernel_fn: Any, args: Sequence[Any], config: Config, *, n_warmup: int | None = None,
                n: int | None = None, output: Any = None, reference: Any = None,
                rtol: float = 1e-3, atol: float = 1e-4) -> Trial:
        """Run one configuration as a trial (traced like a sweep's trials)."""
        template = kernel_fn if isinstance(kernel_fn, KernelTemplate) else None
        out = _Output(output, reference) if output is not None else None
        runner = _Runner(self, kernel_fn, template, tuple(args), self.n_warmup if n_warmup is None else n_warmup,
                         self.n if n is None else n, out, rtol, atol)
        return runner.run(config)

    # ---- best known -------------------------------------------------------------
    def best(self, kernel_fn: Any, shape_key: tuple | None = None) -> Config | None:
        """Best known config: from this tuner's sweeps, else (templates) the tune DB entry for this
        device and driver, if it was tuned for ``shape_key`` (any shape when None)."""
        hit = self._results.get((_fn_key(kernel_fn), shape_key))
        if hit is not None:
            return hit.best_config
        if not isinstance(kernel_fn, KernelTemplate):
            return None
        entry = tunedb.lookup(kernel_fn.source_hash, kernel_fn.options, self.limits.device_key)
        if not entry or not isinstance(entry.get("params"), Mapping):
            return None
        stored_shape = entry.get("shape")
        if shape_key is not None and (stored_shape is None or tuple(stored_shape) != tuple(shape_key)):
            return None
        return Config.from_dict(entry["params"])

    def result(self, kernel_fn: Any, shape_key: tuple | None = None) -> AutotuneResult | None:
        """The last sweep of ``kernel_fn`` (for ``shape_key``) run by this tuner."""
        return self._results.get((_fn_key(kernel_fn), shape_key))

    def _store(self, template: KernelTemplate, best: Config, trial: Trial | None, shape_key: tuple | None) -> str:
        config = {
            "defines": dict(template.defines(best)),
            "local_size": list(best.workgroup) if best.workgroup is not None else None,
            "params": best.as_dict(),
            "kernel": template.name,
            "shape": _jsonable_key(shape_key),
            "mean_ns": trial.mean_ns if trial is not None else None,
        }
        return tunedb.store(template.source_hash, template.options, self.limits.device_key, config,
                            extra={"tuned_at_unix": time.time()})


def _jsonable_key(key: tuple | None) -> list | None:
    if key is None:
        return None
    return [list(k) if isinstance(k, tuple) else k for k in key]


def _fn_key(kernel_fn: Any) -> Any:
    if isinstance(kernel_fn, KernelTemplate):
        return ("template", kernel_fn.source_hash, kernel_fn.options, kernel_fn.name)
    return ("callable", kernel_fn)


def _dedupe(values: list[Any]) -> list[Any]:
    out: list[Any] = []
    for v in values:
        if v not in out:
            out.append(v)
    return out


def _progress(show: bool, total: int, desc: str) -> Any:
    if not show:
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="trial", file=sys.stderr, leave=False, dynamic_ncols=True)


def _tick(bar: Any, runner: "_Runner") -> None:
    if bar is None:
        return
    best = runner.trial_of(runner.best_config()) if runner.best_config() is not None else None
    if best is not None:
        bar.set_postfix_str(f"best {best.config.label()} {_ns(best.mean_ns)}", refresh=False)
    bar.update(1)


def _first(sp: dict[str, list[Any]]) -> Config:
    return Config(sp["workgroup"][0], sp["tile"][0], sp["unroll"][0])


def _coordinate(runner: "_Runner", sp: dict[str, list[Any]], start: Config | None) -> None:
    """One pass: every tile around the start, then every unroll factor around the best so far,
    then every work-group shape around the best so far."""
    if start is None:
        start = _first(sp)
    runner.run(start)
    for key in ("tile", "unroll", "workgroup"):
        for value in sp[key]:
            cfg = replace(runner.best_config() or start, **{key: value})
            if runner.trial_of(cfg) is None:
                runner.run(cfg)


class _Runner:
    """Runs trials for one sweep and keeps them in order."""

    def __init__(self, tuner: Autotuner, kernel_fn: Any, template: KernelTemplate | None, args: tuple,
                 n_warmup: int, n: int, out: _Output | None, rtol: float, atol: float) -> None:
        self.tuner = tuner
        self.kernel_fn = kernel_fn
        self.template = template
        self.args = args
        self.n_warmup = n_warmup
        self.n = n
        self.out = out
        self.rtol = rtol
        self.atol = atol
        self.reference = out.reference if out is not None else None
        self.trials: list[Trial] = []
        self._by_config: dict[Config, Trial] = {}
        self.on_trial: Callable[[Trial], None] | None = None

    def trial_of(self, config: Config | None) -> Trial | None:
        return self._by_config.get(config) if config is not None else None

    def best_config(self) -> Config | None:
        ok = [t for t in self.trials if t.ok]
        return min(ok, key=lambda t: t.mean_ns).config if ok else None

    def run(self, config: Config) -> Trial:
        q = self.tuner.queue
        with category_region(f"trial {config.label()}", q, dict(config.as_dict()), TRIAL) as region:
            trial = self._trial(config)
            region.set("status", trial.status)
            if trial.ok:
                region.set("mean_ns", trial.mean_ns)
            else:
                region.set("stage", trial.stage)
                region.set("reason", trial.reason)
        self.trials.append(trial)
        self._by_config[config] = trial
        if self.on_trial is not None:
            self.on_trial(trial)
        return trial

    def _trial(self, config: Config) -> Trial:
        limits = self.tuner.limits
        tpl = self.template
        reason = tpl.fit(self.args, config, limits) if tpl is not None else _fit_workgroup(config, limits, None)
        if reason:
            return Trial.failed(config, "limits", reason)
        build: dict[str, Any] = {}
        if tpl is not None:
            try:
                program = tpl.compile(config, context=self.tuner.context, device=self.tuner.device)
            except BuildError as exc:
                log = getattr(exc, "build_log", "") or str(exc)
                return Trial.failed(config, "build", f"build failed: {_first_error(log) or exc}")
            build = {"compile_ns": getattr(program, "compile_ns", None),
                     "from_cache": getattr(program, "from_cache", None)}
            knl = program.kernel(tpl.name)
            if config.workgroup is not None:
                raw = cl.Kernel(program.program, tpl.name)
                kmax = int(raw.get_work_group_info(cl.kernel_work_group_info.WORK_GROUP_SIZE, self.tuner.device))
                if math.prod(config.workgroup) > kmax:
                    return Trial.failed(config, "limits", f"work-group {_fmt_dims(config.workgroup, '')} exceeds "
                                        f"this kernel's CL_KERNEL_WORK_GROUP_SIZE {kmax}", **build)
            gs = tuple(tpl.global_size(self.args, config))
            launcher = knl[gs, config.workgroup, self.tuner.queue]

            def call() -> Any:
                return launcher(*self.args)
        else:
            fn = self.kernel_fn

            def call() -> Any:
                return fn(config, *self.args)

        q = self.tuner.queue
        if self.out is not None:
            self.out.poison(q)
        calls: list[list[Any]] = []

        def enqueue(count: int) -> None:
            for _ in range(count):
                res = call()
                evs = _events_of(res)
                if evs is None:
                    raise TypeError(f"autotune: kernel_fn must return a cl.Event or a list of them, "
                                    f"got {type(res).__name__}")
                calls.append(evs)
            cl.wait_for_events([e for evs in calls[-count:] for e in evs])

        best = self.trial_of(self.best_config())
        cutoff = self.tuner.cutoff
        try:
            if cutoff and best is not None and self.n > 1:
                enqueue(self.n_warmup + 1)
                if _span_ns(calls[-1]) <= cutoff * best.mean_ns:
                    enqueue(self.n - 1)
            else:
                enqueue(self.n_warmup + self.n)
        except cl.Error as exc:
            _drain(calls)
            return Trial.failed(config, "launch", f"launch failed: {exc}", **build)
        for evs in calls:
            for e in evs:
                if e.command_execution_status < 0:
                    return Trial.failed(config, "launch", f"command failed with status "
                                        f"{e.command_execution_status}", **build)
        times = [_span_ns(evs) for evs in calls[self.n_warmup:]]
        if self.out is not None:
            got = self.out.read(q)
            if self.reference is None:
                self.reference = got
            else:
                wrong = compare(got, self.reference, self.rtol, self.atol)
                if wrong:
                    return Trial.failed(config, "check", wrong, times_ns=tuple(times), **build)
        return Trial.measured(config, times, **build)


def _drain(calls: list[list[Any]]) -> None:
    """Wait for what was enqueued before a launch failed, ignoring the failures."""
    for evs in calls:
        for e in evs:
            try:
                e.wait()
            except cl.Error:
                pass


def autotune(kernel_fn: Any, args: Sequence[Any] = (), workgroup_sizes: Sequence[Any] | None = None,
             tile_sizes: Sequence[Any] | None = None, unroll_factors: Sequence[Any] | None = None,
             n_warmup: int = 3, n: int = 20, *, queue: Any = None, cutoff: float | None = 4.0,
             **kw: Any) -> AutotuneResult:
    """One-shot sweep: ``Autotuner(queue).tune(kernel_fn, args, ...)``; ``kw`` as for ``Autotuner.tune``.

    ``queue`` None: the active queue (``cltrace.set_queue``), else cltrace's default profiling queue.
    """
    return Autotuner(queue, n_warmup=n_warmup, n=n, cutoff=cutoff).tune(kernel_fn, args, workgroup_sizes,
                                                                        tile_sizes, unroll_factors, **kw)
