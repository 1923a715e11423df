"""``Autotuner``: sweeps a kernel's configurations on one queue, keeps the best, stores a template's winner.

The winner of a kernel-template sweep is stored in the tune DB under the untuned
(source, options, device+driver) key, so a later ``cltrace.compile`` of the same
source, in any process, builds the tuned variant without being asked.
"""
from __future__ import annotations

import sys
import time
from collections.abc import Mapping
from typing import Any, Sequence

import pyopencl as cl

from ..programs import tunedb
from ..programs.compiler import default_queue
from ..record.queues import active_queue, require_profiling
from ..record.regions import category_region
from ..timeline.spans import AUTOTUNE
from .check import OutputCheck
from .config import Config, as_dims
from .limits import DeviceLimits
from .progress import progress_bar, tick
from .result import AutotuneResult, Trial
from .runner import TrialRunner
from .sweep import STRATEGIES, grid, plan
from .template import KernelTemplate, default_shape_key


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
            wgs = [as_dims(w) for w in workgroup_sizes]
        if tile_sizes is not None:
            tiles: list[Any] = [as_dims(t) for t in tile_sizes]
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
        return grid(self.space(kernel_fn, workgroup_sizes, tile_sizes, unroll_factors))

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
        if strategy not in STRATEGIES:
            raise ValueError(f"autotune: strategy must be 'grid' or 'coordinate', not {strategy!r}")
        name = template.name if template else getattr(kernel_fn, "__name__", type(kernel_fn).__name__)
        if shape_key is None:
            shape_key = template.shape_key(args) if template and template.shape_key else default_shape_key(args)
        if flops is None and template is not None and template.flops is not None:
            flops = template.flops(args)
        base: Config | None
        if isinstance(baseline, Config):
            base = baseline
        elif baseline and template is not None:
            base = template.default
        else:
            base = None
        out = OutputCheck(output, reference) if output is not None else None
        show = self.progress if progress is None else progress
        if show is None:
            show = sys.stderr.isatty()

        with category_region(f"autotune {name}", self.queue, {"kernel": name, "device": self.limits.device_key,
                                                              "strategy": strategy}, AUTOTUNE) as region:
            sp = self.space(kernel_fn, workgroup_sizes, tile_sizes, unroll_factors)
            runner = TrialRunner(self, kernel_fn, args, n_warmup, n, out, rtol, atol)
            total, run = plan(strategy, sp, base)
            bar = progress_bar(show, total, f"autotune {name}")
            try:
                runner.on_trial = lambda t: tick(bar, runner.trial_of(runner.best_config()))
                run(runner)
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
        out = OutputCheck(output, reference) if output is not None else None
        runner = TrialRunner(self, kernel_fn, args, self.n_warmup if n_warmup is None else n_warmup,
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


def autotune(kernel_fn: Any, args: Sequence[Any] = (), workgroup_sizes: Sequence[Any] | None = None,
             tile_sizes: Sequence[Any] | None = None, unroll_factors: Sequence[Any] | None = None,
             n_warmup: int = 3, n: int = 20, *, queue: Any = None, cutoff: float | None = 4.0,
             **kw: Any) -> AutotuneResult:
    """One-shot sweep: ``Autotuner(queue).tune(kernel_fn, args, ...)``; ``kw`` as for ``Autotuner.tune``.

    ``queue`` None: the active queue (``cltrace.set_queue``), else cltrace's default profiling queue.
    """
    return Autotuner(queue, n_warmup=n_warmup, n=n, cutoff=cutoff).tune(kernel_fn, args, workgroup_sizes,
                                                                        tile_sizes, unroll_factors, **kw)
