"""Which job a process belongs to and its rank in it, from the launcher's environment.

Read when a trace's metadata is written (never on the hot path). The run id is shared by every
rank of one job: ``CLTRACE_RUN_ID``, else the launcher's (torchrun's ``TORCHELASTIC_RUN_ID``,
Slurm's ``SLURM_JOB_ID``, PBS's ``PBS_JOBID``, LSF's ``LSB_JOBID``); the rank is the first of
``RANK`` (torchrun), ``OMPI_COMM_WORLD_RANK`` (Open MPI), ``PMI_RANK`` (MPICH, Intel MPI),
``SLURM_PROCID``. Files carry it under ``metadata["job"]``, OTLP resources as ``cltrace.run.id``
and ``cltrace.rank`` (OpenTelemetry has no resource names for either).
"""
from __future__ import annotations

import os
from typing import Mapping

RUN_VARS = ("CLTRACE_RUN_ID", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "PBS_JOBID", "LSB_JOBID")
RANK_VARS = ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID")
RUN_ATTR = "cltrace.run.id"
RANK_ATTR = "cltrace.rank"


def identity(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """``{"run_id", "rank"}`` from the environment, each left out where no variable gives it."""
    env = os.environ if environ is None else environ
    out = {}
    for key, names in (("run_id", RUN_VARS), ("rank", RANK_VARS)):
        for name in names:
            v = env.get(name, "").strip()
            if v:
                out[key] = v
                break
    return out


def resource_attributes(job: Mapping[str, str]) -> dict[str, str]:
    """The OTLP resource attributes of an ``identity()`` record."""
    out = {}
    if job.get("run_id"):
        out[RUN_ATTR] = str(job["run_id"])
    if job.get("rank") not in (None, ""):
        out[RANK_ATTR] = str(job["rank"])
    return out
