"""Which job and rank a process belongs to (record/job.py): from the launcher's environment, into every
file's metadata and the OTLP resource."""
from __future__ import annotations

from typing import Any

from cltrace.record import job
from cltrace.record.recorder import RECORDER


def test_the_first_variable_set_wins() -> None:
    assert job.identity({}) == {}
    assert job.identity({"SLURM_JOB_ID": "77", "SLURM_PROCID": "3"}) == {"run_id": "77", "rank": "3"}
    env = {"CLTRACE_RUN_ID": "mine", "TORCHELASTIC_RUN_ID": "te", "RANK": "1", "OMPI_COMM_WORLD_RANK": "5"}
    assert job.identity(env) == {"run_id": "mine", "rank": "1"}
    assert job.identity({"PMI_RANK": "0", "LSB_JOBID": " 9 "}) == {"run_id": "9", "rank": "0"}
    assert job.identity({"RANK": "", "PMI_RANK": "4"}) == {"rank": "4"}  # empty is unset


def test_resource_names() -> None:
    assert job.resource_attributes({"run_id": "r", "rank": "0"}) == {"cltrace.run.id": "r", "cltrace.rank": "0"}
    assert job.resource_attributes({}) == {}


def test_metadata_and_resource_carry_it(monkeypatch: Any) -> None:
    from cltrace.export.otlp.resource import resource_attributes

    monkeypatch.setenv("CLTRACE_RUN_ID", "job-9")
    monkeypatch.setenv("RANK", "6")
    assert RECORDER.metadata()["job"] == {"run_id": "job-9", "rank": "6"}
    attrs = resource_attributes(RECORDER, {"service.name": "x"})
    assert attrs["cltrace.run.id"] == "job-9" and attrs["cltrace.rank"] == "6"
