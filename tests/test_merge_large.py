"""``merge`` of inputs read in windows: the same merged trace as of the inputs read whole, in memory bounded by the
window.

Each case merges the same inputs twice, read whole (``windowed_from`` past their size) and in windows of a few KiB
(``windowed_from=0``), into either format, and reads both back with cltrace's reader: the same spans (a multiset,
parents named by what they are rather than by id), the same tracks, the same metadata but for the tracks' ids
(a windowed input's tracks are numbered as its windows first name them). Inputs: both demo traces (several threads,
devices, compiles), a synthesised trace of 40k spans in both formats, and the .pftrace of one and the .json of the
other cut off part way. Without the C scanner (``CLTRACE_NATIVE=0``) no input can be read in windows: the merge
reads them whole, and the same cases hold.
"""
from __future__ import annotations

import collections
import gzip
import os
import sys
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

from big_trace import write_big_trace
from cltrace.errors import TraceFileError
from cltrace.merge import merge
from cltrace.read import load, load_columns, scan
from cltrace.read.batches import open_batches
from cltrace.read.inflate import expand
from cltrace.timeline.batch import SpanBatch

from conftest import trace_processor_shell  # noqa: E402  (tests/ is on sys.path under pytest)

WINDOWS = scan.NATIVE is not None  # the windowed readers need the C scanner; without it every input is read whole
needs_windows = pytest.mark.skipif(not WINDOWS, reason=f"C scanner not in use: {scan.WHY}")
GOLDEN = Path(__file__).resolve().parent / "golden"
WHOLE = 1 << 62  # windowed_from past any file: every input read whole
WINDOW = 4 << 10


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("merge_large")
    got = {"demo.json": out / "demo.json", "demo.pftrace": out / "demo.pftrace"}
    got["demo.json"].write_bytes(gzip.decompress((GOLDEN / "demo.json.gz").read_bytes()))
    got["demo.pftrace"].write_bytes((GOLDEN / "demo.pftrace").read_bytes())
    got["big.pftrace"], got["big.json"] = out / "big.pftrace", out / "big.json"
    write_big_trace(40_000, str(got["big.pftrace"]), str(got["big.json"]), seed=3)
    # Cut off where the windowed reader still reads them and after the start time (the .json's metadata comes
    # with its first flush: the synthesised one has it only at its end).
    for name in ("big.pftrace", "demo.json"):
        data = got[name].read_bytes()
        cut = got["cut." + name.split(".")[1]] = out / f"cut.{name.split('.')[1]}"
        for frac in (0.61, 0.67, 0.73, 0.79):
            cut.write_bytes(data[:int(len(data) * frac)])
            spans, meta = load_columns(cut)
            windowed = isinstance(spans, SpanBatch) and open_batches(cut, 0, WINDOW).windowed
            if "start_ns" in meta and (windowed or not WINDOWS):
                break
        else:
            raise AssertionError(f"no cut of {name} the windowed reader reads")
    return got


def read_back(path: Path) -> tuple[collections.Counter, collections.Counter, dict[str, Any]]:
    """A merged file's spans (ids replaced by what they name), its tracks, its metadata but the tracks."""
    spans, meta = load(path)
    tracks = meta.pop("tracks")

    def track(tid: Any) -> Any:
        return tuple(sorted(tracks[str(tid)].items())) if tid else None

    by_id = {s.id: (s.name, s.host_begin, track(s.thread)) for s in spans}
    rows = collections.Counter(
        (s.name, s.cat, track(s.thread), s.host_begin, s.host_end, track(s.device_track), s.dev_queued, s.dev_submit,
         s.dev_start, s.dev_end, s.raw_start, s.raw_end, s.path, s.status, s.error, repr(s.attrs), repr(s.site),
         by_id.get(s.parent, "not in the file") if s.parent else None) for s in spans)
    return rows, collections.Counter(track(t) for t in tracks), meta


# The demo traces come from another host, days before: not merged with the synthesised ones (placed by Unix time,
# their times would fall before the clock's zero).
CASES = [("demo.json", "demo.pftrace"), ("big.json", "big.pftrace"), ("cut.pftrace", "big.json"),
         ("demo.pftrace", "cut.json")]


@pytest.mark.parametrize("out", ["pftrace", "json"])
@pytest.mark.parametrize("inputs", CASES, ids="+".join)
def test_a_merge_in_windows_is_the_merge_of_the_whole_files(files: dict[str, Path], tmp_path: Path,
                                                           inputs: tuple[str, str], out: str) -> None:
    paths = [str(files[n]) for n in inputs]
    whole = merge(paths, tmp_path / f"whole.{out}", windowed_from=WHOLE)
    streamed = merge(paths, tmp_path / f"streamed.{out}", windowed_from=0, window_bytes=WINDOW)
    assert [p.windowed for p in whole.processes] == [False, False]
    assert [p.windowed for p in streamed.processes] == [WINDOWS, WINDOWS]
    assert streamed.spans == whole.spans > 700
    assert [line.replace(" (large: read in windows)", "") for line in streamed.lines()] == whole.lines()
    w_rows, w_tracks, w_meta = read_back(tmp_path / f"whole.{out}")
    s_rows, s_tracks, s_meta = read_back(tmp_path / f"streamed.{out}")
    assert s_rows == w_rows and sum(s_rows.values()) == whole.spans
    assert s_tracks == w_tracks
    assert s_meta == w_meta and s_meta["recorded_spans"] == whole.spans
    if any(n.startswith("cut.") for n in inputs):
        assert any(p["name"].endswith("(cut off)") for p in s_meta["merged"]["processes"])


def test_a_merge_in_windows_may_write_over_its_first_input(files: dict[str, Path], tmp_path: Path) -> None:
    first = tmp_path / "first.pftrace"
    first.write_bytes(files["big.pftrace"].read_bytes())
    merge([first, files["big.json"]], tmp_path / "whole.pftrace", windowed_from=WHOLE)
    merge([first, files["big.json"]], first, windowed_from=0, window_bytes=WINDOW)
    assert read_back(first) == read_back(tmp_path / "whole.pftrace")
    assert sorted(os.listdir(tmp_path)) == ["first.pftrace", "whole.pftrace"]  # no temporary file left


def test_perfettos_trace_processor_reads_a_merge_in_windows_as_the_whole_merge(files: dict[str, Path],
                                                                             tmp_path: Path) -> None:
    shell = trace_processor_shell()
    if shell is None:
        pytest.skip("no trace processor: set CLTRACE_TRACE_PROCESSOR, or put one at ../shared/tools/")
    from perfetto.trace_processor import TraceProcessor, TraceProcessorConfig

    paths = [str(files[n]) for n in ("big.pftrace", "cut.pftrace", "big.json")]
    got = []
    for name, windowed_from in (("whole", WHOLE), ("streamed", 0)):
        out = str(tmp_path / f"{name}.pftrace")
        merge(paths, out, windowed_from=windowed_from, window_bytes=WINDOW)
        with TraceProcessor(trace=out, config=TraceProcessorConfig(bin_path=shell)) as tp:
            bad = [(r.name, r.idx, r.value) for r in tp.query(
                "select name, idx, value from stats where severity in ('error', 'data_loss') and value > 0")]
            assert bad == [], f"{name}: {bad}"
            slices = collections.Counter((r.name, r.ts, r.dur, r.depth, r.track) for r in tp.query(
                "select s.name as name, s.ts as ts, s.dur as dur, s.depth as depth, "
                "coalesce(t.name, tr.name) || ' / ' || coalesce(p.name, '') as track from slice s "
                "join track tr on s.track_id = tr.id left join thread_track tt on tt.id = tr.id "
                "left join thread t on t.utid = tt.utid left join process_track pt on pt.id = tr.id "
                "left join process p on p.upid = coalesce(t.upid, pt.upid) where s.name != 'cltrace.metadata'"))
            flows = next(iter(tp.query("select count(*) as n from flow"))).n
        got.append((slices, flows))
    assert got[0] == got[1]
    assert sum(got[0][0].values()) > 40_000 and got[0][1] > 0


@needs_windows
def test_a_merge_in_windows_holds_a_fraction_of_the_whole_files_memory(tmp_path: Path) -> None:
    """Traced allocations (numpy's, the scanner's, the sink's): a plain .pftrace of 400k spans (31 MiB) read in
    windows of 256 KiB against the same merge read whole (here 37 against 330 MiB; the former the same at 200k
    spans, the latter half)."""
    path = tmp_path / "big.pftrace"
    small = tmp_path / "small.pftrace"
    n = write_big_trace(400_000, str(path))
    path.write_bytes(expand(path.read_bytes()).data)  # plain packets: a window is a fraction of the file
    write_big_trace(2_000, str(small), seed=1)

    def peak(windowed_from: int) -> tuple[int, Any]:
        tracemalloc.start()
        try:
            result = merge([path, small], tmp_path / "out.pftrace", windowed_from=windowed_from,
                           window_bytes=256 << 10)
            return tracemalloc.get_traced_memory()[1], result
        finally:
            tracemalloc.stop()

    whole, w = peak(WHOLE)
    windows, s = peak(64 << 10)  # the big file in windows, the small one whole
    assert [p.windowed for p in s.processes] == [True, False] and s.spans == w.spans >= n
    assert windows < whole / 4, (windows, whole)


@needs_windows
def test_an_input_that_changes_between_its_passes_is_one_line_naming_it(files: dict[str, Path], tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    merging = sys.modules["cltrace.merge.merge"]
    victim = tmp_path / "victim.pftrace"
    opened = merging.open_batches

    def then_spoil(path: Any, *args: Any) -> Any:
        got = opened(path, *args)
        if os.fspath(path) == str(victim):  # after its first pass, before its second
            spoil(victim)
        return got

    monkeypatch.setattr(merging, "open_batches", then_spoil)
    for spoil, message in ((lambda p: p.write_bytes(b"\x0a\xff" * (p.stat().st_size // 2)), "the file changed"),
                           (lambda p: p.unlink(), "cannot read it")):
        victim.write_bytes(files["big.pftrace"].read_bytes())
        out = tmp_path / "out.json"
        with pytest.raises(TraceFileError) as err:
            merge([files["big.json"], victim], out, windowed_from=0, window_bytes=WINDOW)
        text = str(err.value)
        assert text.startswith(f"{victim}: ") and message in text and "\n" not in text, text
        assert not out.exists() and not [f for f in os.listdir(tmp_path) if f.endswith(".tmp")]
