"""Autotuning: sweep a kernel's work-group shape, tile sizes and unroll factor on the device.

Every trial is built through ``cltrace.compile`` (the tile/unroll/work-group
values become ``-D`` defines, so builds are cached and show as compile spans),
launched ``n_warmup + n`` times without waiting per launch (one wait after the
first timed launch when a cutoff applies), and timed by its device events
(END - START); trials rank by their median. A candidate that does not fit the
device, fails to build, fails to launch or computes a wrong result becomes a
failed trial with its reason; the sweep goes on. The fastest few and the
untuned default are then re-measured in interleaved rounds (``confirm``), and
a winner counts only when it beats the default by more than the noise. Such a
winner of a kernel-template sweep is stored in the tune DB under the untuned
(source, options, device+driver) key and the problem signature, so a later
``cltrace.compile`` of the same source for that problem, in any process, builds
the tuned variant without being asked.

What can be tuned (``kernel_fn``):

* a ``KernelTemplate``: OpenCL C source whose performance knobs are
  compile-time defines (``TILE_X``/``TILE_Y``/``UNROLL``, and ``WG_X``/``WG_Y``
  for a fixed work-group shape), the kernel name, and how the global size
  follows from ``(args, config)``. The work-group shape is the local size
  (``None``: the driver chooses).
* a plain callable ``kernel_fn(config, *args) -> cl.Event`` (or a list of
  events) for sweeps cltrace cannot build itself; only the device limits are
  checked, the rest is up to the callable.

Modules: ``config`` (Config, defines), ``limits`` (device limits, candidates, fit),
``template`` (KernelTemplate), ``runner`` (one trial), ``check`` (result check),
``sweep`` (grid/coordinate order), ``confirm`` (interleaved rounds, the decision),
``progress`` (bar), ``result`` (Trial, Confirmation, AutotuneResult), ``tuner``
(Autotuner, autotune, verify, tune-DB persistence); ``kernels`` (worked examples).
May import ``programs``, ``analyze``, ``record`` and ``timeline``; only ``cli`` imports it.
"""
from __future__ import annotations

from .check import compare
from .config import Config, standard_defines
from .limits import DeviceLimits
from .result import FAILED, OK, AutotuneResult, Confirmation, Trial
from .template import KernelTemplate
from .tuner import Autotuner, Verification, autotune

__all__ = [
    "Autotuner", "autotune", "AutotuneResult", "Confirmation", "Verification", "Trial", "KernelTemplate",
    "Config", "DeviceLimits", "standard_defines", "compare", "OK", "FAILED",
]
