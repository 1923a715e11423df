"""The OpenTelemetry releases cltrace builds on: the installed ones are tested releases and have what
export/otlp/transport.py overrides and reads (its ``HOOKS``), and pyproject.toml pins what was tested.

Each failure is one line naming the release and what it lacks. The exporters' hooks decide whether a protocol
sends cltrace's own encoding (``wire``) or the SDK's (a release before the hooks): both send, neither raises
from inside the SDK. Run with the lowest and the highest release of each range of ``TESTED`` (a scratch venv each)
before widening a pin.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from cltrace.export.otlp import transport
from cltrace.export.otlp.config import Target
from cltrace.export.otlp.transport import GRPC_DIST, HOOKS, HTTP_DIST, SDK, TESTED, Encoded, release

PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"


def test_the_installed_opentelemetry_has_what_cltrace_builds_on() -> None:
    problems = transport.sdk_problems()
    assert not problems, problems[0]


def test_pyproject_pins_the_tested_range() -> None:
    text = PYPROJECT.read_text()
    for dist in HOOKS:
        pins = re.findall(rf'"{re.escape(dist)}([^"]*)"', text)
        assert pins and all(p == TESTED[dist] for p in pins), \
            f"pyproject.toml pins {dist}{pins}, transport.TESTED says {TESTED[dist]}"


@pytest.mark.parametrize("dist", [GRPC_DIST, HTTP_DIST])
def test_each_protocol_sends_our_encoding_exactly_where_its_release_has_the_hooks(dist: str) -> None:
    rel = release(dist)
    if rel is None:
        pytest.skip(f"{dist} is not installed (the [otlp] extra)")
    errors: list[str] = []
    make = transport.grpc_exporter if dist == GRPC_DIST else transport.http_exporter
    url = "http://127.0.0.1:9" + ("" if dist == GRPC_DIST else "/v1/traces")  # discard: nothing listens
    exp, wire = make(Target(url, True, "test"), None, 0.3, errors.append)
    first = HOOKS[dist][0]
    assert wire == (rel >= first), (f"{dist} {'.'.join(map(str, rel))}: cltrace's encoding is "
                                    f"{'on' if wire else 'off'}; expected {'on' if rel >= first else 'off'} "
                                    f"(hooks from {first[0]}.{first[1]})")
    try:  # our encoding, or the SDK's own path (ReadableSpans through its encoder), reaches the transport
        got = exp.export(Encoded(b"", 0) if wire else [])
    except (AttributeError, TypeError) as exc:
        pytest.fail(f"{dist} {'.'.join(map(str, rel))}: export raised from inside the SDK: {exc!r}")
    except OSError:  # the transport's own word that nothing listens (1.25's HTTP exporter raises it)
        got = transport.SpanExportResult.FAILURE
    finally:
        exp.shutdown()
    assert got == transport.SpanExportResult.FAILURE or not wire  # nothing listens: an empty SDK batch may succeed


def test_a_tracer_provider_gives_its_span_processor() -> None:
    from opentelemetry.sdk.trace import TracerProvider

    provider = TracerProvider()
    dest = transport.destination(None, None, None, 1.0, None, provider, 1, False, lambda m: None)
    assert dest.processor is getattr(provider, transport.PROVIDER_HOOKS[0]) and dest.resource is provider.resource
    with pytest.raises(TypeError, match="TracerProvider"):
        transport.destination(None, None, None, 1.0, None, object(), 1, False, lambda m: None)


def test_sdk_problems_name_a_release_outside_the_range(monkeypatch: pytest.MonkeyPatch) -> None:
    """The one line a release outside ``TESTED`` gets (the installed release is in range: the version read is
    replaced, the release itself is real)."""
    real = transport.metadata.version
    monkeypatch.setattr(transport.metadata, "version", lambda dist: "1.99.0" if dist == SDK else real(dist))
    problems = [p for p in transport.sdk_problems() if p.startswith(SDK + " ")]
    assert problems == [f"{SDK} 1.99.0 is outside the tested range {TESTED[SDK]}: run tests/test_otlp_sdk.py "
                        "and tests/test_otlp.py with it, then widen the pin in pyproject.toml"]
