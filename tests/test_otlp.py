"""OTLP export against a real collector (rotel) and real OpenCL (PoCL).

The collector prints every span it receives (``--debug-log traces``); the tests
parse that text and compare each span with what the recorder resolved.
"""
from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
import threading
import time
from typing import Any

import numpy as np
import pytest

import cltrace
from cltrace.export.otlp import (
    GRPC,
    HTTP,
    Mapper,
    OtlpSink,
    WireEncoder,
    base_resource,
    otlp_sink_from_env,
    readable_span,
    resolve_protocol,
    resource_attributes,
)
from cltrace.record.recorder import RECORDER
from cltrace.timeline.spans import BUILD, COMPILE, KERNEL, REGION, Span
from cltrace.read import load as load_trace
from otlp_collector import RotelCollector, free_port

PROTOCOLS = ["grpc", "http/protobuf"]
BUILD_SOURCE = "__kernel void twice(__global float *a) { a[get_global_id(0)] *= 2.0f; }"


@pytest.fixture(scope="module")
def collector() -> Any:
    with RotelCollector() as col:
        yield col


def endpoint_for(col: RotelCollector, protocol: str) -> str:
    return col.grpc_endpoint if protocol == GRPC else col.http_endpoint


def of_trace(spans: list[dict[str, Any]], trace_id: int) -> list[dict[str, Any]]:
    return [s for s in spans if s["trace_id"] == trace_id]


def wait_trace(col: RotelCollector, trace_id: int, n: int) -> dict[int, dict[str, Any]]:
    got = col.wait_for(lambda spans: len(of_trace(spans, trace_id)) >= n)
    mine = of_trace(got, trace_id)
    assert len(mine) == n, f"expected {n} spans in the trace, the collector got {len(mine)}"
    by_id = {s["span_id"]: s for s in mine}
    assert len(by_id) == n, "span ids must be unique within the trace"
    return by_id


def traced_workload(kernels: Any, queue: Any, cache_dir: str) -> None:
    """Nested regions on a profiling queue, kernels, a host-only region, a build (ok and
    failed) and a failing region."""
    with cltrace.region("train", queue):
        for step in range(2):
            with cltrace.region("step", queue, {"step": step}):
                kernels.launch_add(queue)
                kernels.launch_spin(queue, 50)
        with cltrace.region("host side"):
            kernels.launch_add(queue)
        cache = cltrace.ProgramCache(cache_dir)
        cltrace.compile(BUILD_SOURCE, context=queue.context, cache=cache)
        with pytest.raises(cltrace.BuildError):
            cltrace.compile("__kernel void broken(__global float *a) { a[0] = ; }",
                            context=queue.context, cache=cache)
        with pytest.raises(ValueError, match="bad input 42"):
            with cltrace.region("failing", queue):
                kernels.launch_add(queue)
                raise ValueError("bad input 42")


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_workload_arrives_with_tree_times_and_attributes(protocol: str, collector: RotelCollector,
                                                         kernels: Any, queue: Any, tmp_path: Any) -> None:
    # A small request limit on HTTP makes the sink split batches into several requests.
    limit = 4096 if protocol == HTTP else None
    sink = OtlpSink(endpoint_for(collector, protocol), protocol=protocol, service_name="cltrace-test",
                    close_timeout_s=60,  # every span delivered, however slow the host: close() returns when done
                    **({"max_request_bytes": limit} if limit else {}))
    with cltrace.trace(sink):
        traced_workload(kernels, queue, str(tmp_path))
    sent = RECORDER.spans()
    st = sink.stats()
    assert st["delivered"] == len(sent) + 1 == st["received"]
    assert st["failed"] == st["dropped"] == 0
    if limit:
        assert st["exports"] > 2

    got = wait_trace(collector, sink.trace_id, len(sent) + 1)
    off = RECORDER.start_unix_ns - RECORDER.start_ns
    root = got[sink.span_id(0)]
    assert root["name"] == "cltrace.run" and root["parent_id"] is None
    res = root["resource"]
    assert res["service.name"] == "cltrace-test"
    assert res["cltrace.host.unix_offset_ns"] == off
    assert res["process.pid"] == os.getpid()
    # the devices the run used are on its root span, not in the resource (repeated on every stored span)
    assert not any(k.startswith("cltrace.opencl.") for k in res)
    assert queue.device.name.strip() in root["attributes"]["cltrace.opencl.device.names"]
    assert queue.device.driver_version.strip() in root["attributes"]["cltrace.opencl.driver.versions"]
    assert abs(root["start"] - time.time_ns()) < 600e9  # Unix epoch, not perf_counter
    assert root["attributes"]["cltrace.spans.recorded"] == len(sent)
    assert root["attributes"]["cltrace.clock.bound_ns"][0] > 0

    by_name: dict[str, list[Span]] = {}
    for s in sent:
        by_name.setdefault(s.name, []).append(s)
        o = got[sink.span_id(s.id)]
        a = o["attributes"]
        assert o["name"] == s.name
        assert o["parent_id"] == sink.span_id(s.parent)
        assert o["kind"] == "SPAN_KIND_INTERNAL"
        assert o["start"] == s.host_begin + off
        end = max(s.host_end, s.dev_end) if s.dev_end is not None else s.host_end
        assert o["end"] == end + off
        assert root["start"] <= o["start"] and o["end"] <= root["end"]
        assert a["cltrace.category"] == s.cat
        assert a["cltrace.host.duration_ns"] == s.host_ns
        assert a["cltrace.path"] == "/".join(s.path)
        if s.dev_start is not None:
            assert a["cltrace.time.source"] == "device"
            assert a["cltrace.device.duration_ns"] == s.device_ns == s.raw_end - s.raw_start
            assert a["cltrace.device.name"] == queue.device.name.strip()
            assert a["cltrace.device.platform"] == queue.device.platform.name.strip()
            assert a["cltrace.queue"] == RECORDER.tracks.get(s.device_track).name
            assert [(e["name"], e["time"]) for e in o["events"]] == [
                ("QUEUED", s.dev_queued + off), ("SUBMIT", s.dev_submit + off),
                ("START", s.dev_start + off), ("END", s.dev_end + off)]
        else:
            assert a["cltrace.time.source"] == "host" and o["events"] == []
        if s.status == "error":
            assert o["status_code"] == "STATUS_CODE_ERROR"
            assert o["status_message"] == s.error
        else:
            assert o["status_code"] == "STATUS_CODE_UNSET"

    # Kernels: every launch of the workload, with their launch attributes.
    kern = [s for s in sent if s.cat == KERNEL]
    assert len(kern) == 6 and all(s.dev_start is not None for s in kern)
    for s in kern:
        a = got[sink.span_id(s.id)]["attributes"]
        assert a["cltrace.kernel.name"] == s.name
        assert a["cltrace.kernel.global_size"] == [kernels.n]
        assert "cltrace.kernel.local_size" not in a  # None is left out
    # The tree: train > step > kernels; the host-only region holds a device kernel.
    train = by_name["train"][0]
    assert train.parent == 0 and got[sink.span_id(train.id)]["parent_id"] == sink.span_id(0)
    steps = by_name["step"]
    assert [got[sink.span_id(s.id)]["attributes"]["cltrace.step"] for s in steps] == [0, 1]
    assert all(s.parent == train.id for s in steps)
    host_side = by_name["host side"][0]
    assert host_side.dev_start is None
    assert [s.name for s in sent if s.parent == host_side.id] == ["add"]
    # Failed region: error status with the exception.
    failing = got[sink.span_id(by_name["failing"][0].id)]
    assert failing["status_code"] == "STATUS_CODE_ERROR"
    assert failing["status_message"] == "ValueError: bad input 42"
    # Compile spans sit under the region that compiled; their steps under them.
    compiles = [s for s in sent if s.cat == COMPILE and s.parent == train.id]
    assert len(compiles) == 2
    ok, bad = sorted(compiles, key=lambda s: s.status != "ok")
    assert got[sink.span_id(ok.id)]["attributes"]["cltrace.source_hash"]
    assert got[sink.span_id(ok.id)]["attributes"]["cltrace.cache"] in ("miss", "disk", "memory")
    bad_otel = got[sink.span_id(bad.id)]
    assert bad_otel["status_code"] == "STATUS_CODE_ERROR" and "BuildError" in bad_otel["status_message"]
    assert bad_otel["attributes"]["cltrace.build_log"]
    failed_build = [s for s in sent if s.cat == BUILD and s.parent == bad.id]
    assert failed_build and got[sink.span_id(failed_build[0].id)]["status_code"] == "STATUS_CODE_ERROR"
    assert got[sink.span_id(ok.id)]["attributes"]["cltrace.thread"] == "OpenCL compile"


def synthetic_spans(queue: Any) -> list[Span]:
    """Resolved spans of every shape the mapping handles, with awkward attribute values."""
    ident = threading.get_ident()
    host = RECORDER.tracks.host_thread(ident)
    dev = RECORDER.tracks.device_queue(queue, ident)
    comp = RECORDER.tracks.compile_track()
    t = time.perf_counter_ns()
    odd = {"none": None, "np": np.int64(7), "npf": np.float32(0.5), "big": 1 << 70, "mixed": (1, "a"),
           "dict": {"k": 1}, "flag": True, "ratio": 0.25, "empty": (), "text": "naïve · ☃",
           "floats": [1.0, 2.5], "path": "/tmp/x.bin", "cltrace.device_time": "unavailable: test"}
    return [
        Span(501, 500, "k", KERNEL, host, t, t + 900, dev, t + 10, t + 20, t + 400, t + 5000,
             77_000, 81_600, {"global_size": (64, 2), "local_size": (8, 1)}, path=("r", "k")),
        Span(500, 0, "r", REGION, host, t - 50, t + 1000, dev, t - 40, t - 30, t - 20, t + 5100,
             1, 2, {"step": 3}, path=("r",)),
        Span(502, 500, "host only", REGION, host, t + 5, t + 6, attrs=odd, status="error",
             error="RuntimeError: boom", path=("r", "host only")),
        Span(503, 500, "compile prog", COMPILE, comp, t + 7, t + 8,
             attrs={"cache": "miss", "binary_size": 1234, "build_log": "line 1\nline 2"},
             path=("r", "compile prog")),
    ]


def test_direct_encoding_equals_sdk_encoder(queue: Any) -> None:
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope

    spans = synthetic_spans(queue)
    for remote in (False, True):
        mapper = Mapper(RECORDER, 0xABCDEF, 0x1234, root_parent=0x99 if remote else None,
                        root_parent_remote=remote)
        enc = WireEncoder(mapper, "cltrace", "1.2.3")
        attrs = resource_attributes(RECORDER, base_resource("svc"))
        root = mapper.root(spans[1].host_begin, spans[1].host_end, RECORDER.metadata(),
                           {"dropped": 1, "failed": 2})
        payload = enc.request(enc.resource(attrs),
                              [enc.encode(s) for s in spans] + [enc.encode_record(root, remote)])
        resource, scope = Resource(attrs), InstrumentationScope("cltrace", "1.2.3")
        readable = [readable_span(mapper.convert(s), 0xABCDEF, resource, scope) for s in spans]
        readable.append(readable_span(root, 0xABCDEF, resource, scope, remote))
        expected = encode_spans(readable)
        assert ExportTraceServiceRequest.FromString(payload) == expected
        assert payload == expected.SerializeToString()
    conv = mapper.convert(spans[2])[5]
    assert conv["cltrace.np"] == 7 and conv["cltrace.npf"] == 0.5 and conv["cltrace.flag"] is True
    assert conv["cltrace.big"] == str(1 << 70) and conv["cltrace.mixed"] == "(1, 'a')"
    assert conv["cltrace.dict"] == "{'k': 1}" and "cltrace.none" not in conv
    assert conv["cltrace.attr.path"] == "/tmp/x.bin" and conv["cltrace.path"] == "r/host only"
    assert conv["cltrace.device_time"] == "unavailable: test"


def test_user_exporter_and_tracer_provider_get_readable_spans(queue: Any, kernels: Any) -> None:
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.trace import StatusCode

    mem = InMemorySpanExporter()
    sink = OtlpSink(exporter=mem)
    with cltrace.trace(sink):
        with cltrace.region("outer", queue):
            kernels.launch_add(queue)
    got = mem.get_finished_spans()
    sent = RECORDER.spans()
    assert len(got) == len(sent) + 1 and all(isinstance(s, ReadableSpan) for s in got)
    by_id = {s.context.span_id: s for s in got}
    for s in sent:
        o = by_id[sink.span_id(s.id)]
        assert o.parent.span_id == sink.span_id(s.parent)
        assert o.context.trace_id == sink.trace_id
        assert o.status.status_code == StatusCode.UNSET
        assert [e.name for e in o.events] == ["QUEUED", "SUBMIT", "START", "END"]
    assert by_id[sink.span_id(0)].parent is None

    # Inside the service's own span, the run joins its trace as a child of that span.
    mem2 = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(mem2))
    tracer = provider.get_tracer("service")
    RECORDER.clear()
    with tracer.start_as_current_span("request") as svc:
        sink2 = OtlpSink(tracer_provider=provider)
        with cltrace.trace(sink2):
            with cltrace.region("work"):
                pass
    spans = {s.name: s for s in mem2.get_finished_spans()}
    assert set(spans) == {"request", "cltrace.run", "work"}
    run = spans["cltrace.run"]
    assert run.context.trace_id == svc.get_span_context().trace_id
    assert run.parent.span_id == svc.get_span_context().span_id
    assert spans["work"].parent.span_id == run.context.span_id
    assert run.resource.attributes["service.name"] == provider.resource.attributes["service.name"]
    assert "cltrace.host.unix_offset_ns" in run.resource.attributes


def test_env_configuration(collector: RotelCollector, monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                "OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"):
        monkeypatch.delenv(var, raising=False)
    assert otlp_sink_from_env() is None
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{collector.http_port}")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "from-env")
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=ci,team=gpu")
    sink = otlp_sink_from_env()
    assert sink is not None and sink.protocol == HTTP
    assert sink.endpoint == collector.http_endpoint
    with cltrace.trace(sink):
        with cltrace.region("env"):
            pass
    got = wait_trace(collector, sink.trace_id, 2)
    res = got[sink.span_id(0)]["resource"]
    assert res["service.name"] == "from-env"
    assert res["deployment.environment"] == "ci" and res["team"] == "gpu"
    assert resolve_protocol(None, None) == HTTP
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_PROTOCOL")
    assert resolve_protocol(None, "collector:4318") == HTTP
    assert resolve_protocol(None, "collector:4317") == GRPC
    assert resolve_protocol(None, "https://x.example/v1/traces") == HTTP
    assert resolve_protocol("http", "collector:4317") == HTTP


def test_bad_arguments_get_clear_errors() -> None:
    with pytest.raises(ValueError, match="'grpc' or 'http/protobuf'"):
        OtlpSink("localhost:4317", protocol="http/json")
    with pytest.raises(ValueError, match="timeout_s"):
        OtlpSink("localhost:4317", timeout_s=0)
    with pytest.raises(ValueError, match="key=value"):
        OtlpSink("localhost:4317", headers="no-equals-sign")
    with pytest.raises(TypeError, match="SpanExporter"):
        OtlpSink(exporter=object())
    with pytest.raises(ValueError, match="not both"):
        OtlpSink(exporter=object(), tracer_provider=object())


def run_and_time_stop(sink: OtlpSink, body: Any) -> float:
    cltrace.start(sink)
    body()
    t0 = time.monotonic()
    cltrace.stop()
    return time.monotonic() - t0


@pytest.mark.timing
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_collector_absent_returns_promptly_and_counts(protocol: str, caplog: pytest.LogCaptureFixture) -> None:
    port = free_port()  # nothing listens there
    ep = f"127.0.0.1:{port}" if protocol == GRPC else f"http://127.0.0.1:{port}/v1/traces"
    sink = OtlpSink(ep, protocol=protocol, timeout_s=0.5, close_timeout_s=1.5)

    def body() -> None:
        for i in range(20):
            with cltrace.region(f"r{i}"):
                cltrace.record_launch("host work", None, None, time.perf_counter_ns(), time.perf_counter_ns())

    with caplog.at_level(logging.WARNING, logger="cltrace"):
        took = run_and_time_stop(sink, body)
    st = sink.stats()
    assert took < sink.close_timeout_s + 2.0
    assert st["received"] == 41 and st["delivered"] == 0
    assert st["failed"] + st["dropped"] == 41 and st["failed"] > 0
    assert st["last_error"]
    lines = [r.getMessage() for r in caplog.records if r.name == "cltrace"]
    summary = [m for m in lines if "41 of 41 spans not delivered" in m]
    assert len(summary) == 1 and "\n" not in summary[0]
    assert not [r for r in caplog.records if r.name.startswith("opentelemetry.exporter")]


@pytest.mark.timing
def test_collector_killed_mid_run(kernels: Any, queue: Any) -> None:
    with RotelCollector() as col:
        sink = OtlpSink(col.grpc_endpoint, protocol="grpc", timeout_s=0.5, close_timeout_s=1.5)
        cltrace.start(sink)
        with cltrace.region("before", queue):
            kernels.launch_add(queue)
        RECORDER.flush()
        assert sink.force_flush(10)
        assert sink.delivered == 2
        wait_trace(col, sink.trace_id, 2)
        col.kill()
        with cltrace.region("after", queue):
            kernels.launch_add(queue)
        t0 = time.monotonic()
        cltrace.stop()
        took = time.monotonic() - t0
    st = sink.stats()
    assert took < sink.close_timeout_s + 2.0
    assert st["received"] == 5 and st["delivered"] == 2
    assert st["failed"] + st["dropped"] == 3


@pytest.mark.timing
def test_full_queue_drops_and_counts(queue: Any) -> None:
    sink = OtlpSink(f"127.0.0.1:{free_port()}", protocol="grpc", timeout_s=1.0, close_timeout_s=0.3,
                    max_queue_spans=5, senders=1)
    sink.start(RECORDER)
    spans = synthetic_spans(queue)
    for _ in range(3):
        sink.write(spans)  # 12 spans into room for 5 (plus whatever the worker took)
    assert sink.dropped >= 3
    t0 = time.monotonic()
    sink.close(RECORDER.metadata())
    assert time.monotonic() - t0 < 0.3 + 4  # close_timeout_s and one export's join (at most 1 s), on a slow host
    sink.write(spans)  # after close: counted, never raised
    st = sink.stats()
    assert st["received"] == 17 and st["delivered"] == 0
    assert st["failed"] + st["dropped"] + st["in_flight"] == 17


def run_script(body: str, env: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess, float]:
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(body)], capture_output=True, text=True,
                       timeout=60, env=env)
    return p, time.monotonic() - t0


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without OTEL_* and CLTRACE* variables, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "CLTRACE"))}
    env.update(extra)
    return env


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_spans_still_in_flight_at_exit_are_delivered(protocol: str, collector: RotelCollector) -> None:
    # No stop(): the recorder's atexit hook flushes and closes the sink while the
    # interpreter shuts down, when thread pools no longer take work.
    p, _ = run_script(f"""
        import cltrace
        from cltrace.export.otlp import OtlpSink
        sink = OtlpSink({endpoint_for(collector, protocol)!r}, protocol={protocol!r})
        cltrace.start(sink)
        print(sink.trace_id)
        for i in range(10):
            with cltrace.region("at exit %d" % i):
                pass
    """)
    assert p.returncode == 0, p.stderr
    assert "cltrace" not in p.stderr, p.stderr
    got = wait_trace(collector, int(p.stdout), 11)
    assert sorted(s["name"] for s in got.values()) == ["at exit %d" % i for i in range(10)] + ["cltrace.run"]


@pytest.mark.timing
def test_undelivered_spans_reported_at_exit() -> None:
    p, took = run_script(f"""
        import cltrace
        from cltrace.export.otlp import OtlpSink
        cltrace.start(OtlpSink("127.0.0.1:{free_port()}", protocol="grpc", timeout_s=0.5, close_timeout_s=1))
        for i in range(10):
            with cltrace.region("r%d" % i):
                pass
    """)
    assert p.returncode == 0, p.stderr
    report = [ln for ln in p.stderr.splitlines() if "spans not delivered" in ln]
    assert report == [report[0]] and "11 of 11 spans not delivered" in report[0], p.stderr
    assert "connection refused: is a collector listening at 127.0.0.1:" in report[0], p.stderr
    others = [ln for ln in p.stderr.splitlines() if ln.strip() and ln not in report]
    # An export attempted before exit may warn once, while the run goes on; nothing else is printed.
    assert all("is failing" in ln and "losses are reported at exit" in ln for ln in others) and len(others) <= 1, p.stderr
    assert len(report[0]) < 160, p.stderr
    assert took < 30


def test_opentelemetry_is_loaded_only_when_otlpsink_is_used(tmp_path: Any) -> None:
    p, _ = run_script("""
        import sys
        import cltrace
        assert cltrace.enabled()
        assert not [m for m in sys.modules if m.startswith("opentelemetry")], "loaded at import"
        sink_class = cltrace.OtlpSink
        assert "opentelemetry.sdk.trace" in sys.modules
        from cltrace.export.otlp import OtlpSink
        assert sink_class is OtlpSink
        try:
            cltrace.NoSuchName
        except AttributeError as exc:
            print(exc)
    """, env=clean_env(CLTRACE="1", CLTRACE_OUT=str(tmp_path / "t.json")))  # not the default in the cwd
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "module 'cltrace' has no attribute 'NoSuchName'"


@pytest.mark.parametrize("var, protocol", [("OTEL_EXPORTER_OTLP_ENDPOINT", GRPC),
                                           ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", HTTP)])
def test_cltrace_env_also_sends_to_the_otel_endpoint(var: str, protocol: str, collector: RotelCollector,
                                                     tmp_path: Any) -> None:
    # The protocol comes from the endpoint's look: no OTEL_EXPORTER_OTLP_PROTOCOL here.
    url = f"http://127.0.0.1:{collector.grpc_port}" if protocol == GRPC else collector.http_endpoint
    service = f"env-start-{protocol}"
    out = tmp_path / "run.json"
    p, _ = run_script("""
        import cltrace
        with cltrace.region("from env"):
            pass
    """, env=clean_env(CLTRACE="1", CLTRACE_OUT=str(out), OTEL_SERVICE_NAME=service, **{var: url}))
    assert p.returncode == 0, p.stderr
    assert "cltrace" not in p.stderr, p.stderr

    def of_service(spans: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [s for s in spans if s["resource"].get("service.name") == service]

    got = of_service(collector.wait_for(lambda spans: len(of_service(spans)) >= 2))
    assert sorted(s["name"] for s in got) == ["cltrace.run", "from env"]
    root, region = sorted(got, key=lambda s: s["name"])
    assert region["trace_id"] == root["trace_id"] and region["parent_id"] == root["span_id"]
    spans, _ = load_trace(out)
    assert [s.name for s in spans] == ["from env"]


RUN_SCRIPT = '''
import pyopencl as cl

ctx = cl.create_some_context(interactive=False)
q = cl.CommandQueue(ctx)
knl = cl.Kernel(cl.Program(ctx, "%s").build(), "twice")
for _ in range(2):
    knl(q, (256,), None, cl.Buffer(ctx, cl.mem_flags.READ_WRITE, 1024))
q.finish()
''' % BUILD_SOURCE


def _cltrace_run(tmp_path: Any, env: dict[str, str]) -> subprocess.CompletedProcess:
    (tmp_path / "prog.py").write_text(RUN_SCRIPT)
    return subprocess.run([sys.executable, "-m", "cltrace", "run", "--format", "json", "prog.py"], cwd=str(tmp_path),
                          env=env, capture_output=True, text=True, timeout=180)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_cltrace_run_sends_to_the_otel_endpoint_of_the_environment(protocol: str, collector: RotelCollector,
                                                                   tmp_path: Any) -> None:
    # The generic endpoint (a base URL: /v1/traces is added for http/protobuf) and the protocol variable.
    port = collector.grpc_port if protocol == GRPC else collector.http_port
    service = f"run-env-{protocol}"
    p = _cltrace_run(tmp_path, clean_env(OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{port}",
                                         OTEL_EXPORTER_OTLP_PROTOCOL=protocol, OTEL_SERVICE_NAME=service))
    assert p.returncode == 0, p.stderr
    assert p.stderr.strip().splitlines()[-1] == "cltrace: wrote traces/prog.json", p.stderr

    def mine(spans: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [s for s in spans if s["resource"].get("service.name") == service]

    spans, _ = load_trace(str(tmp_path / "traces" / "prog.json"))
    got = mine(collector.wait_for(lambda all_: len(mine(all_)) >= len(spans) + 1))
    assert sorted(s["name"] for s in got) == sorted([s.name for s in spans] + ["cltrace.run"])
    assert [s["name"] for s in got].count("twice") == 2


def test_cltrace_run_sends_the_headers_of_the_environment(tmp_path: Any) -> None:
    import http.server

    seen: list[dict[str, str]] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            seen.append({k.lower(): v for k, v in self.headers.items()})
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        p = _cltrace_run(tmp_path, clean_env(
            OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=f"http://127.0.0.1:{server.server_port}/v1/traces",
            OTEL_EXPORTER_OTLP_TRACES_PROTOCOL="http/protobuf",
            OTEL_EXPORTER_OTLP_HEADERS="x-team=gpu,authorization=Bearer%20t0ken"))
    finally:
        server.shutdown()
        server.server_close()
    assert p.returncode == 0, p.stderr
    assert seen and all(h.get("x-team") == "gpu" and h.get("authorization") == "Bearer t0ken" for h in seen), seen


def test_cltrace_run_stops_on_an_otel_setting_it_cannot_use(tmp_path: Any) -> None:
    p = _cltrace_run(tmp_path, clean_env(OTEL_EXPORTER_OTLP_ENDPOINT="127.0.0.1:4317",
                                         OTEL_EXPORTER_OTLP_PROTOCOL="http/json"))
    assert p.returncode == 2 and not (tmp_path / "traces").exists()
    assert p.stderr == ("cltrace: error: OTEL_EXPORTER_OTLP_PROTOCOL='http/json' is not a supported protocol: "
                        "set it to grpc or http/protobuf\n"), p.stderr
