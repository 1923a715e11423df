"""The OTLP resource of a run: service name and user attributes from the environment, and
the host, process and job (run id, rank) cltrace detected. The OpenCL devices the run used are on
its ``cltrace.run`` span (``mapping.DEVICE_LISTS``), each device span naming its own."""
from __future__ import annotations

import os
import platform
import socket
import sys
from typing import Any, Mapping

from opentelemetry.sdk.resources import Resource

from ..._version import version as _version
from ...record import job
from ..base import TraceContext
from ..processes import command_args


def base_resource(service_name: str | None) -> dict[str, Any]:
    """Resource attributes from the environment (OTEL_RESOURCE_ATTRIBUTES, OTEL_SERVICE_NAME)
    and the SDK, with an explicit ``service_name`` over both; default name ``cltrace``.

    Computed once, before any export: the SDK runs its resource detectors on a thread
    pool, which no longer accepts work while the interpreter shuts down.
    """
    attrs = dict(Resource.create({"service.name": service_name} if service_name else {}).attributes)
    if str(attrs.get("service.name", "")).startswith("unknown_service"):
        attrs["service.name"] = "cltrace"
    return attrs


def resource_attributes(ctx: TraceContext, base: Mapping[str, Any]) -> dict[str, Any]:
    """Detected host/process/job facts, overridden by ``base`` (see ``base_resource``)."""
    detected: dict[str, Any] = {
        "host.name": socket.gethostname(),
        "host.arch": platform.machine(),
        "os.type": platform.system().lower(),
        "process.pid": os.getpid(),
        "process.executable.path": sys.executable,
        "process.runtime.name": sys.implementation.name,
        "process.runtime.version": platform.python_version(),
        "cltrace.version": _version(),
        "cltrace.host.unix_offset_ns": ctx.start_unix_ns - ctx.start_ns,
        **job.resource_attributes(job.identity()),
    }
    args = command_args()  # redacted, or None where the command line is left out
    if args is not None:
        detected["process.command_args"] = args
    return {**detected, **base}
