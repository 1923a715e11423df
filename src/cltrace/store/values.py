"""OTLP values as the collector's ClickHouse exporter writes them: strings, as pdata gives them.

The exporter (``exporter/clickhouseexporter``, ``exporter_traces.go``) stores every attribute map
through ``attributesToMap``, which keeps ``pcommon.Value.AsString()`` of each value
(``pdata/pcommon/value.go``): a string as is; a bool ``true``/``false``; an int in decimal; a double
with Go's ``strconv.FormatFloat(f, 'f', -1, 64)`` (shortest round-trip digits, never an exponent);
an array as Go's ``encoding/json`` marshals it (no spaces, ``<``, ``>``, ``&`` escaped, floats in
the shortest form, with an exponent below 1e-6 or from 1e21). Span kind and status code go in as
``traceutil.SpanKindStr`` and ``traceutil.StatusCodeStr`` name them (``SPAN_KIND_INTERNAL``,
``STATUS_CODE_UNSET``/``OK``/``ERROR``); trace and span ids as lowercase hex, empty when zero
(``TraceIDToHexOrEmptyString``).
"""
from __future__ import annotations

import json
import math
from typing import Any

import numpy as np

SPAN_KINDS = ("SPAN_KIND_UNSPECIFIED", "SPAN_KIND_INTERNAL", "SPAN_KIND_SERVER", "SPAN_KIND_CLIENT",
              "SPAN_KIND_PRODUCER", "SPAN_KIND_CONSUMER")
STATUS_CODES = ("STATUS_CODE_UNSET", "STATUS_CODE_OK", "STATUS_CODE_ERROR")
_HTML = str.maketrans({"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"})


def format_float(f: float) -> str:
    """Go's ``strconv.FormatFloat(f, 'f', -1, 64)``."""
    if math.isnan(f):
        return "NaN"
    if math.isinf(f):
        return "+Inf" if f > 0 else "-Inf"
    return np.format_float_positional(f, unique=True, trim="-")


def _json_float(f: float) -> str:
    """Go's ``encoding/json`` form of a float64 (it refuses NaN and infinities: null here)."""
    if math.isnan(f) or math.isinf(f):
        return "null"
    a = abs(f)
    if a != 0 and (a < 1e-6 or a >= 1e21):
        s = np.format_float_scientific(f, unique=True, trim="-")  # "1e-07" -> "1e-7", as Go cleans it
        mant, _, exp = s.partition("e")
        sign = exp[0] if exp[0] in "+-" else "+"
        digits = exp.lstrip("+-").lstrip("0") or "0"
        return f"{mant}e{sign}{digits}" if sign == "-" else f"{mant}e+{digits}"
    return format_float(f)


def _json(v: Any) -> str:
    t = type(v)
    if t is bool:
        return "true" if v else "false"
    if t is int:
        return str(v)
    if t is float:
        return _json_float(v)
    if t is str:
        return json.dumps(v, ensure_ascii=False).translate(_HTML)
    if t is list or t is tuple:
        return "[" + ",".join(_json(x) for x in v) + "]"
    return json.dumps(str(v), ensure_ascii=False).translate(_HTML)


def as_string(v: Any) -> str:
    """``pcommon.Value.AsString()`` of an OpenTelemetry attribute value."""
    t = type(v)
    if t is str:
        return v
    if t is bool:
        return "true" if v else "false"
    if t is int:
        return str(v)
    if t is float:
        return format_float(v)
    if t is list or t is tuple:
        return _json(list(v))
    if t is bytes:
        import base64

        return base64.b64encode(v).decode("ascii")
    return str(v)


def attributes(attrs: dict[str, Any]) -> dict[str, str]:
    """``attributesToMap``: every value as ``as_string`` gives it."""
    return {k: as_string(v) for k, v in attrs.items()}


def hex_id(value: int, nbytes: int) -> str:
    """A trace (16 bytes) or span (8 bytes) id as lowercase hex, empty for zero."""
    return f"{value:0{2 * nbytes}x}" if value else ""
