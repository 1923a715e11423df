"""What cltrace keeps on disk cannot change what kernels compute.

The program cache, the tune store and the device verdicts are trusted only in folders of the user's own
that no one else can write; they are made 0700 (0600 files) whatever the umask, and traces 0644 in 0755
folders. A binary built from another source, a tuned define that would add compiler options and a header
nested too deep for the JSON parser are each one warning, and the kernel computes what its source says.
Everything runs real builds on the default device (PoCL here); other users' files are made with chown,
which needs root.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import stat
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pyopencl as cl
import pytest

import cltrace
from cltrace.programs import tunedb
from cltrace.programs.compiler import ProgramCache, default_cache, device_key
from cltrace.record import probe
from cltrace.timeline.tracks import device_info

N = 64
FIVE = "__kernel void k(__global int *o) { o[get_global_id(0)] = 5; }\n"
SIX_SIX_SIX = "__kernel void k(__global int *o) { o[get_global_id(0)] = 666; }\n"
# OTHER defaults to 5; INJECTED, which no tuner chooses, turns the answer into 666.
TUNABLE = """
#ifndef OTHER
#define OTHER 5
#endif
#ifdef INJECTED
#define ANSWER 666
#else
#define ANSWER OTHER
#endif
__kernel void k(__global int *o) { o[get_global_id(0)] = ANSWER; }
"""
NESTED = b"[" * 100000 + b"]" * 100000


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Empty caches under tmp_path, no verdict or warning remembered from earlier tests."""
    from cltrace.record import files

    d = tmp_path / "cache"
    monkeypatch.setenv("CLTRACE_CACHE_DIR", str(d))
    default_cache().clear()
    probe._memo.clear()
    files._refused.clear()
    tunedb._warned.clear()
    yield d
    probe._memo.clear()
    default_cache().clear()


@pytest.fixture()
def umask_000() -> Iterator[None]:
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


def answer(prg: Any, queue: Any) -> int:
    """What every work-item of ``prg.k`` wrote (one value, or the test fails)."""
    buf = cl.Buffer(queue.context, cl.mem_flags.READ_WRITE, 4 * N)
    prg.k[N, None, queue](buf)
    out = np.empty(N, np.int32)
    cl.enqueue_copy(queue, out, buf)
    assert len(set(out.tolist())) == 1, out
    return int(out[0])


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and r.name == "cltrace"]


def entry_of(cache: ProgramCache, prg: Any) -> Path:
    return Path(cache.path(cache.entry_key(prg.source_hash, prg.options, prg.device_key)))


def plant(target: Path, donor: Path) -> bytes:
    """Put ``donor``'s binary in ``target``'s entry under ``target``'s own header, its size and checksum
    recomputed: what someone who can write the folder can do. Returns the planted bytes."""
    magic, header, _ = target.read_bytes().split(b"\n", 2)
    binary = donor.read_bytes().split(b"\n", 2)[2]
    head = json.loads(header)
    head.update(size=len(binary), sha256=hashlib.sha256(binary).hexdigest())
    planted = magic + b"\n" + json.dumps(head).encode() + b"\n" + binary
    target.write_bytes(planted)
    return planted


def give_away(path: Path) -> None:
    """Make ``path`` another user's (nobody, uid 65534): only root can."""
    if os.getuid() != 0:
        pytest.skip("giving a file to another user needs root")
    os.chown(path, 65534, 65534)


def modes(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): stat.S_IMODE(p.stat().st_mode) for p in [root, *root.rglob("*")]}


# ---- whose folder the caches trust --------------------------------------------------------------------

@pytest.mark.parametrize("how", ["folder 0777", "folder 1777", "cache root group-writable", "another user's folder"])
def test_a_binary_planted_in_a_folder_others_can_write_is_refused(
        cl_ctx: Any, queue: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture, how: str) -> None:
    folder = tmp_path / "programs"
    five = cltrace.compile(FIVE, context=cl_ctx, cache=ProgramCache(folder))
    six = cltrace.compile(SIX_SIX_SIX, context=cl_ctx, cache=ProgramCache(folder))
    entry = entry_of(ProgramCache(folder), five)
    planted = plant(entry, entry_of(ProgramCache(folder), six))
    loosened = {"folder 0777": (entry.parent, 0o777), "folder 1777": (entry.parent, 0o1777),
                "cache root group-writable": (folder, 0o770), "another user's folder": (entry.parent, 0o700)}
    path, mode = loosened[how]
    os.chmod(path, mode)
    if how == "another user's folder":
        give_away(path)
    with caplog.at_level(logging.WARNING, logger="cltrace"):
        for _ in range(3):
            prg = cltrace.compile(FIVE, context=cl_ctx, cache=ProgramCache(folder))
            assert prg.cache_hit == "miss"
            assert answer(prg, queue) == 5
    warned = warnings_of(caplog)
    assert len(warned) == 1, warned
    assert warned[0].startswith(f"cltrace: not using the program cache: the folder {path} ")
    assert ("owned by uid 65534" if how == "another user's folder" else "can be written by") in warned[0]
    assert entry.read_bytes() == planted, "nothing is written into a folder cltrace does not trust"


def test_an_entry_others_can_write_is_refused_and_replaced(cl_ctx: Any, queue: Any, tmp_path: Path,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    folder = tmp_path / "programs"
    five = cltrace.compile(FIVE, context=cl_ctx, cache=ProgramCache(folder))
    six = cltrace.compile(SIX_SIX_SIX, context=cl_ctx, cache=ProgramCache(folder))
    entry = entry_of(ProgramCache(folder), five)
    good = entry.read_bytes()
    plant(entry, entry_of(ProgramCache(folder), six))
    os.chmod(entry, 0o666)
    with caplog.at_level(logging.WARNING, logger="cltrace"):
        prg = cltrace.compile(FIVE, context=cl_ctx, cache=ProgramCache(folder))
    assert prg.cache_hit == "miss" and answer(prg, queue) == 5
    warned = warnings_of(caplog)
    assert len(warned) == 1 and f"the file {entry} can be written by its group and other users (mode 0666)" in warned[0]
    # Its folder is the user's own: the fresh build took the entry's place, private again.
    assert entry.read_bytes() == good and stat.S_IMODE(entry.stat().st_mode) == 0o600
    again = cltrace.compile(FIVE, context=cl_ctx, cache=ProgramCache(folder))
    assert again.cache_hit == "disk" and answer(again, queue) == 5


def test_a_binary_whose_header_names_another_source_is_removed_and_rebuilt(
        cl_ctx: Any, queue: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    folder = tmp_path / "programs"
    five = cltrace.compile(FIVE, context=cl_ctx, cache=ProgramCache(folder))
    six = cltrace.compile(SIX_SIX_SIX, context=cl_ctx, cache=ProgramCache(folder))
    entry = entry_of(ProgramCache(folder), five)
    entry.write_bytes(entry_of(ProgramCache(folder), six).read_bytes())  # B's entry, honest header, in A's place
    with caplog.at_level(logging.WARNING, logger="cltrace"):
        prg = cltrace.compile(FIVE, context=cl_ctx, cache=ProgramCache(folder))
    assert prg.cache_hit == "miss" and answer(prg, queue) == 5
    warned = warnings_of(caplog)
    assert len(warned) == 1 and "key mismatch" in warned[0] and "removed, rebuilding" in warned[0]
    assert cltrace.compile(FIVE, context=cl_ctx, cache=ProgramCache(folder)).cache_hit == "disk"


def test_cache_folders_are_private_under_umask_000(cl_ctx: Any, queue: Any, tmp_path: Path, umask_000: None,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "home" / "cache"  # neither exists yet
    monkeypatch.setenv("CLTRACE_CACHE_DIR", str(root))
    prg = cltrace.compile(FIVE, context=cl_ctx)
    tunedb.store(prg.source_hash, prg.options, prg.device_key, {"defines": {"OTHER": 5}})
    assert probe.verdict(queue.device).compiles
    found = modes(root)
    assert {p for p in found if p.startswith("programs")} and {p for p in found if p.startswith("tuned")}
    assert {p for p in found if p.startswith("devices")}
    assert {p: m for p, m in found.items() if (root / p).is_dir() and m != 0o700} == {}
    assert {p: m for p, m in found.items() if (root / p).is_file() and m != 0o600} == {}
    assert stat.S_IMODE((tmp_path / "home").stat().st_mode) == 0o700


def test_traces_are_not_writable_by_others_under_umask_000(queue: Any, tmp_path: Path, umask_000: None) -> None:
    out = tmp_path / "new" / "traces"
    paths = [out / "t.json", out / "t.pftrace", out / "t.speedscope.json"]
    with cltrace.trace(*map(str, paths), quiet=True):
        with cltrace.region("step", queue):
            pass
    assert {p.name: stat.S_IMODE(p.stat().st_mode) for p in paths} == {p.name: 0o644 for p in paths}
    assert stat.S_IMODE(out.stat().st_mode) == stat.S_IMODE(out.parent.stat().st_mode) == 0o755


def test_a_tune_store_others_can_write_is_not_read_nor_written(cl_ctx: Any, queue: Any, cache: Path,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    dev = device_key(queue.device)
    src = tunedb.source_hash(TUNABLE)
    path = Path(tunedb.store(src, (), dev, {"defines": {"OTHER": 666}}))
    assert answer(cltrace.compile(TUNABLE, context=cl_ctx), queue) == 666, "the stored define applies"
    default_cache().clear()
    os.chmod(path.parent, 0o777)
    with caplog.at_level(logging.WARNING, logger="cltrace"):
        for _ in range(2):
            prg = cltrace.compile(TUNABLE, context=cl_ctx, cache=ProgramCache(cache / "other"))
            assert prg.tuned is None and answer(prg, queue) == 5
    warned = warnings_of(caplog)
    assert len(warned) == 1 and warned[0].startswith(f"cltrace: not using the tune store: the folder {path.parent} ")
    with pytest.raises(PermissionError, match="not writing to the tune store"):
        tunedb.store(src, (), dev, {"defines": {"OTHER": 7}})


def test_a_device_verdict_others_can_write_is_not_believed(queue: Any, caplog: pytest.LogCaptureFixture) -> None:
    dev = queue.device
    path = Path(probe.verdict_path(dev))
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"device_key": device_info(dev).key, "probe": probe._probe_id(probe.PROBE_SOURCE, ()),
                                "compiles": False, "reason": "planted"}))
    os.chmod(path.parent, 0o777)
    with caplog.at_level(logging.WARNING, logger="cltrace"):
        got = probe.verdict(dev)
    assert got.compiles and not got.cached, "probed for real, the planted verdict not read"
    warned = warnings_of(caplog)
    assert len(warned) == 1 and "not using the device verdict cache" in warned[0]
    assert "planted" in path.read_text(), "nothing written into that folder"


# ---- stored defines never become other compiler options ----------------------------------------------

@pytest.mark.parametrize("value", ["1 -DINJECTED=1", "1\t-DINJECTED", "-DINJECTED", "1)", "x y", "", "'1'",
                                   ["1"], {"a": 1}, float("nan")])
def test_a_stored_define_that_is_not_a_number_or_identifier_is_ignored(
        cl_ctx: Any, queue: Any, value: Any, caplog: pytest.LogCaptureFixture) -> None:
    path = tunedb.store(tunedb.source_hash(TUNABLE), (), device_key(queue.device), {"defines": {"OTHER": value}})
    with caplog.at_level(logging.WARNING, logger="cltrace"):
        for _ in range(3):
            prg = cltrace.compile(TUNABLE, context=cl_ctx)
            assert prg.tuned is None and prg.options == ()
            assert answer(prg, queue) == 5
    warned = warnings_of(caplog)
    assert len(warned) == 1 and path in warned[0] and "not a number or an identifier" in warned[0], warned


@pytest.mark.parametrize("value, options", [(7, ("-DOTHER=7",)), ("7", ("-DOTHER=7",)), ("0x7", ("-DOTHER=0x7",)),
                                            ("7u", ("-DOTHER=7u",)), (-7, ("-DOTHER=-7",)),
                                            ("SEVEN", ("-DOTHER=SEVEN", "-DSEVEN=7"))])
def test_a_stored_define_that_is_a_number_or_identifier_applies(cl_ctx: Any, queue: Any, value: Any,
                                                                 options: tuple[str, ...]) -> None:
    defines = {"OTHER": value, **({"SEVEN": 7} if value == "SEVEN" else {})}
    tunedb.store(tunedb.source_hash(TUNABLE), (), device_key(queue.device), {"defines": defines})
    prg = cltrace.compile(TUNABLE, context=cl_ctx)
    assert prg.options == options
    assert answer(prg, queue) == -7 if value == -7 else answer(prg, queue) == 7


@pytest.mark.parametrize("params", [{"tile": "1 -DINJECTED"}, {"tile": [1e400]}, {"unroll": [[1]]}, ["tile"]])
def test_stored_params_that_are_not_positive_integers_are_ignored(
        cl_ctx: Any, queue: Any, params: Any, caplog: pytest.LogCaptureFixture) -> None:
    from cltrace.tune import Autotuner
    from cltrace.tune.kernels.matmul import MATMUL

    key = device_key(queue.device)
    tunedb.store(tunedb.source_hash(TUNABLE), (), key, {"defines": {"OTHER": 7}, "params": params})
    tunedb.store(MATMUL.source_hash, MATMUL.options, key, {"defines": {"TILE_X": 1}, "params": params},
                 signature=(8, 8, 8))
    with caplog.at_level(logging.WARNING, logger="cltrace"):
        prg = cltrace.compile(TUNABLE, context=cl_ctx)
        assert prg.tuned is None and answer(prg, queue) == 5
        assert Autotuner(queue, progress=False).best(MATMUL, (8, 8, 8)) is None
    warned = warnings_of(caplog)
    assert len(warned) == 1 and "its params" in warned[0], warned


# ---- a header nested too deep for the parser ---------------------------------------------------------

def test_a_program_entry_nested_too_deep_is_removed_and_rebuilt(cl_ctx: Any, queue: Any, tmp_path: Path,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    folder = tmp_path / "programs"
    entry = entry_of(ProgramCache(folder), cltrace.compile(FIVE, context=cl_ctx, cache=ProgramCache(folder)))
    good = entry.read_bytes()
    entry.write_bytes(b"CLTRACE-PROGRAM 1\n" + NESTED + b"\n")
    with caplog.at_level(logging.WARNING, logger="cltrace"):
        prg = cltrace.compile(FIVE, context=cl_ctx, cache=ProgramCache(folder))
    assert prg.cache_hit == "miss" and answer(prg, queue) == 5
    warned = warnings_of(caplog)
    assert len(warned) == 1 and "RecursionError" in warned[0] and "removed, rebuilding" in warned[0]
    assert entry.read_bytes() == good
    assert cltrace.compile(FIVE, context=cl_ctx, cache=ProgramCache(folder)).cache_hit == "disk"


def test_a_tune_entry_nested_too_deep_is_removed(cl_ctx: Any, queue: Any, caplog: pytest.LogCaptureFixture) -> None:
    path = Path(tunedb.store(tunedb.source_hash(TUNABLE), (), device_key(queue.device), {"defines": {"OTHER": 666}}))
    path.write_bytes(NESTED)
    with caplog.at_level(logging.WARNING, logger="cltrace"):
        for _ in range(2):
            prg = cltrace.compile(TUNABLE, context=cl_ctx)
            assert prg.tuned is None and answer(prg, queue) == 5
    warned = warnings_of(caplog)
    assert len(warned) == 1 and str(path) in warned[0] and "RecursionError" in warned[0] and "removed" in warned[0]
    assert not path.exists()


def test_a_device_verdict_nested_too_deep_is_probed_again(queue: Any) -> None:
    path = Path(probe.verdict_path(queue.device))
    path.parent.mkdir(parents=True, mode=0o700)
    path.write_bytes(b"[" * 30000 + b"]" * 30000)  # within the 64 KiB a verdict is read to
    got = probe.verdict(queue.device)
    assert got.compiles and not got.cached
    assert json.loads(path.read_text())["compiles"] is True, "rewritten"
