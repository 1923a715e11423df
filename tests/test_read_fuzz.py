"""Trace files as users hand them to ``cltrace summary`` and ``cltrace analyze``: cut off, corrupt, wrongly typed.

Whatever the damage, the summary and the analysis either report (a cut-off file with a warning saying
how much was read) or exit 2 with a one-line reason; never a traceback, on the native scanner and on
the general readers alike. Hypothesis mutates a real trace of each format: fields replaced by values of
any JSON type (in events, annotations and anywhere in the run's metadata), events and packets
corrupted, files cut at any byte. ``CLTRACE_FUZZ_EXAMPLES`` sets the examples per test (150 in CI; a
campaign runs thousands).
"""
from __future__ import annotations

import json
import os
import time
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

import cltrace
from cltrace.analyzers.analysis import analyze
from cltrace.analyzers.render import render_analysis
from cltrace.analyzers.report import render
from cltrace.analyzers.summary import summarize
from cltrace.cli import main
from cltrace.errors import TraceFileError
from cltrace.read import load
from cltrace.read.inflate import expand
from cltrace.read.perfetto import iter_packets
from cltrace.export.protowire import varint

FUZZ = settings(max_examples=int(os.environ.get("CLTRACE_FUZZ_EXAMPLES", "150")), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6)


@pytest.fixture(scope="module")
def originals(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    """A real run (regions, kernels, transfers, a failed region) in both formats."""
    from cltrace.cli.demo import run_demo

    out = tmp_path_factory.mktemp("orig")
    res = run_demo(out_dir=str(out), steps=2, formats=("json", "pftrace"))
    files = {}
    for p in res.paths:
        with open(p, "rb") as fh:
            files[os.path.splitext(p)[1]] = fh.read()
    return files


def refused(exc: TraceFileError) -> None:
    msg = str(exc)
    assert msg and "\n" not in msg, f"not a one-line reason: {msg!r}"


def summary_of(path: str) -> dict[str, Any] | None:
    """What ``cltrace summary`` computes (text and --json); None where it refused the file with one line."""
    try:
        stats, meta = summarize(path)
    except TraceFileError as exc:
        refused(exc)
        return None
    text = render(stats.as_dict(), meta)
    text.encode("utf-8")  # printable on a strict UTF-8 terminal
    json.dumps({"regions": stats.as_dict(), "meta": meta}, default=str)
    return meta


def analysis_of(path: str) -> None:
    """What ``cltrace analyze`` computes (text and --json), or its one-line refusal."""
    try:
        a = analyze(path)
    except TraceFileError as exc:
        refused(exc)
        return
    render_analysis(a, width=120).encode("utf-8")
    a.to_json()


def both(path: str) -> None:
    summary_of(path)
    analysis_of(path)


def mutate_metadata(draw: Any, meta: Any) -> Any:
    """``meta`` with one field somewhere inside it replaced by any JSON value, or deleted."""
    node, steps = meta, draw(st.integers(0, 4))
    for _ in range(steps):
        kids = list(node.items()) if isinstance(node, dict) else list(enumerate(node)) if isinstance(node, list) else []
        kids = [(k, v) for k, v in kids if isinstance(v, (dict, list)) and v]
        if not kids:
            break
        node = draw(st.sampled_from(kids))[1]
    if isinstance(node, dict) and node:
        key = draw(st.sampled_from(sorted(node)))
        if draw(st.booleans()):
            del node[key]
        else:
            node[key] = draw(json_values | st.sampled_from([1e400, -1, 1 << 64, "\ud800", [1, 2], {"a": 1}]))
    elif isinstance(node, list) and node:
        node[draw(st.integers(0, len(node) - 1))] = draw(json_values)
    return meta


def json_lines(events: list[Any]) -> bytes:
    """Events laid out as cltrace writes them: one per line, each followed by a comma, then ``]``."""
    return ("[\n" + "".join(json.dumps(e) + ",\n" for e in events[:-1]) + json.dumps(events[-1]) + "\n]\n").encode()


@st.composite
def mutated_json(draw: Any, events: list[Any]) -> bytes:
    events = json.loads(json.dumps(events))
    for _ in range(draw(st.integers(1, 3))):
        i = draw(st.integers(0, len(events) - 1))
        ev = events[i]
        kind = draw(st.sampled_from(["field", "arg", "delete", "event", "meta"]))
        metas = [e for e in events if isinstance(e, dict) and e.get("name") == "cltrace.metadata"]
        if kind == "meta" and metas:
            m = draw(st.sampled_from(metas))
            m["args"] = mutate_metadata(draw, m.get("args"))
        elif kind == "event" or not isinstance(ev, dict):
            events[i] = draw(json_values)
        elif kind == "delete" and ev:
            del ev[draw(st.sampled_from(sorted(ev)))]
        elif kind == "arg" and isinstance(ev.get("args"), dict) and ev["args"]:
            key = draw(st.sampled_from(sorted(ev["args"])))
            ev["args"][key] = draw(json_values)
        else:
            key = draw(st.sampled_from(sorted(ev) + ["ts", "dur", "args", "name", "tid"]))
            ev[key] = draw(json_values)
    data = json_lines(events).replace(b"Infinity", b"1e400")
    if draw(st.booleans()):
        data = data[:draw(st.integers(0, len(data)))]
    return data


def test_fuzz_json(originals: dict[str, bytes], path_kind: str, tmp_path: Any) -> None:
    events = json.loads(originals[".json"])
    path = str(tmp_path / "fuzz.json")

    @FUZZ
    @given(mutated_json(events))
    def check(data: bytes) -> None:
        with open(path, "wb") as fh:
            fh.write(data)
        both(path)

    check()


def packet(p: Any) -> bytes:
    raw = p.SerializeToString()
    return b"\x0a" + varint(len(raw)) + raw


@st.composite
def mutated_pftrace(draw: Any, packets: list[bytes]) -> bytes:
    packets = list(packets)
    for _ in range(draw(st.integers(1, 3))):
        i = draw(st.integers(0, len(packets) - 1))
        kind = draw(st.sampled_from(["annotation", "metadata", "meta_field", "timestamp", "bytes"]))
        try:
            p = pb.TracePacket.FromString(packets[i])
        except Exception:  # already corrupted by an earlier mutation
            p, kind = pb.TracePacket(), "bytes"
        anns = p.track_event.debug_annotations if p.HasField("track_event") else []
        if kind == "annotation" and anns:
            a = anns[draw(st.integers(0, len(anns) - 1))]
            which = draw(st.sampled_from(["string", "double", "bool", "int", "uint", "dict", "json"]))
            if which == "string":
                a.string_value = draw(st.text(max_size=8))
            elif which == "double":
                a.double_value = draw(st.floats())
            elif which == "bool":
                a.bool_value = draw(st.booleans())
            elif which == "int":
                a.int_value = draw(st.integers(-(1 << 63), (1 << 63) - 1))
            elif which == "uint":
                a.uint_value = draw(st.integers(0, (1 << 64) - 1))
            elif which == "dict":
                a.ClearField("int_value")
                a.dict_entries.add(name="x", int_value=1)
            else:
                a.legacy_json_value = json.dumps(draw(json_values))
            packets[i] = p.SerializeToString()
        elif kind == "metadata" and anns and p.track_event.name == "cltrace.metadata":
            anns[0].string_value = json.dumps(draw(json_values))
            packets[i] = p.SerializeToString()
        elif kind == "meta_field" and anns and p.track_event.name == "cltrace.metadata":
            try:
                meta = json.loads(anns[0].string_value)
            except ValueError:  # already replaced by an earlier mutation
                meta = {}
            meta = mutate_metadata(draw, meta)
            anns[0].string_value = json.dumps(meta).replace("Infinity", "1e400")
            packets[i] = p.SerializeToString()
        elif kind == "timestamp" and p.HasField("track_event"):
            p.timestamp = draw(st.sampled_from([0, (1 << 63) - 1, 1 << 63, (1 << 64) - 1])
                               | st.integers(0, (1 << 64) - 1))
            packets[i] = p.SerializeToString()
        else:
            raw = bytearray(packets[i])
            for _ in range(draw(st.integers(1, 4))):
                if raw:
                    raw[draw(st.integers(0, len(raw) - 1))] = draw(st.integers(0, 255))
            packets[i] = bytes(raw)
    data = b"".join(b"\x0a" + varint(len(x)) + x for x in packets)
    if draw(st.booleans()):
        data = data[:draw(st.integers(0, len(data)))]
    return data


def test_fuzz_pftrace(originals: dict[str, bytes], path_kind: str, tmp_path: Any) -> None:
    packets = [raw for _, raw in iter_packets(originals[".pftrace"])]
    path = str(tmp_path / "fuzz.pftrace")

    @FUZZ
    @given(mutated_pftrace(packets))
    def check(data: bytes) -> None:
        with open(path, "wb") as fh:
            fh.write(data)
        both(path)

    check()


def test_track_names_with_invalid_utf8_are_read(originals: dict[str, bytes], tmp_path: Any) -> None:
    """A counter or thread track whose name is not UTF-8 (proto2 gives bytes) is still read, with replacements."""
    data = expand(originals[".pftrace"]).data  # the names as plain bytes, to damage them in place
    assert b"device memory" in data and b"MainThread" in data
    data = data.replace(b"device memory", b"\x80evice memory").replace(b"MainThread", b"\xffainThread")
    path = tmp_path / "names.pftrace"
    path.write_bytes(data)
    meta = summary_of(str(path))
    assert meta is not None


@given(cut=st.floats(0.05, 0.999))
@settings(max_examples=30, deadline=None)
def test_any_cut_keeps_what_was_written_and_says_so(originals: dict[str, bytes], cut: float, tmp_path_factory: Any) -> None:
    d = tmp_path_factory.mktemp("cut")
    for ext, data in originals.items():
        path = str(d / f"cut{ext}")
        n = int(len(data) * cut)
        with open(path, "wb") as fh:
            fh.write(data[:n])
        meta = summary_of(path)
        if meta is None:  # nothing readable that early: refused with one line
            assert n < 4096
            continue
        info = meta["truncated"]
        assert info["file_bytes"] == n and 0 < info["read_bytes"] <= n
        assert n - info["read_bytes"] < 4096  # only the torn last event or packet is lost


def test_a_pftrace_cut_after_a_recalibration_flush_is_reported_cut(tmp_path: Any) -> None:
    """A flush rewrites the metadata when the clocks change (so a killed trace has them); that
    mid-file copy must not read as the final one, or a file cut after it is taken as complete."""
    from cltrace.record.recorder import RECORDER

    path = str(tmp_path / "flushed.pftrace")
    with cltrace.trace(path):
        with cltrace.region("before"):
            pass
        RECORDER.flush(block=True)
        for sink in RECORDER.sinks:  # as after a recalibration: the next flush writes the metadata again
            sink._clocks_written = ""
        RECORDER._flush_sinks()
        size = os.path.getsize(path + ".partial")  # its name until it is closed
        with cltrace.region("after"):
            pass
    with open(path, "rb") as fh:
        data = fh.read()
    cut = tmp_path / "cut.pftrace"
    cut.write_bytes(data[:size])
    meta = summary_of(str(cut))
    assert meta is not None and meta["truncated"]["file_bytes"] == size


def test_complete_files_are_not_reported_cut(originals: dict[str, bytes], tmp_path: Any) -> None:
    for ext, data in originals.items():
        path = tmp_path / f"whole{ext}"
        path.write_bytes(data)
        meta = summary_of(str(path))
        assert meta is not None and "truncated" not in meta


def many_spans_file(path: str, n: int) -> None:
    with cltrace.trace(path):
        for i in range(n):
            with cltrace.region(f"r{i % 7}"):
                pass


@pytest.mark.timing
def test_cut_json_with_a_corrupt_line_is_read_in_linear_time_keeping_every_readable_event(tmp_path: Any) -> None:
    path = str(tmp_path / "big.json")
    many_spans_file(path, 8000)
    with open(path) as fh:
        lines = fh.read().split("\n")
    assert len(lines) > 8000
    x_lines = [i for i, ln in enumerate(lines) if ln.startswith('{"ph":"X"')]
    bad = x_lines[len(x_lines) // 3]
    lines[bad] = lines[bad][:25] + "#corrupt#" + lines[bad][40:]
    cut = "\n".join(lines[:-4]) + "\n" + lines[-4][:30]  # cut off inside an event near the end
    with open(path, "w") as fh:
        fh.write(cut)
    t0 = time.perf_counter()
    spans, meta = load(path)
    took = time.perf_counter() - t0
    assert took < 20.0, f"repair took {took:.1f}s"  # was 75 s: quadratic (under 1 s here)
    readable = sum(1 for ln in lines[:-4] if ln.startswith('{"ph":"X"')) - 1
    assert len(spans) == readable  # everything after the corrupt line is kept
    assert meta["truncated"]["skipped"] == 1


@pytest.mark.parametrize("event, reason", [
    ({"ph": "X", "name": "a", "args": {"span": 1}}, "'ts' is None, not a number"),
    ({"ph": "X", "name": "a", "ts": 1e308, "dur": 1, "args": {"span": 1}}, "out of range"),
    ({"ph": "X", "name": "a", "ts": 1, "dur": 1, "args": {"span": [1]}}, "'args.span' is [1], not an integer"),
    ({"ph": "X", "name": ["a"], "ts": 1, "dur": 1, "args": {"span": 1}}, "'name' is ['a'], not a string"),
    ({"ph": "X", "name": "a", "ts": 1, "dur": 1, "args": "span"}, "'args' is 'span', not an object"),
    ({"ph": "i", "name": "cltrace.metadata", "args": [1]}, "cltrace.metadata is [1], not an object"),
    ({"ph": "i", "name": "cltrace.metadata", "args": {"clocks": {"dev": 3}}}, "'clocks' of 'dev' is 3"),
])
def test_wrongly_typed_fields_exit_2_with_one_line(event: dict[str, Any], reason: str, tmp_path: Any,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps([event]))
    assert main(["summary", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("cltrace: error: ") and reason in err, err


@pytest.mark.parametrize("site, expect", [
    ({"code.line.number": float("inf")}, None),  # found by the fuzz: int(inf) raised OverflowError
    ({"code.line.number": "x"}, None),
    ({"code.line.number": 3, "code.stacktrace": "a.py:3 in f\nb.py:\u00b2 in g"}, ("a.py", 3, "f", (("b.py", 0, "g"),))),
])
def test_call_sites_with_unreadable_line_numbers_are_read(site: dict[str, Any], expect: Any, tmp_path: Any) -> None:
    path = tmp_path / "site.json"
    args = {"span": 1, "code.file.path": "a.py", "code.function.name": "f", **site}
    path.write_text(json.dumps([{"ph": "X", "name": "a", "ts": 1, "dur": 2, "args": args}]))
    assert main(["summary", str(path)]) == 0
    (span,), _ = load(path)
    got = span.site and (span.site.file, span.site.line, span.site.function,
                         tuple((c.file, c.line, c.function) for c in span.site.callers))
    assert got == expect


def test_a_name_with_a_lone_surrogate_is_printed(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "s.json"
    path.write_text('[{"ph": "X", "name": "a\\ud800b", "ts": 1, "dur": 2, "args": {"span": 1}}]')
    assert main(["summary", str(path)]) == 0
    assert "a\ufffdb" in capsys.readouterr().out


@pytest.mark.parametrize("ext", [".json", ".pftrace"])
def test_summary_of_a_cut_off_file_warns_how_much_was_read(ext: str, originals: dict[str, bytes], tmp_path: Any,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    data = originals[ext]
    path = tmp_path / f"cut{ext}"
    path.write_bytes(data[:len(data) * 2 // 3])
    assert main(["summary", str(path)]) == 0
    out, err = capsys.readouterr()
    assert "cltrace summary" in out
    (line,) = err.splitlines()
    assert line.startswith(f"cltrace: warning: {path}: the file is cut off")
    assert f"of {len(data) * 2 // 3:,} bytes" in line
