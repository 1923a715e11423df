"""Call sites: every launch, transfer and region points at the user's line, through every path
(cltrace.launch/copy, cltrace.Kernel, instrumented pyopencl and pyopencl.array, regions native and
Python), skipping listed library modules; the site survives .json and .pftrace, reaches OTLP as the
semantic-convention attributes, and groups the kernel table (``analyze --by callsite``).

Each launch line ends in ``; L = line()``, so ``L`` is the line the launch is on.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any, Iterator

import numpy as np
import pyopencl as cl
import pytest

import cltrace
from cltrace.programs import launcher
from cltrace.read.load import load
from cltrace.record import callsite, regions
from cltrace.record.recorder import RECORDER
from cltrace.timeline.sites import CallSite

HERE = os.path.abspath(__file__)
NATIVE_OFF = os.environ.get("CLTRACE_NATIVE", "").strip() == "0"
SOURCE = "__kernel void inc(__global float *a) { a[get_global_id(0)] += 1.0f; }"


def line() -> int:
    """The caller's current line."""
    return sys._getframe(1).f_lineno


def where(s: Any) -> tuple[str, int] | None:
    return None if s.site is None else (s.site.file, s.site.line)


def by_name(spans: list[Any]) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for s in spans:
        out.setdefault(s.name, []).append(s)
    return out


@pytest.fixture(autouse=True)
def default_settings() -> Iterator[None]:
    callsite.configure(library_modules=[], stack_depth=1)
    yield
    callsite.configure(library_modules=[], stack_depth=1)


@pytest.fixture(params=["native", "python"])
def capture_path(request: Any, monkeypatch: pytest.MonkeyPatch) -> str:
    """Which capture the hot paths call: the C one, or the fallback CLTRACE_NATIVE=0 runs."""
    if request.param == "native":
        if NATIVE_OFF:
            pytest.skip("CLTRACE_NATIVE=0: fallback-only run")
        if callsite.CAPTURE_PATH != "native":
            pytest.fail("the C capture is not active: reinstall with `pip install -e .` where a C compiler exists")
        return "native"
    py = callsite._py_capture
    monkeypatch.setattr(regions, "_site", py)
    monkeypatch.setitem(launcher._RECORD_GLOBALS, "site", py)
    for make in launcher._FACTORIES.values():  # launchers made before share their factory's globals
        monkeypatch.setitem(make.__globals__, "site", py)
    monkeypatch.setattr(regions, "_NativeRegion", None)
    monkeypatch.setattr(regions, "_RegionType", regions._Region)
    return "python"


@pytest.fixture(scope="module")
def prg(queue: Any) -> Any:
    return cltrace.compile(SOURCE, context=queue.context)


@pytest.fixture()
def buf(queue: Any) -> Any:
    return cl.Buffer(queue.context, cl.mem_flags.READ_WRITE, 4 * 1024)


def test_here_is_the_calling_line() -> None:
    site = callsite.here(); L = line()  # noqa: E702
    assert (site.file, site.line) == (HERE, L)
    assert site.function == "test_here_is_the_calling_line"


def test_direct_launches_copies_and_kernels(capture_path: str, queue: Any, prg: Any, buf: Any) -> None:
    pknl = cl.Kernel(prg.program, "inc")
    host = np.zeros(1024, np.float32)
    with cltrace.trace():
        cltrace.launch(pknl, queue, (1024,), None, buf); L1 = line()  # noqa: E702
        cltrace.copy(queue, host, buf); L2 = line()  # noqa: E702
        prg.inc[(1024,), None, queue](buf); L3 = line()  # noqa: E702
        prg.inc(queue, (1024,), None, buf); L4 = line()  # noqa: E702
        with cltrace.region("r", queue):
            prg.inc[(1024,), None, queue](buf); L5 = line()  # noqa: E702
    got = sorted((s.cat, where(s)) for s in RECORDER.spans() if s.cat != "region")
    assert got == sorted([("kernel", (HERE, L1)), ("transfer", (HERE, L2)), ("kernel", (HERE, L3)),
                          ("kernel", (HERE, L4)), ("kernel", (HERE, L5))])
    k = next(s for s in RECORDER.spans() if s.site.line == L3)
    assert k.site.function == "test_direct_launches_copies_and_kernels"


def test_regions_native_and_python(capture_path: str, queue: Any) -> None:
    @cltrace.region("decorated")
    def work() -> None:
        pass

    with cltrace.trace():
        with cltrace.region("host"):  # the site is the line that opens the region
            L1 = line()
            with cltrace.region("device", queue):
                L2 = line()
        work(); L3 = line()  # noqa: E702  a decorated function: where it is called
        with regions.category_region("trial", cat="trial"):
            L4 = line()
    sites = {s.name: where(s) for s in RECORDER.spans()}
    assert sites == {"host": (HERE, L1 - 1), "device": (HERE, L2 - 1), "decorated": (HERE, L3),
                     "trial": (HERE, L4 - 1)}
    if capture_path == "native" and regions._NativeRegion is None:
        pytest.fail("the C region is not active")


def test_instrumented_pyopencl_and_array_operations(capture_path: str, instrumented: None, queue: Any) -> None:
    import pyopencl.array as cla

    ctx = queue.context
    q = cl.CommandQueue(ctx)  # made while instrumented: profiling on
    a = cla.to_device(q, np.ones(1024, np.float32))
    b = cla.to_device(q, np.ones(1024, np.float32))
    prog = cl.Program(ctx, SOURCE).build()
    knl = prog.inc
    knl.set_args(a.data)
    out = np.empty(1024, np.float32)
    with cltrace.trace():
        c = a + b; L1 = line()  # noqa: E702  pyopencl.array: the site is this line, not pyopencl's
        cl.enqueue_nd_range_kernel(q, knl, (1024,), None); L2 = line()  # noqa: E702
        cl.enqueue_copy(q, out, c.data); L3 = line()  # noqa: E702
        host = c.get(); L4 = line()  # noqa: E702
        q.finish(); L5 = line()  # noqa: E702
    assert (host == 2).all()
    spans = by_name(RECORDER.spans())
    assert [where(s) for s in spans["axpbyz"]] == [(HERE, L1)]
    assert [where(s) for s in spans["inc"]] == [(HERE, L2)]
    assert [where(s) for s in spans["copy DtoH"]] == [(HERE, L3), (HERE, L4)]
    assert [where(s) for s in spans["finish"]] == [(HERE, L5)]


@pytest.fixture()
def wrapper_module(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A user library that launches for its callers: ``mylib_cs.run(kernel, queue, buf)``."""
    (tmp_path / "mylib_cs.py").write_text(
        "import cltrace\n"
        "from cltrace.record import callsite\n"
        "def run(kernel, queue, buf):\n"
        "    return cltrace.launch(kernel, queue, (1024,), None, buf)\n"
        "def wrapper():\n"
        "    return callsite.here()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import mylib_cs

    return mylib_cs


def test_library_modules_are_skipped(capture_path: str, wrapper_module: Any, queue: Any, prg: Any,
                                     buf: Any) -> None:
    pknl = cl.Kernel(prg.program, "inc")
    lib_file = os.path.abspath(wrapper_module.__file__)
    assert wrapper_module.wrapper().file == lib_file
    with cltrace.trace():
        wrapper_module.run(pknl, queue, buf)
        cltrace.configure(library_modules=["mylib_cs"])
        wrapper_module.run(pknl, queue, buf); L = line()  # noqa: E702
        site = wrapper_module.wrapper(); L2 = line()  # noqa: E702
    first, second = sorted(RECORDER.spans(), key=lambda s: s.id)
    assert where(first) == (lib_file, 4)
    assert where(second) == (HERE, L)
    assert (site.file, site.line) == (HERE, L2)
    assert callsite.settings() == {"library_modules": ["mylib_cs"], "stack_depth": 1}


def test_configure_errors_and_depth_zero(queue: Any, prg: Any, buf: Any, tmp_path: Any) -> None:
    with pytest.raises(ValueError, match="cannot import 'no_such_module_cs'"):
        cltrace.configure(library_modules=["no_such_module_cs"])
    with pytest.raises(ValueError, match="stack_depth must be an int from 0 to 64"):
        cltrace.configure(stack_depth=-1)
    assert callsite.settings() == {"library_modules": [], "stack_depth": 1}  # nothing changed
    cltrace.configure(stack_depth=0)
    out = str(tmp_path / "none.json")
    with cltrace.trace(out):
        prg.inc[(1024,), None, queue](buf)
        with cltrace.region("r"):
            pass
    assert [s.site for s in RECORDER.spans()] == [None, None]
    assert (RECORDER.batch().site == -1).all()
    assert "code.file.path" not in open(out).read()


def caller_of_launch(queue: Any, prg: Any, buf: Any) -> int:
    prg.inc[(1024,), None, queue](buf); L = line()  # noqa: E702
    return L


def test_stack_depth_records_callers_and_survives_files(capture_path: str, queue: Any, prg: Any, buf: Any,
                                                         tmp_path: Any) -> None:
    cltrace.configure(stack_depth=2)
    js, pf = str(tmp_path / "t.json"), str(tmp_path / "t.pftrace")
    with cltrace.trace(js, pf):
        inner = caller_of_launch(queue, prg, buf); outer = line()  # noqa: E702
    (span,) = RECORDER.spans()
    want = CallSite(HERE, inner, "caller_of_launch",
                    (CallSite(HERE, outer, "test_stack_depth_records_callers_and_survives_files"),))
    assert span.site == want
    for path in (js, pf):
        (back,), _ = load(path)
        assert back.site == want, path
        assert back.attrs is None or not any(k.startswith("code.") for k in back.attrs)


def test_sites_survive_json_and_pftrace(queue: Any, prg: Any, buf: Any, tmp_path: Any) -> None:
    js, pf = str(tmp_path / "t.json"), str(tmp_path / "t.pftrace")
    with cltrace.trace(js, pf):
        with cltrace.region("step", queue):
            for _ in range(3):
                prg.inc[(1024,), None, queue](buf); L = line()  # noqa: E702
        cltrace.copy(queue, np.zeros(1024, np.float32), buf); L2 = line()  # noqa: E702
    mem = {s.id: s.site for s in RECORDER.spans()}
    assert {s.line for s in mem.values()} == {L - 2, L, L2}
    for path in (js, pf):
        spans, _ = load(path)
        assert {s.id: s.site for s in spans} == mem, path
    events = json.load(open(js))
    k = next(e for e in events if e.get("ph") == "X" and e.get("name") == "inc")
    assert (k["args"]["code.file.path"], k["args"]["code.line.number"], k["args"]["code.function.name"]) == (
        HERE, L, "test_sites_survive_json_and_pftrace")


def test_pftrace_interns_source_locations(queue: Any, prg: Any, buf: Any, tmp_path: Any) -> None:
    """Read with the perfetto package's own protos: each host slice's source_location_iid names an
    interned SourceLocation on its sequence, written once per sequence."""
    from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

    pf = str(tmp_path / "t.pftrace")
    with cltrace.trace(pf):
        for _ in range(4):
            prg.inc[(1024,), None, queue](buf); L = line()  # noqa: E702
    import zlib

    trace = pb.Trace.FromString(open(pf, "rb").read())
    packets = []  # compressed packets expanded as trace processor expands them
    for p in trace.packet:
        packets.extend(pb.Trace.FromString(zlib.decompress(p.compressed_packets)).packet if p.compressed_packets else [p])
    interned: dict[tuple[int, int], Any] = {}
    used = []
    for p in packets:
        seq = p.trusted_packet_sequence_id
        for loc in p.interned_data.source_locations:
            assert (seq, loc.iid) not in interned
            interned[seq, loc.iid] = loc
        if p.HasField("track_event") and p.track_event.HasField("source_location_iid"):
            used.append(interned[seq, p.track_event.source_location_iid])
    assert len(used) == 4 and len(interned) == 1
    assert {(u.file_name, u.line_number, u.function_name) for u in used} == {
        (HERE, L, "test_pftrace_interns_source_locations")}


def test_otlp_attributes(queue: Any, prg: Any, buf: Any) -> None:
    from otlp_collector import RotelCollector

    from cltrace.export.otlp import OtlpSink

    with RotelCollector() as col:
        sink = OtlpSink(col.http_endpoint, protocol="http/protobuf")
        with cltrace.trace(sink):
            with cltrace.region("outer"):
                L1 = line()
                prg.inc[(1024,), None, queue](buf); L2 = line()  # noqa: E702
        got = col.wait_for(lambda spans: len([s for s in spans if s["trace_id"] == sink.trace_id]) >= 3)
    attrs = {s["name"]: s["attributes"] for s in got if s["trace_id"] == sink.trace_id}
    fn = "test_otlp_attributes"
    for name, ln in (("outer", L1 - 1), ("inc", L2)):
        a = attrs[name]
        assert (a["code.file.path"], a["code.line.number"], a["code.function.name"]) == (HERE, ln, fn)
    assert "code.file.path" not in attrs["cltrace.run"]


def launch_twice(queue: Any, prg: Any, buf: Any) -> None:
    prg.inc[(1024,), None, queue](buf)
    prg.inc[(1024,), None, queue](buf)


def test_analyze_by_callsite(queue: Any, prg: Any, buf: Any, tmp_path: Any) -> None:
    pf = str(tmp_path / "t.pftrace")
    with cltrace.trace(pf):
        for _ in range(3):
            launch_twice(queue, prg, buf)
        prg.inc[(1024,), None, queue](buf); L = line()  # noqa: E702
    first = launch_twice.__code__.co_firstlineno
    rows = cltrace.analyze(pf, by="callsite").kernels
    got = sorted((r["name"], r["site"], r["count"]) for r in rows)
    assert got == sorted([("inc", f"{HERE}:{first + 1} (launch_twice)", 3),
                          ("inc", f"{HERE}:{first + 2} (launch_twice)", 3),
                          ("inc", f"{HERE}:{L} (test_analyze_by_callsite)", 1)])
    assert [r["count"] for r in cltrace.analyze(pf).kernels] == [7]  # by name: one row
    with pytest.raises(ValueError, match="by must be one of name, shape, callsite"):
        cltrace.analyze(pf, by="line")
    p = subprocess.run([sys.executable, "-m", "cltrace", "analyze", pf, "--by", "callsite", "--top", "0"],
                       capture_output=True, text=True, cwd=os.path.dirname(HERE), timeout=240)
    assert p.returncode == 0, p.stderr
    table = p.stdout[p.stdout.index("Kernels by"):]
    assert "call site" in table
    name = os.path.basename(HERE)
    for ln, fn in ((first + 1, "launch_twice"), (first + 2, "launch_twice"), (L, "test_analyze_by_callsite")):
        assert f"{name}:{ln} ({fn})" in table
    bad = subprocess.run([sys.executable, "-m", "cltrace", "analyze", pf, "--by", "line"],
                         capture_output=True, text=True, timeout=240)
    assert bad.returncode == 2 and "invalid choice: 'line'" in bad.stderr


def test_python_capture_shares_one_tuple_per_line() -> None:
    """The Python capture hands out one tuple per (code, offset), as the C one does: the resolver then looks
    each distinct object up once; another line gets another tuple, and each describes its own line."""
    def two() -> tuple[Any, Any]:
        return callsite._py_capture(), callsite._py_capture()

    two()  # the first capture classifies ``two``'s code object (the shared path's condition)
    seen = [two() for _ in range(3)]
    assert all(a is seen[0][0] for a, _ in seen) and all(b is seen[0][1] for _, b in seen)
    a, b = seen[0]
    assert a is not b and a[0] is b[0] and a[1] != b[1]  # one line, two offsets
    sa, sb = callsite.describe(a), callsite.describe(b)
    assert sa.file == HERE and sa.function.endswith(".two") and sa.line == sb.line
