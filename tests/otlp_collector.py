"""A real OTLP collector for tests and benchmarks: rotel, run as a subprocess.

``RotelCollector`` starts ``rotel-agent`` on free loopback ports with the blackhole
exporter (or the one ``exporter`` names); with ``debug=True`` rotel prints every span it receives, and ``spans()``
parses that text into plain dicts.
"""
from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
from typing import Any, Callable


def rotel_binary() -> str:
    import rotel

    return os.path.join(os.path.dirname(rotel.__file__), "rotel-agent")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_port(port: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return True
        except OSError:
            time.sleep(0.02)
    return False


class RotelCollector:
    """rotel-agent listening on OTLP gRPC and HTTP; ``kill()`` (or leaving the block) stops it."""

    def __init__(self, debug: bool = True, exporter: list[str] | None = None) -> None:
        self.debug = debug
        self.exporter = exporter or ["--exporter", "blackhole"]  # rotel's exporter and its options
        self.dir = tempfile.mkdtemp(prefix="cltrace-rotel-")
        self.out_path = os.path.join(self.dir, "rotel.out")
        self.grpc_port = free_port()
        self.http_port = free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def grpc_address(self) -> str:
        """``127.0.0.1:PORT``: where rotel listens (a bare address means TLS to an OTLP client)."""
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def grpc_endpoint(self) -> str:
        """What a client dials for this plain-text collector: ``http://127.0.0.1:PORT``."""
        return f"http://{self.grpc_address}"

    @property
    def http_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.http_port}/v1/traces"

    def start(self) -> "RotelCollector":
        """Starts rotel; where a port it was given is taken by then (free_port's race with the rest of the
        machine), again on two new ones, up to three times."""
        for attempt in range(3):
            try:
                return self._start()
            except RuntimeError:
                if attempt == 2 or "Address already in use" not in self.output():
                    raise
                self.grpc_port, self.http_port = free_port(), free_port()
        raise AssertionError("unreachable")

    def _start(self) -> "RotelCollector":
        cmd = [rotel_binary(), "start",
               "--otlp-grpc-endpoint", self.grpc_address,
               "--otlp-http-endpoint", f"127.0.0.1:{self.http_port}",
               *self.exporter,
               "--pid-file", os.path.join(self.dir, "rotel.pid"),
               "--log-file", os.path.join(self.dir, "rotel.log")]
        if self.debug:
            cmd += ["--debug-log", "traces", "--debug-log-verbosity", "detailed"]
        env = dict(os.environ, NO_COLOR="1")
        with open(self.out_path, "wb") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
        if not (_wait_port(self.grpc_port, 10) and _wait_port(self.http_port, 10)):
            self.kill()
            raise RuntimeError(f"rotel did not start listening; its output:\n{self.output()}")
        return self

    def kill(self) -> None:
        p = self.proc
        if p is not None and p.poll() is None:
            p.kill()
            p.wait(10)

    def __enter__(self) -> "RotelCollector":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)

    def output(self) -> str:
        with open(self.out_path, encoding="utf-8", errors="replace") as fh:
            return fh.read()

    def spans(self) -> list[dict[str, Any]]:
        return parse_debug_output(self.output())

    def wait_for(self, pred: Callable[[list[dict[str, Any]]], bool], timeout_s: float = 30.0) -> list[dict[str, Any]]:
        """Parsed spans once ``pred(spans)`` holds; raises with what arrived after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            spans = self.spans()
            if pred(spans):
                return spans
            if time.monotonic() > deadline:
                raise AssertionError(f"collector: condition not met after {timeout_s}s; "
                                     f"{len(spans)} spans received")
            time.sleep(0.05)


# ---- parsing rotel's "detailed" debug log -------------------------------------------------

_HEADER = re.compile(r"^\s*(Trace ID|Parent ID|ID|Name|Kind|Status code|Status message)\s*: ?(.*)$")
_TIME = re.compile(r"^(Start time|End time): (\d+)$")
_ATTR = re.compile(r"^(\s*)-> ([^:]+): (.*)$")
_KNOWN = re.compile(r"^(\S.*#\d+$|Resource |ScopeSpans |InstrumentationScope|Attributes:|Events:"
                    r"|Start time:|End time:|\s+(Trace ID|Parent ID|ID|Name|Kind|Status code|Status message)\s*:"
                    r"|\s+-> |.*\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)")


def _split_args(s: str) -> list[str]:
    out, depth, cur = [], 0, ""
    for ch in s:
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
            continue
        depth += ch == "("
        depth -= ch == ")"
        cur += ch
    if cur.strip():
        out.append(cur.strip())
    return out


def parse_value(text: str) -> Any:
    """rotel's AnyValue text -> Python: Str(x), Int(1), Double(1.5), Bool(true), Slice(...)."""
    kind, _, rest = text.partition("(")
    inner = rest[:-1] if rest.endswith(")") else rest
    if kind == "Str":
        return inner
    if kind == "Int":
        return int(inner)
    if kind == "Double":
        return float(inner)
    if kind == "Bool":
        return inner == "true"
    if kind == "Slice":
        return [parse_value(x) for x in _split_args(inner)]
    return text


def parse_debug_output(text: str) -> list[dict[str, Any]]:
    """Spans (dicts) from rotel's ``--debug-log traces --debug-log-verbosity detailed`` output.

    Values are kept as raw text while reading (a string value may run over several lines)
    and parsed at the end.
    """
    spans: list[dict[str, Any]] = []
    resource: dict[str, Any] = {}
    section = None
    span: dict[str, Any] | None = None
    last: tuple[dict[str, Any], str] | None = None  # where a continuation line belongs
    for line in text.split("\n"):
        if line and last is not None and not _KNOWN.match(line):
            d, k = last
            d[k] += "\n" + line
            continue
        last = None
        if line.startswith("ResourceSpans #"):
            resource, section, span = {}, "resource", None
        elif line.startswith("Span #"):
            span = {"resource": resource, "attributes": {}, "events": []}
            spans.append(span)
            section = "span"
        elif line.startswith("Attributes:"):
            section = "attributes"
        elif line.startswith("Events:"):
            section = "events"
        elif line.startswith("SpanEvent #") and span is not None:
            span["events"].append({"attributes": {}})
        elif span is not None and (m := _TIME.match(line)):
            span["start" if m.group(1) == "Start time" else "end"] = int(m.group(2))
        elif span is not None and section == "span" and (m := _HEADER.match(line)):
            key = {"Trace ID": "trace_id", "Parent ID": "parent_id", "ID": "span_id", "Name": "name",
                   "Kind": "kind", "Status code": "status_code", "Status message": "status_message"}[m.group(1)]
            span[key] = m.group(2)
            last = (span, key)
        elif m := _ATTR.match(line):
            key, raw = m.group(2), m.group(3)
            if section == "resource":
                resource[key] = raw
                last = (resource, key)
            elif section == "attributes" and span is not None:
                span["attributes"][key] = raw
                last = (span["attributes"], key)
            elif section == "events" and span is not None and span["events"]:
                ev = span["events"][-1]
                if key == "Name":
                    ev["name"] = raw
                elif key == "Timestamp":
                    ev["time"] = int(raw)
                elif key != "DroppedAttributesCount" and len(m.group(1)) > 6:
                    ev["attributes"][key] = raw
                    last = (ev["attributes"], key)
        elif line.startswith("Resource attributes:"):
            section = "resource"
    seen: set[int] = set()
    for s in spans:
        for k in ("trace_id", "parent_id", "span_id"):
            s[k] = int(s[k], 16) if s.get(k) else None
        for d in (s["attributes"], *(e["attributes"] for e in s["events"])):
            d.update({k: parse_value(v) for k, v in d.items()})
        if id(s["resource"]) not in seen:
            seen.add(id(s["resource"]))
            s["resource"].update({k: parse_value(v) for k, v in s["resource"].items()})
    return spans
