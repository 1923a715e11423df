"""Why exports fail, in a few words, and what to change: the exporters' errors (gRPC status
text, urllib3 exceptions, HTTP codes) run to hundreds of characters and name no fix."""
from __future__ import annotations

from urllib.parse import urlparse

from .config import Target


def _where(target: Target | None, endpoint: str) -> str:
    url = target.url if target is not None else endpoint
    u = urlparse(url if "://" in url else "//" + url)
    return u.netloc or url


def diagnose(error: str | None, protocol: str, endpoint: str, target: Target | None, timeout_s: float) -> str:
    """``"<cause>: <fix>"`` for the last export error (short; no exporter text beyond ~100 characters)."""
    raw = error or ""
    e = raw.lower()
    hp = _where(target, endpoint)
    tls = target is not None and not target.insecure
    if "wrong_version_number" in e or "wrong version number" in e:
        fix = (f"use http://{hp} or set OTEL_EXPORTER_OTLP_INSECURE=true" if target is None or target.bare
               else f"use http://{hp}")  # the variable does not overrule an https:// the user wrote
        why = f" (TLS was chosen by {target.how})" if target is not None else ""
        return f"TLS handshake failed, the collector speaks plain text{why}: {fix}"
    if "connection refused" in e:
        return f"connection refused: is a collector listening at {hp}?"
    if "http1" in e or "http/1" in e or "http2 header with status" in e:
        return ("that port answers as a web server, not OTLP/gRPC: for OTLP/HTTP (usually port 4318) use "
                "--otlp-protocol http/protobuf or OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf")
    if "badstatusline" in e or "connection aborted" in e:
        return ("that port does not answer HTTP/1.1 (a gRPC port?): for OTLP/gRPC (usually port 4317) "
                "use --otlp-protocol grpc or OTEL_EXPORTER_OTLP_PROTOCOL=grpc")
    if "code: 404" in e or ("404" in e and "not found" in e):
        return f"HTTP 404 at {target.url if target else endpoint}: the OTLP/HTTP traces path is /v1/traces"
    if "certificate" in e or "ssl" in e or "tls" in e:
        return f"TLS failed ({_short(raw)}): check the collector's certificate (OTEL_EXPORTER_OTLP_CERTIFICATE)"
    if not tls and any(k in e for k in ("socket closed", "connection reset", "eof", "end of stream")):
        return f"the collector closed the connection: if it requires TLS, use https://{hp}"
    if "deadline" in e or "timeout" in e or "timed out" in e:
        return f"no answer within {timeout_s:g} s: is {hp} an OTLP collector, and is it overloaded?"
    if not raw:
        return "the exporter reported failure without a reason"
    return _short(raw)


def _short(text: str, limit: int = 100) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 1] + "…"
