"""``Autotuner``: sweeps a kernel's configurations on one queue, confirms the fastest, stores a real win.

The winner of a kernel-template sweep is stored in the tune DB under the untuned
(source, options, device+driver) key and the problem signature, only when it
beats the untuned default by more than the noise, so a later ``cltrace.compile``
of the same source for that problem, in any process, builds the tuned variant
without being asked; ``verify`` re-measures a stored winner and evicts it when
it no longer wins.
"""
from __future__ import annotations

import logging
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Sequence

import pyopencl as cl

from ..programs import tunedb
from ..programs.compiler import default_queue
from ..programs.options import tuned_problem
from ..record.queues import active_queue, require_profiling
from ..record.regions import category_region
from ..timeline.spans import AUTOTUNE
from ..analyzers.report import format_ns
from .check import OutputCheck
from .config import Config, as_dims, fmt_dims
from .confirm import confirm, decide
from .limits import DeviceLimits
from .progress import progress_bar, tick
from .result import AutotuneResult, Confirmation, Trial, preferred
from .runner import TrialRunner
from .sweep import STRATEGIES, grid, plan
from .template import KernelTemplate, default_shape_key

log = logging.getLogger("cltrace")


class Autotuner:
    """A reusable tuner: one queue, device limits queried once, best configs remembered.

    Use ``tune()`` per kernel and shape; ``best(template, shape_key)`` answers
    from this tuner's sweeps, then from the tune DB (other processes' sweeps);
    ``verify()`` re-measures a stored winner and evicts it if it no longer wins.
    ``queue`` None: the active queue (``cltrace.set_queue``), else cltrace's default
    profiling queue. ``cutoff``: a trial whose first timed launch takes more than ``cutoff`` times the
    best median so far stops there (one timed run, shown in the table); None: always ``n``.
    ``confirm``: how many of the sweep's fastest are re-measured with the untuned default
    in ``rounds`` interleaved rounds of ``round_runs`` launches each (0: decide on the
    sweep's own figures). ``tolerance``: medians closer than this fraction are a tie (and a
    win over the default must exceed it), so differences of a few percent do not flip winners.
    """

    def __init__(self, queue: Any = None, *, n_warmup: int = 3, n: int = 20, strategy: str = "grid",
                 progress: bool | None = None, persist: bool = True, cutoff: float | None = 4.0,
                 confirm: int = 5, rounds: int = 5, round_runs: int = 3, tolerance: float = 0.05) -> None:
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
        if confirm < 0 or rounds < 1 or round_runs < 1 or not 0 <= tolerance < 1:
            raise ValueError("autotune: need confirm >= 0, rounds >= 1, round_runs >= 1 and 0 <= tolerance < 1")
        self.tolerance = tolerance
        self.confirm = confirm
        self.rounds = rounds
        self.round_runs = round_runs
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
        """Sweep ``kernel_fn`` over its configurations on ``args``, confirm the fastest, keep a real win.

        Trials are ranked by the median of their device times. The ``confirm`` fastest and
        the untuned default are then re-measured in interleaved rounds; among those within
        noise of the fastest the first in sweep order is chosen, and it is the winner only
        when its p90 is below the default's p10 (else the default is kept: ``best_config``
        is the default, ``real_win`` False). Only a template's real win is stored in the
        tune DB, under ``shape_key`` (default: the template's signature of ``args``); a
        sweep without one removes the winner stored for that signature.

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
            shape_key = template.signature(args) if template is not None else default_shape_key(args)
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
            order = {cfg: i for i, cfg in enumerate(grid(sp))}
            runner.order = order
            runner.tolerance = self.tolerance
            total, run = plan(strategy, sp, base)
            bar = progress_bar(show, total, f"autotune {name}")
            try:
                runner.on_trial = lambda t: tick(bar, runner.trial_of(runner.best_config()))
                run(runner)
            finally:
                if bar is not None:
                    bar.close()
            default = base if base is not None else (template.default if template is not None else None)
            conf = None
            if self.confirm > 0:
                top = [t.config for t in preferred([t for t in runner.trials if t.config != default], order,
                                                   self.tolerance)][:self.confirm]
                if top:
                    conf = confirm(runner, top, default, self.rounds, self.round_runs, order, self.tolerance)
            if conf is not None:
                best, real_win, verdict = conf.winner, conf.real_win, conf.verdict
            else:
                best, real_win, verdict = decide(runner.trials, base, order, self.tolerance)
            region.set("trials", len(runner.trials))
            region.set("best", best.label() if best is not None else None)
            region.set("real_win", real_win)

        persisted = evicted = None
        if template is not None and (self.persist if persist is None else persist):
            if real_win and best is not None:
                persisted = self._store(template, best, conf, runner, shape_key)
            elif real_win is False:
                evicted = self._evict(template, shape_key)
        result = AutotuneResult(best, tuple(runner.trials), name, self.limits.device_key, shape_key,
                                flops, base, strategy, persisted, conf, real_win, verdict,
                                self.limits.device_name, evicted, self.tolerance)
        self._results[(_fn_key(kernel_fn), shape_key)] = result
        self._results[(_fn_key(kernel_fn), None)] = result
        return result

    def measure(self, kernel_fn: Any, args: Sequence[Any], config: Config, *, n_warmup: int | None = None,
                n: int | None = None, output: Any = None, reference: Any = None,
                rtol: float = 1e-3, atol: float = 1e-4) -> Trial:
        """Run one configuration as a trial (traced like a sweep's trials; no confirmation)."""
        out = OutputCheck(output, reference) if output is not None else None
        runner = TrialRunner(self, kernel_fn, args, self.n_warmup if n_warmup is None else n_warmup,
                             self.n if n is None else n, out, rtol, atol)
        return runner.run(config)

    def verify(self, template: KernelTemplate, args: Sequence[Any], shape_key: tuple | None = None, *,
               rounds: int | None = None, round_runs: int | None = None) -> Verification:
        """Re-measure the winner stored for ``args``' signature against the untuned default, in
        interleaved rounds; evict it when it no longer beats the default by more than the noise
        (or no longer builds or launches)."""
        if not isinstance(template, KernelTemplate):
            raise TypeError(f"verify: needs a cltrace.KernelTemplate, not {type(template).__name__}")
        args = tuple(args)
        sig = template.signature(args) if shape_key is None else tuple(shape_key)
        doc = tunedb.lookup_entry(template.source_hash, template.options, self.limits.device_key, sig)
        if doc is None:
            return Verification(None, template.default, sig, None, None, False, False,
                                f"no winner stored for {template.name} {_sig_label(sig)} on {self.limits.device_name}")
        params = doc["config"].get("params")
        try:
            config = Config.from_dict(params) if isinstance(params, Mapping) else None
        except (TypeError, ValueError, OverflowError):
            config = None
        if config is None:
            tunedb.evict(template.source_hash, template.options, self.limits.device_key, path=doc["path"])
            return Verification(None, template.default, sig, doc["path"], None, False, True,
                                "the stored entry names no configuration; evicted")
        runner = TrialRunner(self, template, args, 0, 1, None, 0.0, 0.0)
        with category_region(f"verify {template.name}", self.queue, {"kernel": template.name,
                                                                     "device": self.limits.device_key}, AUTOTUNE):
            conf = confirm(runner, [config], template.default, rounds or self.rounds,
                           round_runs or self.round_runs, {config: 0}, self.tolerance)
        kept = bool(conf.real_win) and conf.winner == config
        if not kept:
            tunedb.evict(template.source_hash, template.options, self.limits.device_key, path=doc["path"])
            self._results = {k: v for k, v in self._results.items() if k[0] != _fn_key(template)}
        return Verification(config, template.default, sig, doc["path"], conf, kept, not kept,
                            conf.verdict if kept else f"evicted: {_why_not(conf, config)}")

    # ---- best known -------------------------------------------------------------
    def best(self, kernel_fn: Any, shape_key: tuple | None = None) -> Config | None:
        """Best known config: from this tuner's sweeps, else (templates) the tune DB entry for this
        device and driver tuned for ``shape_key`` (None: the only signature stored, if just one)."""
        hit = self._results.get((_fn_key(kernel_fn), shape_key))
        if hit is not None:
            return hit.best_config
        if not isinstance(kernel_fn, KernelTemplate):
            return None
        entry = tunedb.lookup(kernel_fn.source_hash, kernel_fn.options, self.limits.device_key,
                              signature=shape_key)
        if not entry or not isinstance(entry.get("params"), Mapping) or tuned_problem(entry) is not None:
            return None
        return Config.from_dict(entry["params"])

    def result(self, kernel_fn: Any, shape_key: tuple | None = None) -> AutotuneResult | None:
        """The last sweep of ``kernel_fn`` (for ``shape_key``) run by this tuner."""
        return self._results.get((_fn_key(kernel_fn), shape_key))

    def _store(self, template: KernelTemplate, best: Config, conf: Confirmation | None, runner: TrialRunner,
               shape_key: tuple | None) -> str | None:
        win = conf.trial(best) if conf is not None else runner.trial_of(best)
        dflt = conf.trial(conf.default) if conf is not None else runner.trial_of(template.default)
        config = {
            "defines": dict(template.defines(best)),
            "local_size": list(best.workgroup) if best.workgroup is not None else None,
            "params": best.as_dict(),
            "kernel": template.name,
            "shape": _jsonable_key(shape_key),
            "figures": {
                "median_ns": win.median_ns if win else None, "p10_ns": win.p10_ns if win else None,
                "p90_ns": win.p90_ns if win else None, "runs": len(win.times_ns) if win else None,
                "rounds": conf.rounds if conf is not None else None,
                "default": {"median_ns": dflt.median_ns, "p10_ns": dflt.p10_ns, "p90_ns": dflt.p90_ns}
                if dflt is not None and dflt.ok else None,
                "speedup": conf.speedup() if conf is not None else None,
                "source": "confirmation rounds" if conf is not None else "sweep",
            },
        }
        try:
            return tunedb.store(template.source_hash, template.options, self.limits.device_key, config,
                                extra={"tuned_at_unix": time.time(), "device_name": self.limits.device_name},
                                signature=shape_key)
        except OSError as exc:
            log.warning("cltrace: could not store the tuned winner in %s: %s", tunedb.cache_dir(), exc)
            return None

    def _evict(self, template: KernelTemplate, shape_key: tuple | None) -> str | None:
        doc = tunedb.lookup_entry(template.source_hash, template.options, self.limits.device_key, shape_key)
        if doc is None or shape_key is None:
            return None
        return doc["path"] if tunedb.evict(template.source_hash, template.options, self.limits.device_key,
                                           path=doc["path"]) else None


@dataclass(frozen=True)
class Verification:
    """What ``Autotuner.verify`` found: the stored ``config``, the rounds, and whether it was kept or evicted."""

    config: Config | None
    default: Config
    signature: tuple
    path: str | None
    confirmation: Confirmation | None
    kept: bool
    evicted: bool
    verdict: str

    def table(self, flops: float | None = None) -> str:
        """The verdict, then the winner's and the default's confirmation figures."""
        lines = [self.verdict]
        conf = self.confirmation
        if conf is not None:
            lines.append(f"{conf.rounds} interleaved rounds x {conf.runs} launches, device time:")
            for t, w in zip(conf.trials, conf.wins):
                role = "stored winner" if t.config == self.config else "default"
                if not t.ok:
                    lines.append(f"  {role:<14} {t.config.label():<32} [{t.stage}] {t.reason}")
                    continue
                g = f"  {t.gflops(flops):.2f} GFLOP/s" if flops else ""
                lines.append(f"  {role:<14} {t.config.label():<32} median {format_ns(t.median_ns)} "
                             f"[p10 {format_ns(t.p10_ns)}, p90 {format_ns(t.p90_ns)}] won {w} rounds{g}")
        return "\n".join(lines)


def _why_not(conf: Confirmation, config: Config) -> str:
    t = conf.trial(config)
    if t is not None and not t.ok:
        return f"the stored winner {config.label()} no longer runs: {t.reason}"
    return conf.verdict


def _sig_label(sig: tuple | None) -> str:
    if sig and all(isinstance(v, int) for v in sig):
        return fmt_dims(sig, "-")
    return str(list(sig) if sig is not None else None)


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
             confirm: int = 5, rounds: int = 5, round_runs: int = 3, tolerance: float = 0.05,
             **kw: Any) -> AutotuneResult:
    """One-shot sweep: ``Autotuner(queue, ...).tune(kernel_fn, args, ...)``; ``kw`` as for ``Autotuner.tune``.

    ``queue`` None: the active queue (``cltrace.set_queue``), else cltrace's default profiling queue.
    """
    tuner = Autotuner(queue, n_warmup=n_warmup, n=n, cutoff=cutoff, confirm=confirm, rounds=rounds,
                      round_runs=round_runs, tolerance=tolerance)
    return tuner.tune(kernel_fn, args, workgroup_sizes, tile_sizes, unroll_factors, **kw)
