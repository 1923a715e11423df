"""Running one trial: fit check, build, ``n_warmup + n`` launches timed by device events, result check."""
from __future__ import annotations

import math
import re
from typing import Any, Callable, Mapping, Protocol, Sequence

import pyopencl as cl

from ..programs.compiler import BuildError
from ..record.regions import category_region
from ..record.timing import _events_of, _span_ns
from ..timeline.spans import TRIAL
from .check import OutputCheck, compare
from .config import Config, fmt_dims
from .limits import DeviceLimits, fit_workgroup
from .result import Trial, preferred
from .template import KernelTemplate


class Target(Protocol):
    """Where trials run: what a runner needs of its ``Autotuner``."""

    queue: cl.CommandQueue
    context: cl.Context
    device: cl.Device
    limits: DeviceLimits
    cutoff: float | None

_LOCATION = re.compile(r"^\S+?:\d+:\d+:\s*")


class TrialRunner:
    """Runs trials for one sweep and keeps them in order."""

    def __init__(self, tuner: Target, kernel_fn: Any, args: Sequence[Any], n_warmup: int, n: int,
                 out: OutputCheck | None, rtol: float, atol: float) -> None:
        self.tuner = tuner
        self.kernel_fn = kernel_fn
        self.template = kernel_fn if isinstance(kernel_fn, KernelTemplate) else None
        self.args = tuple(args)
        self.n_warmup = n_warmup
        self.n = n
        self.out = out
        self.rtol = rtol
        self.atol = atol
        self.reference = out.reference if out is not None else None
        self.trials: list[Trial] = []
        self._by_config: dict[Config, Trial] = {}
        self.on_trial: Callable[[Trial], None] | None = None
        self.order: Mapping[Config, int] | None = None
        self.tolerance = 0.0

    def trial_of(self, config: Config | None) -> Trial | None:
        return self._by_config.get(config) if config is not None else None

    def best_config(self) -> Config | None:
        """The preferred successful trial so far (what a coordinate pass moves around): the lowest
        median, or with ``order`` set, the first in that order of those within noise of it."""
        ranked = preferred(self.trials, self.order, self.tolerance)
        return ranked[0].config if ranked else None

    def run(self, config: Config) -> Trial:
        """Run ``config`` inside a ``trial`` span that carries its status, mean or failure."""
        with category_region(f"trial {config.label()}", self.tuner.queue, dict(config.as_dict()), TRIAL) as region:
            trial = self._trial(config)
            region.set("status", trial.status)
            if trial.ok:
                region.set("median_ns", trial.median_ns)
                region.set("mean_ns", trial.mean_ns)
            else:
                region.set("stage", trial.stage)
                region.set("reason", trial.reason)
        self.trials.append(trial)
        self._by_config[config] = trial
        if self.on_trial is not None:
            self.on_trial(trial)
        return trial

    def prepare(self, config: Config) -> tuple[Callable[[], Any], dict[str, Any]] | Trial:
        """A call that launches ``config`` once and its build facts, or the failed trial (limits, build)."""
        limits = self.tuner.limits
        tpl = self.template
        if tpl is not None:
            reason = tpl.fit(self.args, config, limits)
        else:
            reason = fit_workgroup(config.workgroup, limits, None)
        if reason:
            return Trial.failed(config, "limits", reason)
        if tpl is not None:
            return self._build(tpl, config)
        fn = self.kernel_fn

        def call() -> Any:
            return fn(config, *self.args)

        return call, {}

    def _trial(self, config: Config) -> Trial:
        prepared = self.prepare(config)
        if isinstance(prepared, Trial):
            return prepared
        call, build = prepared
        q = self.tuner.queue
        if self.out is not None:
            self.out.poison(q)
        calls: list[list[Any]] = []
        try:
            self._launch(call, calls)
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

    def _build(self, tpl: KernelTemplate, config: Config) -> tuple[Callable[[], Any], dict[str, Any]] | Trial:
        """Build ``config``: a call that launches it and its build facts, or the failed trial."""
        tuner = self.tuner
        try:
            program = tpl.compile(config, context=tuner.context, device=tuner.device)
        except BuildError as exc:
            log = getattr(exc, "build_log", "") or str(exc)
            return Trial.failed(config, "build", f"build failed: {_first_error(log) or exc}")
        build = {"compile_ns": getattr(program, "compile_ns", None),
                 "from_cache": getattr(program, "from_cache", None)}
        try:
            knl = program.kernel(tpl.name)
        except LookupError as exc:  # a driver that "built" the program without its kernel
            return Trial.failed(config, "build", f"build failed: {exc}", **build)
        if config.workgroup is not None:
            raw = cl.Kernel(program.program, tpl.name)
            kmax = int(raw.get_work_group_info(cl.kernel_work_group_info.WORK_GROUP_SIZE, tuner.device))
            if math.prod(config.workgroup) > kmax:
                return Trial.failed(config, "limits", f"work-group {fmt_dims(config.workgroup, '')} exceeds "
                                    f"this kernel's CL_KERNEL_WORK_GROUP_SIZE {kmax}", **build)
        gs = tuple(tpl.global_size(self.args, config))
        launcher = knl[gs, config.workgroup, tuner.queue]

        def call() -> Any:
            return launcher(*self.args)

        return call, build

    def _launch(self, call: Callable[[], Any], calls: list[list[Any]]) -> None:
        """Enqueue warm-up and timed launches into ``calls``, waiting once per batch, never per launch.

        With a cutoff and a best trial so far, the first timed launch is waited for: when it is
        more than ``cutoff`` times the best median, the trial stops there with one timed run.
        """

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
        if cutoff and best is not None and self.n > 1:
            enqueue(self.n_warmup + 1)
            if _span_ns(calls[-1]) <= cutoff * best.median_ns:
                enqueue(self.n - 1)
        else:
            enqueue(self.n_warmup + self.n)


def _drain(calls: list[list[Any]]) -> None:
    """Wait for what was enqueued before a launch failed, ignoring the failures."""
    for evs in calls:
        for e in evs:
            try:
                e.wait()
            except cl.Error:
                pass


def _first_error(log: str, limit: int = 200) -> str:
    """The first error line of a build log, without the compiler's temporary file location."""
    lines = [ln.strip() for ln in (log or "").splitlines() if ln.strip()]
    for line in lines:
        head, sep, rest = line.partition("error:")
        if sep:
            return ("error: " + _LOCATION.sub("", rest.strip()))[:limit]
    return lines[0][:limit] if lines else ""
