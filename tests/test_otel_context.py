"""OpenTelemetry context, both ways, against a real collector (rotel) fed by cltrace's OTLP sink and
by the OpenTelemetry SDK's own OTLP exporter, on real OpenCL (PoCL).

A region opened under an SDK span is that span's child (same trace, its kernels and nested
regions with it); an SDK span started inside a region is the region's child; with no OTLP sink
attached regions leave the OpenTelemetry context alone. Every test runs on both region paths.
"""
from __future__ import annotations

import os
import threading
from typing import Any, Iterator

import pytest
from opentelemetry import trace as otel_trace
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

import cltrace
from cltrace.export.otlp import Mapper, OtlpSink, WireEncoder, base_resource, readable_span, resource_attributes
from cltrace.record import otel_context, regions
from cltrace.record.recorder import RECORDER
from cltrace.timeline.spans import KERNEL, REGION, SYNC
from otlp_collector import RotelCollector
from test_otlp import synthetic_spans

DISABLED = os.environ.get("CLTRACE_NATIVE", "").strip() == "0"


@pytest.fixture(scope="module")
def collector() -> Iterator[RotelCollector]:
    with RotelCollector() as col:
        yield col


@pytest.fixture(params=["native", "python"])
def region_path(request: Any, monkeypatch: pytest.MonkeyPatch) -> str:
    """The region type ``timing_region`` hands out while no OTLP sink is attached, as import would choose."""
    if request.param == "native":
        if DISABLED:
            pytest.skip("CLTRACE_NATIVE=0: fallback-only run")
        assert regions._CHOICE.native is not None, f"the C region is not active ({regions.REGION_WHY})"
        kind = regions._CHOICE.native
        monkeypatch.setattr(regions, "_NativeRegion", kind)
        monkeypatch.setattr(regions, "_RegionType", kind)
    else:
        monkeypatch.setattr(regions, "_NativeRegion", None)
        monkeypatch.setattr(regions, "_RegionType", regions._Region)
    return request.param


def sdk_tracer(exporter: Any) -> tuple[TracerProvider, Any]:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, provider.get_tracer("inference-server")


def handle(tracer: Any, kernels: Any, queue: Any, request_id: int) -> tuple[int, int]:
    """One request of an inference server: the server's span, cltrace's region and kernels inside,
    and an SDK span for post-processing inside the region. Returns (trace id, request span id)."""
    with tracer.start_as_current_span("request", kind=SpanKind.SERVER) as req:
        with cltrace.region("infer", queue, {"request": request_id}):
            k = kernels.kernel("add")
            kernels.launch_add(queue, k)
            kernels.launch_add(queue, k)
            with tracer.start_as_current_span("postprocess"):
                with cltrace.region("decode"):
                    kernels.launch_add(queue, k)
        queue.finish()
        ctx = req.get_span_context()
        return ctx.trace_id, ctx.span_id


def test_inference_server_requests_hold_their_regions_and_kernels(region_path: str, collector: RotelCollector,
                                                                   kernels: Any, queue: Any) -> None:
    provider, tracer = sdk_tracer(OTLPSpanExporter(endpoint=collector.grpc_endpoint, insecure=True))
    sink = OtlpSink(collector.grpc_endpoint, protocol="grpc", service_name="otel-context-test")
    results: dict[int, tuple[int, int]] = {}

    def worker(ids: range) -> None:
        for i in ids:
            results[i] = handle(tracer, kernels, queue, i)

    with cltrace.trace(sink):
        threads = [threading.Thread(target=worker, args=(range(t, 6, 3),)) for t in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    provider.shutdown()
    assert len({tid for tid, _ in results.values()}) == 6, "each request is its own trace"
    traces = {tid for tid, _ in results.values()}
    # per request: request + postprocess (SDK), infer + decode (regions), 3 kernels
    got = collector.wait_for(lambda spans: sum(s["trace_id"] in traces for s in spans) >= 6 * 7)
    for i, (tid, req_id) in results.items():
        mine = [s for s in got if s["trace_id"] == tid]
        by_name: dict[str, list[dict[str, Any]]] = {}
        for s in mine:
            by_name.setdefault(s["name"], []).append(s)
        assert sorted(by_name) == ["add", "decode", "infer", "postprocess", "request"], sorted(by_name)
        (req,), (infer,), (post,), (decode,) = (by_name[n] for n in ("request", "infer", "postprocess", "decode"))
        assert req["span_id"] == req_id and req["resource"]["service.name"] != "otel-context-test"
        assert infer["parent_id"] == req_id and infer["attributes"]["cltrace.request"] == i
        assert infer["resource"]["service.name"] == "otel-context-test"
        assert post["parent_id"] == infer["span_id"], "an SDK span inside a region is the region's child"
        assert decode["parent_id"] == post["span_id"], "a region inside that SDK span is its child"
        adds = by_name["add"]
        assert sorted(a["parent_id"] for a in adds) == sorted([infer["span_id"]] * 2 + [decode["span_id"]])
        assert all(a["attributes"]["cltrace.category"] == KERNEL for a in adds)
        assert infer["attributes"]["cltrace.category"] == REGION
    # The run itself stays one trace of its own, with only its root: every region had a request around it.
    assert [s["name"] for s in got if s["trace_id"] == sink.trace_id
            and s["attributes"].get("cltrace.category") != SYNC] == ["cltrace.run"]  # and the threads' finish
    assert type(cltrace.region("after")) is type(regions.NOOP)  # tracing off again
    assert regions._RegionType is (regions._Region if region_path == "python" else regions._CHOICE.native)


def test_sdk_span_inside_a_region_is_its_child(region_path: str, collector: RotelCollector, kernels: Any,
                                               queue: Any) -> None:
    provider, tracer = sdk_tracer(OTLPSpanExporter(endpoint=collector.grpc_endpoint, insecure=True))
    sink = OtlpSink(collector.grpc_endpoint, protocol="grpc")
    with cltrace.trace(sink):
        with cltrace.region("train", queue):
            with cltrace.region("step", queue) as step:
                kernels.launch_add(queue)
                with tracer.start_as_current_span("data-loader") as loader:
                    inside = otel_trace.get_current_span().get_span_context()
                exposed = step._id
            assert otel_trace.get_current_span().get_span_context().span_id == sink.span_id(step._parent)
        assert not otel_trace.get_current_span().get_span_context().is_valid, "detached at region exit"
    provider.shutdown()
    assert inside.span_id == loader.get_span_context().span_id
    got = collector.wait_for(lambda spans: sum(s["trace_id"] == sink.trace_id for s in spans) >= 5)
    mine = {s["name"]: s for s in got if s["trace_id"] == sink.trace_id}
    assert set(mine) == {"cltrace.run", "train", "step", "add", "data-loader"}
    assert mine["step"]["span_id"] == sink.span_id(exposed)
    assert mine["data-loader"]["parent_id"] == mine["step"]["span_id"]
    assert mine["step"]["parent_id"] == mine["train"]["span_id"]
    assert mine["train"]["parent_id"] == mine["cltrace.run"]["span_id"]
    assert mine["add"]["parent_id"] == mine["step"]["span_id"]


def test_without_otlp_regions_leave_the_context_alone(region_path: str, tmp_path: Any, kernels: Any,
                                                      queue: Any) -> None:
    mem = InMemorySpanExporter()
    provider, tracer = sdk_tracer(mem)
    with cltrace.trace(str(tmp_path / "t.json"), quiet=True):
        r = cltrace.region("infer", queue)
        assert type(r).__name__ == ("Region" if region_path == "native" else "_Region")
        with tracer.start_as_current_span("request") as req:
            with r:
                assert otel_trace.get_current_span() is req
                kernels.launch_add(queue)
                with tracer.start_as_current_span("inner"):
                    pass
    spans = {s.name: s for s in mem.get_finished_spans()}
    assert spans["inner"].parent.span_id == req.get_span_context().span_id
    assert not otel_context.PARENTS and not otel_context.active()


def test_run_started_inside_a_span_keeps_regions_under_its_root(region_path: str, kernels: Any,
                                                                queue: Any) -> None:
    mem = InMemorySpanExporter()
    provider, tracer = sdk_tracer(mem)
    with tracer.start_as_current_span("job") as job:
        with cltrace.trace(OtlpSink(tracer_provider=provider)):
            with cltrace.region("work", queue):
                kernels.launch_add(queue)
            with tracer.start_as_current_span("request") as req:
                with cltrace.region("served", queue):
                    kernels.launch_add(queue)
    spans: dict[str, list[Any]] = {}
    for s in mem.get_finished_spans():
        spans.setdefault(s.name, []).append(s)
    (run,), (work,), (served,) = spans["cltrace.run"], spans["work"], spans["served"]
    assert run.parent.span_id == job.get_span_context().span_id
    assert work.parent.span_id == run.context.span_id, "the span the run started under stays above cltrace.run"
    assert served.parent.span_id == req.get_span_context().span_id
    assert {s.context.trace_id for v in spans.values() for s in v} == {job.get_span_context().trace_id}
    kernels_by_parent = sorted(s.parent.span_id for s in spans["add"])
    assert kernels_by_parent == sorted([work.context.span_id, served.context.span_id])


def test_parents_table_stays_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(otel_context, "PARENTS_MAX", 64)
    mem = InMemorySpanExporter()
    provider, tracer = sdk_tracer(mem)
    with cltrace.trace(OtlpSink(exporter=InMemorySpanExporter())):
        sizes = []
        with tracer.start_as_current_span("request"):
            for _ in range(500):
                with cltrace.region("r"):
                    pass
                sizes.append(len(otel_context.PARENTS))
    assert max(sizes) == 64 and min(sizes[100:]) >= 32, "the older half goes, the newer stays"
    assert not otel_context.PARENTS, "forgotten when the last OTLP sink closes"


def test_direct_encoding_places_spans_as_the_sdk_encoder_does(queue: Any) -> None:
    """Regions opened under other spans (another trace, a remote parent) encode as ReadableSpans do."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope

    spans = synthetic_spans(queue)
    mapper = Mapper(RECORDER, 0xABCDEF, 0x1234)
    region = next(s for s in spans if s.cat == REGION)
    child = next(s for s in spans if s.parent == region.id)
    mapper.parents = {region.id: (0x5151, 0x77, True)}
    assert mapper.place(region) == (0x5151, 0x77, True)
    assert mapper.place(child) == (0x5151, mapper.span_id(region.id), False)
    enc = WireEncoder(mapper, "cltrace", "1.2.3")
    attrs = resource_attributes(RECORDER, base_resource("svc"))
    payload = enc.request(enc.resource(attrs), [enc.encode(s) for s in spans])
    resource, scope = Resource(attrs), InstrumentationScope("cltrace", "1.2.3")
    readable = [readable_span(mapper.convert(s), mapper.place(s)[0], resource, scope, mapper.place(s)[2])
                for s in spans]
    assert payload == encode_spans(readable).SerializeToString()
