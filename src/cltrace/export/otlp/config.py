"""OTLP sink settings: protocol, endpoint URL, headers and timeout, from arguments or the
standard ``OTEL_EXPORTER_OTLP_*`` variables, with a clear error for a bad value."""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping
from urllib.parse import urlparse

GRPC = "grpc"
HTTP = "http/protobuf"
_PROTOCOLS = {"grpc": GRPC, "http/protobuf": HTTP, "http": HTTP}

DEFAULT_TIMEOUT_S = 2.0
DEFAULT_CLOSE_TIMEOUT_S = 5.0
DEFAULT_FAILING_CLOSE_TIMEOUT_S = 1.0  # the most close waits once exports have been failing
DEFAULT_MAX_QUEUE_SPANS = 131_072
DEFAULT_MAX_BATCH_SPANS = 4096
DEFAULT_MAX_REQUEST_BYTES = 3 << 20  # collectors (otelcol, rotel) refuse gRPC messages over 4 MiB

ENDPOINT_VARS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")


def env(*names: str) -> str | None:
    """The first of the variables ``names`` that is set and not empty, stripped."""
    for n in names:
        v = os.environ.get(n)
        if v:
            return v.strip()
    return None


def resolve_protocol(protocol: str | None, endpoint: str | None) -> str:
    """``grpc`` or ``http/protobuf``: argument, then OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL,
    then the look of the endpoint (None: OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT): port 4318
    or a ``/v1/traces`` path mean HTTP, else gRPC."""
    p = protocol or env("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")
    if p:
        key = p.strip().lower()
        if key not in _PROTOCOLS:
            raise ValueError(f"OTLP protocol {p!r} is not supported: use 'grpc' or 'http/protobuf'")
        return _PROTOCOLS[key]
    if endpoint is None:
        endpoint = env(*ENDPOINT_VARS)
    if endpoint:
        u = urlparse(endpoint if "://" in endpoint else "//" + endpoint)
        if u.path.rstrip("/").endswith("/v1/traces") or u.port == 4318:
            return HTTP
    return GRPC


INSECURE_VARS = ("OTEL_EXPORTER_OTLP_TRACES_INSECURE", "OTEL_EXPORTER_OTLP_INSECURE")
DEFAULT_GRPC_ENDPOINT = "http://localhost:4317"
DEFAULT_HTTP_ENDPOINT = "http://localhost:4318/v1/traces"


@dataclass(frozen=True)
class Target:
    """Where a sink's own exporters send, and how: ``url`` (``http://`` or ``https://``), ``insecure``
    (plain text), ``how``: what decided the transport, for the hint when every export fails, and
    ``bare``: the endpoint named no scheme (OTEL_EXPORTER_OTLP_INSECURE could change it)."""

    url: str
    insecure: bool
    how: str
    bare: bool = False


def _insecure_env() -> tuple[bool, str] | None:
    """OTEL_EXPORTER_OTLP_[TRACES_]INSECURE as (value, variable), or None when neither is set."""
    for name in INSECURE_VARS:
        raw = os.environ.get(name, "").strip()
        if raw:
            if raw.lower() not in ("true", "false"):
                raise ValueError(f"{name}={raw!r} is not a boolean: set it to true (plain text) or false (TLS)")
            return raw.lower() == "true", name
    return None


def resolve_target(endpoint: str | None, protocol: str) -> Target:
    """The one reading of an endpoint, whether it came as an argument (``--otlp``, ``OtlpSink``) or
    from OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT, as the OpenTelemetry specification and its SDKs have it:

    - ``https://`` means TLS and ``http://`` plain text, whatever OTEL_EXPORTER_OTLP_INSECURE says;
    - a bare ``host:port`` is TLS unless OTEL_EXPORTER_OTLP_[TRACES_]INSECURE=true asks for plain text
      (the signal's variable first): spans, and headers such as ``authorization``, never cross a
      network in clear text unless the user says so (``http://`` or the variable). A plain-text
      collector answers the handshake with garbage, and the sink's one line at close says how to
      choose plain text (``diagnose``);
    - OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is used as it is, OTEL_EXPORTER_OTLP_ENDPOINT gets
      ``/v1/traces`` appended for OTLP/HTTP; neither: http://localhost:4317 (gRPC) or :4318 (HTTP),
      the specification's defaults, plain text to this machine.
    """
    var = None
    if endpoint is None:
        for var in ENDPOINT_VARS:
            endpoint = env(var)
            if endpoint:
                break
        else:
            var = None
    if not endpoint:
        url = DEFAULT_GRPC_ENDPOINT if protocol == GRPC else DEFAULT_HTTP_ENDPOINT
        return Target(url, True, "the default endpoint")
    source = var or "the endpoint"
    scheme = endpoint.split("://", 1)[0].lower() if "://" in endpoint else ""
    if scheme:
        url, insecure, how, bare = endpoint, scheme != "https", f"the {scheme}:// of {source}", False
    else:
        setting = _insecure_env()
        insecure, name = setting if setting is not None else (False, "")
        how = f"{name}={'true' if insecure else 'false'}" if setting is not None else f"a bare host:port in {source}"
        url, bare = ("http://" if insecure else "https://") + endpoint, True
    if protocol != GRPC and (var == "OTEL_EXPORTER_OTLP_ENDPOINT" or (var is None and urlparse(url).path in ("", "/"))):
        url = url.rstrip("/") + "/v1/traces"
    return Target(url, insecure, how, bare)


def parse_headers(headers: Mapping[str, str] | str | None) -> dict[str, str] | None:
    """Request headers from a mapping or ``"k=v,k2=v2"`` (None: the exporter reads the environment)."""
    if headers is None or isinstance(headers, Mapping):
        return dict(headers) if headers is not None else None
    out = {}
    for part in headers.split(","):
        if part.strip():
            k, sep, v = part.partition("=")
            if not sep:
                raise ValueError(f"OTLP headers {headers!r}: expected 'key=value[,key=value]'")
            out[k.strip()] = v.strip()
    return out


def timeout_from_env() -> float | None:
    """OTEL_EXPORTER_OTLP_[TRACES_]TIMEOUT in seconds, as the OpenTelemetry Python exporters read it."""
    raw = env("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "OTEL_EXPORTER_OTLP_TIMEOUT")
    if raw is None:
        return None
    try:
        return float(raw)
    except ValueError:
        raise ValueError(f"OTEL_EXPORTER_OTLP_TIMEOUT={raw!r} is not a number of seconds") from None


def endpoint_problem(endpoint: str) -> str | None:
    """What is wrong with an OTLP endpoint (``host:port`` or ``http[s]://host:port[/path]``), or None."""
    try:
        u = urlparse(endpoint if "://" in endpoint else "//" + endpoint)
        u.port  # raises for a port that is not a number in range
    except ValueError as exc:
        return f"is not a valid URL ({exc})"
    if u.scheme not in ("", "http", "https"):
        return f"has scheme {u.scheme!r}"
    if not u.hostname:
        return "names no host"
    return None


def env_problems() -> list[str]:
    """One line per OTEL_EXPORTER_OTLP_* setting in effect that cannot be used, naming the
    variable and the fix (checked before building a sink, so a bad value costs only OTLP export)."""
    out = []
    for names, check, fix in (
        (("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"),
         lambda v: None if v.lower() in _PROTOCOLS else "is not a supported protocol", "set it to grpc or http/protobuf"),
        (("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "OTEL_EXPORTER_OTLP_TIMEOUT"),
         _timeout_problem, "set it to the export timeout in seconds, e.g. 10"),
        (ENDPOINT_VARS, endpoint_problem, "set it to host:port or http://host:port"),
    ):
        name = next((n for n in names if os.environ.get(n, "").strip()), None)
        if name is None:
            continue
        value = os.environ[name].strip()
        problem = check(value)
        if problem:
            out.append(f"{name}={value!r} {problem}: {fix}")
    return out


def _timeout_problem(value: str) -> str | None:
    try:
        return None if float(value) > 0 else "is not a positive number"
    except ValueError:
        return "is not a number"
