"""Trace files from someone else: one-field edits of a real trace, and decompression bombs.

Each edit is one field of a ``cltrace demo`` trace changed; through ``summary``, ``analyze``, ``diff``,
``merge`` and ``cltrace.analyze()``, on the native scanner and on the general readers, it is either read
(its text printable) or refused with one line naming the field: exit 2 on the command line,
TraceFileError from the library. A ``.pftrace`` that inflates without limit is read within a budget,
in bounded memory, and says in one line what it skipped.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import zlib
from typing import Any, Callable

import pytest
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

import cltrace
from cltrace.cli import main
from cltrace.errors import TraceFileError
from cltrace.export.perfetto.wire import METADATA_EVENT, P_COMPRESSED
from cltrace.export.protowire import varint
from cltrace.read import load_columns, scan
from cltrace.read.inflate import MAX_RATIO, budget, expand
from cltrace.read.perfetto import iter_packets

Meta = dict[str, Any]


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A real run (regions, kernels, transfers, device memory) in both formats: ext -> path."""
    from cltrace.cli.demo import run_demo

    out = tmp_path_factory.mktemp("demo")
    res = run_demo(out_dir=str(out), steps=2, formats=("json", "pftrace"))
    return {os.path.splitext(p)[1]: p for p in res.paths}


def frame(raw: bytes) -> bytes:
    return b"\x0a" + varint(len(raw)) + raw


def packets_of(path: str) -> list[pb.TracePacket]:
    with open(path, "rb") as fh:
        return [pb.TracePacket.FromString(raw) for _, raw in iter_packets(fh.read())]


def write_packets(path: str, packets: list[Any]) -> None:
    with open(path, "wb") as fh:
        fh.write(b"".join(frame(p if isinstance(p, bytes) else p.SerializeToString()) for p in packets))


INF = 12345.678e300  # written as the literal 1e400 (json.dumps cannot write it)


def _encode(meta: Meta) -> str:
    return json.dumps(meta).replace("1.2345678e+304", "1e400")


def edit_metadata(src: str, dst: str, edit: Callable[[Meta], None]) -> None:
    """``src`` with ``edit`` applied to each copy of the run's metadata that has the fields it edits."""
    done = 0

    def apply(meta: Meta) -> bool:
        nonlocal done
        try:
            edit(meta)
        except (KeyError, StopIteration):
            return False
        done += 1
        return True

    if src.endswith(".json"):
        with open(src) as fh:
            events = json.load(fh)
        for ev in events:
            if isinstance(ev, dict) and ev.get("name") == "cltrace.metadata":
                apply(ev["args"])
        with open(dst, "w") as fh:
            fh.write(_encode(events))  # type: ignore[arg-type]
    else:
        packets = packets_of(src)
        for p in packets:
            if p.HasField("track_event") and p.track_event.name == METADATA_EVENT:
                for a in p.track_event.debug_annotations:
                    meta = json.loads(a.string_value)
                    if a.name == "json" and apply(meta):
                        a.string_value = _encode(meta)
        write_packets(dst, packets)
    assert done, "the edit applies to no copy of the metadata"


def clock(m: Meta) -> Meta:
    return next(iter(m["clocks"].values()))


def context(m: Meta) -> Meta:
    return next(iter(m["memory"]["contexts"].values()))


def _set(d: Meta, key: str, value: Any) -> None:
    d[key] = value


def _drop(d: Meta, key: str) -> None:
    del d[key]


# edit -> the reason the one-line error gives (None: the file is read and printed)
METADATA_EDITS: dict[str, tuple[Callable[[Meta], None], str | None]] = {
    "points 1e400": (lambda m: _set(clock(m), "points", INF), "'points' is inf, not an integer"),
    "points [1,2]": (lambda m: _set(clock(m), "points", [1, 2]), "'points' is [1, 2], not an integer"),
    "device label \\ud800": (lambda m: _set(next(iter(m["devices"].values())), "label", "gpu\ud800"), None),
    "host name \\ud800": (lambda m: _set(m["host"], "name", "\ud800"), None),
    "context label \\ud800": (lambda m: _set(context(m), "label", "c\ud800"), None),
    "memory.contexts a list": (lambda m: _set(m["memory"], "contexts", [1]), "'contexts' is [1], not an object"),
    "context label missing": (lambda m: _drop(context(m), "label"), "'label' is missing"),
    "samples_dropped text": (lambda m: _set(m["memory"], "samples_dropped", "3"), "'samples_dropped' is '3'"),
    "alive_sites text": (lambda m: _set(m["memory"], "alive_sites", "x"), "'alive_sites' is 'x'"),
    "alive not a list": (lambda m: _set(m["memory"], "alive", 3), "'alive' is 3, not a list"),
    "context devices a float": (lambda m: _set(context(m), "devices", 1.5),
                                "'devices' is 1.5, not a list"),
    "alive site missing": (lambda m: _drop(m["memory"]["alive"][0], "site"), "'site' is missing"),
    "truncated in the file": (lambda m: _set(m, "truncated", {"x": 1}), None),
}


def run_all(bad: str, good: str, out_dir: Any) -> dict[str, tuple[Any, str, str]]:
    """(exit status or the library's outcome, stdout, stderr) of each command on ``bad``."""
    got: dict[str, tuple[Any, str, str]] = {}
    for name, argv in [("summary", ["summary", bad]), ("analyze", ["analyze", bad]), ("diff", ["diff", good, bad]),
                       ("merge", ["merge", "-o", str(out_dir / "merged.json"), good, bad])]:
        err = _Capture()
        with err:
            rc = main(argv)
        got[name] = (rc, err.out, err.err)
    try:
        report = cltrace.analyze(bad).report(width=120)
        got["library"] = ("ok", report, "")
    except TraceFileError as exc:
        got["library"] = ("TraceFileError", "", str(exc))
    return got


class _Capture:
    """stdout and stderr of the commands, as text a strict UTF-8 terminal must be able to print."""

    def __enter__(self) -> None:
        import io

        self._saved = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = io.StringIO(), io.StringIO()

    def __exit__(self, *exc: Any) -> None:
        self.out, self.err = sys.stdout.getvalue(), sys.stderr.getvalue()
        sys.stdout, sys.stderr = self._saved


def check_outcome(got: dict[str, tuple[Any, str, str]], reason: str | None) -> None:
    for cmd, (rc, out, err) in got.items():
        (out + err).encode("utf-8")  # printable: no lone surrogate reaches the terminal
        if reason is None:
            assert rc in (0, "ok"), (cmd, rc, err)
            assert "Traceback" not in err
        elif cmd == "library":
            assert rc == "TraceFileError" and reason in err and "\n" not in err, (cmd, rc, err)
        else:
            assert rc == 2, (cmd, rc, err)
            assert err.startswith("cltrace: error: ") and err.count("\n") == 1 and reason in err, (cmd, err)


@pytest.mark.parametrize("ext", [".json", ".pftrace"])
@pytest.mark.parametrize("edit", list(METADATA_EDITS))
def test_a_one_field_edit_of_the_metadata_is_read_or_refused_in_one_line(
        edit: str, ext: str, demo: dict[str, str], path_kind: str, tmp_path: Any) -> None:
    fn, reason = METADATA_EDITS[edit]
    bad = str(tmp_path / f"bad{ext}")
    edit_metadata(demo[ext], bad, fn)
    check_outcome(run_all(bad, demo[ext], tmp_path), reason)


def test_a_truncated_note_in_the_file_is_not_taken_as_the_readers(demo: dict[str, str], tmp_path: Any) -> None:
    """The file's own ``truncated`` key is dropped: only the reader says a file is cut off."""
    for ext, src in demo.items():
        bad = str(tmp_path / f"t{ext}")
        edit_metadata(src, bad, lambda m: _set(m, "truncated", {"read_bytes": -5, "file_bytes": 1, "events": 1}))
        _, meta = load_columns(bad)
        assert "truncated" not in meta


def test_transfer_bytes_of_the_wrong_type_are_refused_in_one_line(demo: dict[str, str], path_kind: str,
                                                                  tmp_path: Any) -> None:
    """The analysis sums a transfer's ``bytes``: one that is not a count is refused where it is read."""
    with open(demo[".json"]) as fh:
        events = json.load(fh)
    ev = next(e for e in events if isinstance(e, dict) and isinstance(e.get("args"), dict) and "bytes" in e["args"])
    ev["args"]["bytes"] = {"a": 1}
    bad = tmp_path / "bytes.json"
    bad.write_text(json.dumps(events))
    check_outcome(run_all(str(bad), demo[".json"], tmp_path), "'bytes' is {'a': 1}, not a count")

    packets = packets_of(demo[".pftrace"])
    names: dict[tuple[int, int], str] = {}  # (sequence, iid) -> interned annotation name
    cats: dict[tuple[int, int], str] = {}
    for p in packets:
        seq = p.trusted_packet_sequence_id
        names.update(((seq, e.iid), e.name) for e in p.interned_data.debug_annotation_names)
        cats.update(((seq, e.iid), e.name) for e in p.interned_data.event_categories)
        te = p.track_event
        if p.HasField("track_event") and any(cats.get((seq, c)) == "transfer" for c in te.category_iids):
            a = next(a for a in te.debug_annotations if names.get((seq, a.name_iid)) == "bytes")
            a.legacy_json_value = '{"a": 1}'  # in place of its int_value
            break
    else:
        raise AssertionError("no transfer in the demo's .pftrace")
    bad = tmp_path / "bytes.pftrace"
    write_packets(str(bad), packets)
    check_outcome(run_all(str(bad), demo[".pftrace"], tmp_path), "'bytes' is {'a': 1}, not a count")


def test_a_build_keyed_by_a_list_is_refused_in_one_line(demo: dict[str, str], path_kind: str, tmp_path: Any) -> None:
    """Builds are grouped by source hash, options and device: a list there is refused where it is read
    (found by the campaign: TypeError unhashable type in findings/builds.py)."""
    with open(demo[".json"]) as fh:
        events = json.load(fh)
    ev = next(e for e in events if isinstance(e, dict) and e.get("cat") in ("compile", "build")
              and isinstance(e.get("args"), dict) and "options" in e["args"])
    ev["args"]["options"] = ["-O2"]
    bad = tmp_path / "options.json"
    bad.write_text(json.dumps(events))
    check_outcome(run_all(str(bad), demo[".json"], tmp_path), "'options' is ['-O2'], not a text or a number")


def test_a_timestamp_of_2_to_the_64_minus_1_is_refused_in_one_line(demo: dict[str, str], path_kind: str,
                                                                   tmp_path: Any) -> None:
    packets = packets_of(demo[".pftrace"])
    p = next(p for p in packets if p.HasField("track_event") and p.track_event.type == pb.TrackEvent.TYPE_SLICE_BEGIN)
    p.timestamp = (1 << 64) - 1
    bad = tmp_path / "ts.pftrace"
    write_packets(str(bad), packets)
    check_outcome(run_all(str(bad), demo[".pftrace"], tmp_path), "out of range")


def _nested(depth: int, src: str, dst: str) -> None:
    packets = packets_of(src)
    p = next(p for p in packets if p.HasField("track_event") and p.track_event.type == pb.TrackEvent.TYPE_SLICE_BEGIN)
    a = p.track_event.debug_annotations.add(name="deep")
    for _ in range(depth):
        a = a.dict_entries.add(name="x")
    a.int_value = 1
    write_packets(dst, packets)


def _outcome(path: str, scanner: Any) -> str:
    try:
        load_columns(path, scanner)
    except TraceFileError as exc:
        return f"refused: {exc}"
    return "read"


@pytest.mark.skipif(scan.NATIVE is None, reason="the native scanner is not in use (CLTRACE_NATIVE=0 or not built)")
def test_annotations_nested_deep_get_one_answer_on_both_paths(demo: dict[str, str], tmp_path: Any) -> None:
    answers = set()
    for depth in range(94, 104):
        path = str(tmp_path / f"deep{depth}.pftrace")
        _nested(depth, demo[".pftrace"], path)
        native, general = _outcome(path, scan.NATIVE), _outcome(path, None)
        assert native == general, (depth, native, general)
        answers.add(native.split(":")[0])
    assert answers == {"read", "refused"}  # the limit lies in the range tried


# ---- decompression bombs -------------------------------------------------------------------------

def bomb(src: str, dst: str, inflated_mb: int, payload: bytes = b"\x00") -> None:
    """``src``'s packets with one compressed packet after the first that inflates to ``inflated_mb`` MiB."""
    packets = [raw for _, raw in iter_packets(open(src, "rb").read())]
    z = zlib.compressobj(9)
    chunk = payload * ((1 << 20) // len(payload))
    body = b"".join(z.compress(chunk) for _ in range(inflated_mb)) + z.flush()
    with open(dst, "wb") as fh:
        fh.write(frame(packets[0]) + frame(P_COMPRESSED + varint(len(body)) + body)
                 + b"".join(frame(x) for x in packets[1:]))


# The child reads the file with its address space capped (so a bomb cannot take the machine down even
# where cltrace fails to bound it) and prints its peak RSS (MiB) last: VmHWM, its own since exec (Linux's
# ru_maxrss keeps the parent's peak across fork and exec, and pytest's may be large).
CHILD = """
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))
how, path = sys.argv[1], sys.argv[2]
if how == "summary":
    from cltrace.cli import main
    rc = main(["summary", path])
else:
    import cltrace
    cltrace.analyze(path).report(width=100)
    rc = 0
sys.stdout.flush()
hwm = next(int(ln.split()[1]) for ln in open("/proc/self/status") if ln.startswith("VmHWM:"))
print(f"maxrss_mb {hwm // 1024}", file=sys.stderr)
sys.exit(rc)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="peak RSS read from /proc/self/status")
@pytest.mark.parametrize("native", ["1", "0"])
@pytest.mark.parametrize("how", ["summary", "library"])
def test_a_decompression_bomb_is_read_in_bounded_memory_and_said_in_one_line(
        how: str, native: str, demo: dict[str, str], tmp_path: Any) -> None:
    path = str(tmp_path / "bomb.pftrace")
    bomb(demo[".pftrace"], path, 1024)  # ~1 MB on disk, 1 GiB inflated
    size = os.path.getsize(path)
    assert size < 1.5e6
    env = {**os.environ, "CLTRACE_NATIVE": native, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    res = subprocess.run([sys.executable, "-c", CHILD, how, path], capture_output=True, text=True, env=env,
                         timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    *lines, rss = res.stderr.strip().splitlines()
    (line,) = lines  # one line about the file, nothing else
    assert line.startswith(f"cltrace: warning: {path}: 1 compressed packet stream (") and "skipped" in line, line
    assert f"past {budget(size):,} bytes" in line and f"{MAX_RATIO} times" in line
    assert not re.search(r"-\d", line.split(path)[1]), line  # no negative count
    peak = int(rss.split()[1])
    assert peak < 400, f"peak RSS {peak} MiB reading a {size:,}-byte file"  # 2.1 GB before the budget


def test_many_streams_share_one_budget(demo: dict[str, str], tmp_path: Any) -> None:
    """Streams each under the budget add up to it: past it, the rest are skipped, plain packets kept."""
    packets = [raw for _, raw in iter_packets(open(demo[".pftrace"], "rb").read())]
    streams = []
    for _ in range(40):
        body = zlib.compress(b"\x00" * (64 << 10), 9)  # 64 KiB each, ~80 bytes on disk
        streams.append(frame(P_COMPRESSED + varint(len(body)) + body))
    data = frame(packets[0]) + b"".join(streams) + b"".join(frame(x) for x in packets[1:])
    got = expand(data)
    left = budget(len(data))
    assert len(got.data) <= left + len(data)
    assert got.skipped is not None and 0 < got.skipped["streams"] < 40
    kept = 40 - got.skipped["streams"]
    assert got.skipped["file_bytes"] == sum(len(s) for s in streams[kept:])
    assert len(got.data) == len(data) - got.skipped["file_bytes"] - sum(len(s) for s in streams[:kept]) + kept * (64 << 10)
    assert got.file_offset(len(got.data)) == len(data)  # the plain packets after them are kept, counted in the file


def test_a_stream_of_zeros_reads_as_cut_off_with_byte_counts_of_the_file(demo: dict[str, str], path_kind: str,
                                                                         tmp_path: Any) -> None:
    """The reader stops inside an inflated stream (zeros: a writer's unwritten tail): the warning counts the
    file's bytes, up to where the stream starts, never a negative count."""
    path = str(tmp_path / "zeros.pftrace")
    packets = [raw for _, raw in iter_packets(open(demo[".pftrace"], "rb").read())]
    body = zlib.compress(b"\x00" * 50_000, 9)  # within the budget of 16 times the file
    with open(path, "wb") as fh:
        plain = b"".join(frame(x) for x in packets)
        fh.write(plain + frame(P_COMPRESSED + varint(len(body)) + body))
    _, meta = load_columns(path)
    info = meta["truncated"]
    assert (info["read_bytes"], info["file_bytes"]) == (len(plain), os.path.getsize(path))
    err = _Capture()
    with err:
        assert main(["summary", path]) == 0
    (line,) = err.err.splitlines()
    assert "cut off" in line and f"first {info['read_bytes']:,} of {info['file_bytes']:,} bytes" in line


def test_a_regions_own_bytes_attribute_may_be_anything(path_kind: str, tmp_path: Any) -> None:
    """Only a transfer's ``bytes`` is the analysis's: a user's region may carry its own, of any type."""
    path = str(tmp_path / "r.json")
    with cltrace.trace(path):
        with cltrace.region("load", attrs={"bytes": "1 MB"}):
            pass
    assert main(["analyze", path]) == 0
    assert cltrace.analyze(path).spans == 1
