"""OTLP endpoints as users write them, against a real collector (rotel, plain text):
one reading of ``host:port`` for ``--otlp``/``OtlpSink(endpoint)`` and OTEL_EXPORTER_OTLP_ENDPOINT,
the OTEL_EXPORTER_OTLP_[TRACES_]INSECURE variables, a one-line diagnosis naming the fix when
every export fails, and a bounded close once exports have been failing."""
from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from typing import Any, Iterator

import pytest

import cltrace
from cltrace.export.otlp import OtlpSink, otlp_sink_from_env
from cltrace.record.recorder import RECORDER
from otlp_collector import RotelCollector, free_port
from test_otlp import clean_env, run_script, wait_trace

VARS = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_PROTOCOL",
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_INSECURE", "OTEL_EXPORTER_OTLP_TRACES_INSECURE")


@pytest.fixture(scope="module")
def collector() -> Iterator[RotelCollector]:
    with RotelCollector() as col:
        yield col


@pytest.fixture(autouse=True)
def no_otel_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in VARS:
        monkeypatch.delenv(var, raising=False)


def test_insecure_true_lets_a_bare_host_port_in_the_environment_reach_a_plaintext_collector(
        collector: RotelCollector, tmp_path: Any) -> None:
    service = "bare-env"
    p, _ = run_script("""
        import cltrace
        for i in range(3):
            with cltrace.region("bare %d" % i):
                pass
    """, env=clean_env(CLTRACE="1", CLTRACE_OUT=str(tmp_path / "t.json"), OTEL_SERVICE_NAME=service,
                       OTEL_EXPORTER_OTLP_ENDPOINT=collector.grpc_address,  # 127.0.0.1:PORT, no scheme
                       OTEL_EXPORTER_OTLP_INSECURE="true"))
    assert p.returncode == 0 and "cltrace" not in p.stderr, p.stderr

    def mine(spans: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [s for s in spans if s["resource"].get("service.name") == service]

    got = mine(collector.wait_for(lambda spans: len(mine(spans)) >= 4))
    assert sorted(s["name"] for s in got) == ["bare 0", "bare 1", "bare 2", "cltrace.run"]


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_a_bare_host_port_is_tls_and_a_plaintext_collector_gets_nothing_but_a_hint(
        protocol: str, collector: RotelCollector, tmp_path: Any) -> None:
    """As the OpenTelemetry SDKs do: no scheme, no OTEL_EXPORTER_OTLP_INSECURE=true, means TLS. Against a
    plain-text collector nothing is delivered (neither the spans nor the authorization header), and one line
    says how to choose plain text."""
    service = f"bare-tls-{protocol.split('/')[0]}"
    address = collector.grpc_address if protocol == "grpc" else f"127.0.0.1:{collector.http_port}"
    p, _ = run_script("""
        import cltrace
        for i in range(3):
            with cltrace.region("secret %d" % i):
                pass
    """, env=clean_env(CLTRACE="1", CLTRACE_OUT=str(tmp_path / "t.json"), OTEL_SERVICE_NAME=service,
                       OTEL_EXPORTER_OTLP_ENDPOINT=address, OTEL_EXPORTER_OTLP_PROTOCOL=protocol,
                       OTEL_EXPORTER_OTLP_HEADERS="authorization=Bearer hunter2", OTEL_EXPORTER_OTLP_TIMEOUT="1"))
    assert p.returncode == 0, p.stderr
    lines = [ln for ln in p.stderr.splitlines() if "cltrace" in ln and "OTLP" in ln]
    assert len(lines) == 1, p.stderr
    line = lines[0]
    assert "4 of 4 spans not delivered" in line and "the collector speaks plain text" in line, line
    assert f"use http://{address} or set OTEL_EXPORTER_OTLP_INSECURE=true" in line, line
    assert "a bare host:port in OTEL_EXPORTER_OTLP_ENDPOINT" in line, line
    time.sleep(0.5)  # what rotel would have printed for a request has had time to arrive
    assert not [s for s in collector.spans() if s["resource"].get("service.name") == service]
    assert "hunter2" not in collector.output()


class FirstBytes:
    """A listening socket that keeps the first bytes each connection sends, then closes it: what a
    client puts on the wire before any answer."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.got: list[bytes] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            with conn:
                conn.settimeout(2)
                data = b""
                with contextlib.suppress(OSError):
                    while len(data) < 64:
                        chunk = conn.recv(64)
                        if not chunk:
                            break
                        data += chunk
                self.got.append(data)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        self.sock.close()


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_a_bare_host_port_never_puts_plain_text_on_the_wire(protocol: str) -> None:
    """What reaches the port of a bare ``host:port`` opens with a TLS handshake record (0x16 0x03), never
    an HTTP/2 preface or an HTTP/1.1 request line with its headers."""
    server = FirstBytes()
    try:
        sink = OtlpSink(f"127.0.0.1:{server.port}", protocol=protocol, timeout_s=0.5, close_timeout_s=1,
                        failing_close_timeout_s=0.5, headers={"authorization": "Bearer hunter2"})
        with cltrace.trace(sink):
            with cltrace.region("r"):
                pass
        t0 = time.monotonic()
        while not server.got and time.monotonic() - t0 < 10:
            time.sleep(0.05)
    finally:
        server.close()
    assert server.got, "the exporter never connected"
    assert all(b.startswith(b"\x16\x03") for b in server.got), server.got
    assert not any(b"hunter2" in b or b"HTTP" in b for b in server.got)


# endpoint, variables, plain text? (the specification: a scheme wins; else the signal's INSECURE
# variable, then the generic one; a bare host:port without them is TLS, as the SDKs read it)
CASES = [
    ("127.0.0.1:4317", {}, False),
    ("127.0.0.1:4317", {"OTEL_EXPORTER_OTLP_INSECURE": "false"}, False),
    ("127.0.0.1:4317", {"OTEL_EXPORTER_OTLP_INSECURE": "TRUE"}, True),
    ("127.0.0.1:4317", {"OTEL_EXPORTER_OTLP_TRACES_INSECURE": "false", "OTEL_EXPORTER_OTLP_INSECURE": "true"}, False),
    ("127.0.0.1:4317", {"OTEL_EXPORTER_OTLP_TRACES_INSECURE": "true", "OTEL_EXPORTER_OTLP_INSECURE": "false"}, True),
    ("http://127.0.0.1:4317", {"OTEL_EXPORTER_OTLP_INSECURE": "false"}, True),
    ("https://127.0.0.1:4317", {"OTEL_EXPORTER_OTLP_INSECURE": "true"}, False),
]


@pytest.mark.parametrize("endpoint, env, plaintext", CASES)
def test_argument_and_environment_read_an_endpoint_the_same_way(endpoint: str, env: dict[str, str],
                                                               plaintext: bool,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    by_argument = OtlpSink(endpoint, protocol="grpc")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
    by_env = otlp_sink_from_env(protocol="grpc")
    for sink in (by_argument, by_env):
        assert sink.endpoint == "127.0.0.1:4317"
        assert [e._insecure for e in sink.exporters] == [plaintext] * len(sink.exporters)  # what the SDK dials


def test_a_bad_insecure_value_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_INSECURE", "yes")
    with pytest.raises(ValueError, match=r"OTEL_EXPORTER_OTLP_TRACES_INSECURE='yes'.*true.*false"):
        OtlpSink("127.0.0.1:4317", protocol="grpc")


def send_and_report(sink: OtlpSink, caplog: pytest.LogCaptureFixture) -> list[str]:
    with caplog.at_level(logging.WARNING, logger="cltrace"):
        caplog.clear()
        with cltrace.trace(sink):
            with cltrace.region("r"):
                pass
    return [r.getMessage() for r in caplog.records if r.name == "cltrace"]


def test_insecure_true_makes_a_bare_endpoint_plain_text(collector: RotelCollector, caplog: Any,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_INSECURE", "true")
    sink = OtlpSink(collector.grpc_address, protocol="grpc")
    assert send_and_report(sink, caplog) == []
    wait_trace(collector, sink.trace_id, 2)


@pytest.mark.parametrize("how, fix", [
    ("OTEL_EXPORTER_OTLP_INSECURE=false", "set OTEL_EXPORTER_OTLP_INSECURE=true"),
    ("https://", "use http://127.0.0.1:"),
])
def test_tls_to_a_plaintext_collector_is_one_line_naming_the_fix(how: str, fix: str, collector: RotelCollector,
                                                                caplog: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    if how.startswith("OTEL"):
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_INSECURE", "false")
        sink = OtlpSink(collector.grpc_address, protocol="grpc", timeout_s=0.5)
    else:
        sink = OtlpSink("https://" + collector.grpc_address, protocol="grpc", timeout_s=0.5)
    (line,) = send_and_report(sink, caplog)
    assert sink.delivered == 0
    assert "2 of 2 spans not delivered" in line and "the collector speaks plain text" in line
    assert fix in line and how in line  # what chose TLS, and what to change
    assert len(line) < 260 and "\n" not in line


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port that accepts connections and never answers (a hung collector)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(64)
        yield s.getsockname()[1]


def fail_then_stop(sink: OtlpSink) -> float:
    """Trace until an export has failed, queue 20 000 more spans, and time ``stop`` (the sink's close)."""
    cltrace.start(sink)
    t0 = time.monotonic()
    while sink.failed_exports == 0:
        assert time.monotonic() - t0 < 30, "no export failed"
        with cltrace.region("before"):
            pass
        RECORDER.flush()
        time.sleep(0.02)
    for _ in range(20_000):
        with cltrace.region("queued"):
            pass
    RECORDER.flush(block=True)  # resolved and queued for the sink: what is left is the sink's close
    t = time.monotonic()
    cltrace.stop()
    return time.monotonic() - t


@pytest.mark.timing
@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
@pytest.mark.parametrize("collector_kind", ["silent", "dead"])
def test_close_waits_at_most_the_failing_timeout_once_exports_fail(protocol: str, collector_kind: str,
                                                                   silent_port: int, caplog: Any) -> None:
    port = silent_port if collector_kind == "silent" else free_port()
    ep = f"127.0.0.1:{port}" if protocol == "grpc" else f"http://127.0.0.1:{port}/v1/traces"
    sink = OtlpSink(ep, protocol=protocol)  # default timeouts: 2 s per export, close 5 s, 1 s once failing
    with caplog.at_level(logging.WARNING, logger="cltrace"):
        took = fail_then_stop(sink)
    assert took < sink.failing_close_timeout_s + 3, f"stop took {took:.2f} s"  # not close_timeout_s
    st = sink.stats()
    # every span delivered, failed (refused, or sent and unanswered by close) or dropped: none in between
    assert st["delivered"] == 0 and st["failed"] + st["dropped"] == st["received"] > 20_000 and st["in_flight"] == 0
    lines = [r.getMessage() for r in caplog.records if r.name == "cltrace"]
    assert all(len(ln) < 260 and "\n" not in ln for ln in lines), lines
    assert sum("spans not delivered" in ln for ln in lines) == 1
    assert any("unsent" in ln for ln in lines)  # the report says which spans went which way
    # A dead port refuses at once; on a loaded machine the HTTP exporter may give up first, and then it
    # truly had no answer within its 2 s: either cause is the truth, never a silent one.
    causes = ("no answer within 2 s",) if collector_kind == "silent" else ("connection refused", "no answer within 2 s")
    assert all(any(c in ln for c in causes) for ln in lines), lines


def test_a_worker_left_behind_takes_no_later_sinks_log_records(silent_port: int) -> None:
    """An HTTP request in flight at close leaves its worker behind; once that worker ends, its sink's
    log filter holds no thread and hangs on no logger, so a later sink's worker (which may get the ended
    thread's ident) keeps its own exporter's errors: a later failure still names its cause."""
    old = OtlpSink(f"http://127.0.0.1:{silent_port}/v1/traces", protocol="http/protobuf", timeout_s=1.0,
                   failing_close_timeout_s=0.1, close_timeout_s=0.2)
    fail_then_stop(old)
    f = old._log_filter
    t0 = time.monotonic()
    while any(t.is_alive() for t in old._workers):
        assert time.monotonic() - t0 < 10, "the left-behind worker never ended"
        time.sleep(0.05)
    assert not f.threads and not f._loggers
    assert all(f not in lg.filters for lg in logging.Logger.manager.loggerDict.values()
               if isinstance(lg, logging.Logger))
    dead = OtlpSink(f"http://127.0.0.1:{free_port()}/v1/traces", protocol="http/protobuf")
    fail_then_stop(dead)
    assert dead.diagnosis().startswith(("connection refused", "no answer within")), dead.diagnosis()


def test_the_failing_timeout_is_configurable(silent_port: int) -> None:
    sink = OtlpSink(f"127.0.0.1:{silent_port}", protocol="grpc", timeout_s=0.5, failing_close_timeout_s=0.2)
    took = fail_then_stop(sink)
    assert took < 0.9, f"stop took {took:.2f} s"  # under the default 1 s once failing
