"""The tune store: winners keyed also on the problem signature, entries that are not
objects ignored with one warning, stored winners that no longer build or fit dropped with one warning,
no temporary file left by a failed write."""
from __future__ import annotations

import glob
import json
import logging
import os
from typing import Any

import numpy as np
import pytest

import cltrace
from cltrace.programs import tunedb
from cltrace.programs.compiler import device_key
from cltrace.tune import Autotuner, Config
from cltrace.tune.kernels.matmul import MATMUL, MatmulProblem


@pytest.fixture(autouse=True)
def cache_dir(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> str:
    d = str(tmp_path / "cache")
    monkeypatch.setenv("CLTRACE_CACHE_DIR", d)
    return d


def _entry(tile: tuple[int, int], local_size: list[int] | None = None, **defines: int) -> dict[str, Any]:
    return {"defines": {"TILE_X": tile[0], "TILE_Y": tile[1], "UNROLL": 1, **defines}, "local_size": local_size,
            "params": Config(None, tile, 1).as_dict(), "kernel": "matmul"}


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and r.name == "cltrace"]


def test_winners_for_two_problem_sizes_live_side_by_side(queue: Any) -> None:
    key = device_key(queue.device)
    small, large = MatmulProblem(queue, 24, 40, 20), MatmulProblem(queue, 32, 16, 8)
    assert MATMUL.signature(small.args) == (24, 40, 20) and MATMUL.signature(large.args) == (32, 16, 8)
    tunedb.store(MATMUL.source_hash, MATMUL.options, key, _entry((4, 2)), signature=(24, 40, 20))
    tunedb.store(MATMUL.source_hash, MATMUL.options, key, _entry((8, 1)), signature=(32, 16, 8))
    for problem, tile in ((small, (4, 2)), (large, (8, 1))):
        prg = MATMUL.compile(context=queue.context, args=problem.args)
        assert MATMUL.config_of(prg).tile == tile and f"-DTILE_X={tile[0]}" in prg.options
        MATMUL.launch(prg, queue, problem.args).wait()
        assert np.array_equal(problem.result(), problem.reference)
        prg = cltrace.compile(MATMUL.source, MATMUL.options, context=queue.context,
                              tune_key=MATMUL.signature(problem.args))
        assert prg.tuned["params"]["tile"] == list(tile)
    # without a signature, two stored sizes are ambiguous: the untuned program, not a guess
    assert cltrace.compile(MATMUL.source, MATMUL.options, context=queue.context).tuned is None
    assert MATMUL.compile(context=queue.context, args=MatmulProblem(queue, 8, 8, 8).args).tuned is None
    tuner = Autotuner(queue, progress=False)
    assert tuner.best(MATMUL, (24, 40, 20)).tile == (4, 2) and tuner.best(MATMUL, (32, 16, 8)).tile == (8, 1)
    assert tuner.best(MATMUL) is None


def test_tuning_one_size_keeps_the_other_sizes_winner(queue: Any) -> None:
    key = device_key(queue.device)
    tunedb.store(MATMUL.source_hash, MATMUL.options, key, _entry((8, 1)), signature=(512, 512, 512))
    problem = MatmulProblem(queue, 24, 40, 20)
    res = Autotuner(queue, n_warmup=1, n=3, progress=False).tune(
        MATMUL, problem.args, [None], [(1, 1), (8, 4)], [1], output=problem.c, reference=problem.reference)
    assert res.shape_key == (24, 40, 20)
    kept = tunedb.lookup(MATMUL.source_hash, MATMUL.options, key, signature=(512, 512, 512))
    assert kept is not None and kept["params"]["tile"] == [8, 1]
    if res.persisted:
        with open(res.persisted) as fh:
            assert json.load(fh)["signature"] == [24, 40, 20]


@pytest.mark.parametrize("junk", ["[]", "null", '"a string"', "42"])
def test_an_entry_that_is_not_an_object_is_ignored_with_one_warning(
        queue: Any, junk: str, caplog: pytest.LogCaptureFixture) -> None:
    key = device_key(queue.device)
    path = tunedb.entry_path(MATMUL.source_hash, MATMUL.options, key, (24, 40, 20))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as fh:
        fh.write(junk)
    args = MatmulProblem(queue, 24, 40, 20).args
    with caplog.at_level(logging.WARNING, logger="cltrace"):
        for _ in range(3):
            assert MATMUL.compile(context=queue.context, args=args).tuned is None
            assert cltrace.compile(MATMUL.source, MATMUL.options, context=queue.context).tuned is None
    warned = _warnings(caplog)
    assert len(warned) == 1 and path in warned[0] and "not an object" in warned[0]


def test_a_stored_winner_that_no_longer_builds_falls_back_and_is_evicted(
        queue: Any, caplog: pytest.LogCaptureFixture) -> None:
    key = device_key(queue.device)
    path = tunedb.store(MATMUL.source_hash, MATMUL.options, key, _entry((3, 1)), signature=(24, 40, 20))
    problem = MatmulProblem(queue, 24, 40, 20)
    with caplog.at_level(logging.WARNING, logger="cltrace"):
        prg = MATMUL.compile(context=queue.context, args=problem.args)
        again = MATMUL.compile(context=queue.context, args=problem.args)
    assert prg.tuned is None and again.tuned is None and not any("TILE_X" in o for o in prg.options)
    MATMUL.launch(prg, queue, problem.args).wait()
    assert np.array_equal(problem.result(), problem.reference)
    warned = _warnings(caplog)
    assert len(warned) == 1 and "no longer builds" in warned[0] and "TILE_X must be" in warned[0]
    assert not os.path.exists(path)


def test_a_stored_local_size_the_kernel_cannot_run_falls_back_and_is_evicted(
        queue: Any, caplog: pytest.LogCaptureFixture) -> None:
    key = device_key(queue.device)
    too_big = [queue.device.max_work_group_size * 2, 1]
    path = tunedb.store(MATMUL.source_hash, MATMUL.options, key, _entry((1, 1), too_big), signature=(24, 40, 20))
    problem = MatmulProblem(queue, 24, 40, 20)
    with caplog.at_level(logging.WARNING, logger="cltrace"):
        prg = MATMUL.compile(context=queue.context, args=problem.args)
    assert prg.tuned is None and prg.matmul.tuned_local_size is None
    MATMUL.launch(prg, queue, problem.args).wait()
    assert np.array_equal(problem.result(), problem.reference)
    warned = _warnings(caplog)
    assert len(warned) == 1 and "local size" in warned[0] and not os.path.exists(path)


def test_a_failed_write_leaves_no_temporary_file(queue: Any, cache_dir: str) -> None:
    circular: dict[str, Any] = {"defines": {}}
    circular["self"] = circular  # json cannot encode it: the write fails after the temporary file exists
    with pytest.raises(ValueError):
        tunedb.store(MATMUL.source_hash, MATMUL.options, device_key(queue.device), circular, signature=(1, 2, 3))
    assert glob.glob(os.path.join(cache_dir, "tuned", "**", "*.tmp"), recursive=True) == []
    assert tunedb.lookup(MATMUL.source_hash, MATMUL.options, device_key(queue.device), signature=(1, 2, 3)) is None
