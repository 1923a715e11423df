"""The old import path of the autotuner, kept so ``from cltrace.autotune import ...`` goes on working.

The code lives in ``cltrace.tuning``. ``cltrace.autotune`` itself is the ``autotune`` function
(``cltrace/__init__.py`` loads this module before it binds that name, so a later import of
this module does not replace the function with the module).
"""
from __future__ import annotations

from .tuning import (FAILED, OK, AutotuneResult, Autotuner, Config, DeviceLimits, KernelTemplate, Trial, autotune,
                     compare, standard_defines)

__all__ = [
    "Autotuner", "autotune", "AutotuneResult", "Trial", "KernelTemplate", "Config", "DeviceLimits",
    "standard_defines", "compare", "OK", "FAILED",
]
