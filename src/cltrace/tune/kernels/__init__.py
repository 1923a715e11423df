"""Tunable example kernels for the autotuner."""
from __future__ import annotations

from .matmul import MATMUL, MatmulProblem

__all__ = ["MATMUL", "MatmulProblem"]
