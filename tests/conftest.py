"""Shared fixtures: real OpenCL on the default device (PoCL here), tiny kernels, clean state.

Every test starts and ends with tracing off and an empty recorder at its default
caps (``reset_cltrace``, autouse). Hypothesis tests, whose examples do not run
function-scoped fixtures, call ``reset_cltrace()`` themselves via the session
fixture ``reset``.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import numpy as np
import pyopencl as cl
import pytest

import cltrace
from cltrace.record import regions
from cltrace.record.recorder import RECORDER

RECORDER_DEFAULTS = {"capacity": 1_000_000, "overflow": "discard", "max_pending": 65_536, "memory_budget_mb": 512, "resolve_interval_s": 0.05,
                     "tickets_above": 0}

KERNEL_SOURCE = """
__kernel void add(__global float *a, __global const float *b) {
    int i = get_global_id(0);
    a[i] += b[i];
}
__kernel void spin(__global float *a, const int iters) {
    int i = get_global_id(0);
    float x = a[i];
    for (int k = 0; k < iters; ++k) x = x * 0.999f + 0.5f;
    a[i] = x;
}
"""


# Tests that use PoCL's own features (POCL_DEVICES="pthread pthread": two devices on one platform) run on
# the first PoCL platform whose device compiles, never on one named: several can be installed (the one pip
# brings with pyopencl cannot compile on CPUs newer than its LLVM). An expression, so subprocess scripts
# use the same choice (they import ``cl`` and ``verdict`` from ``cltrace.record.probe``).
POCL_PLATFORM = ("next(p for p in cl.get_platforms() "
                 "if 'Portable' in p.name and verdict(p.get_devices()[0]).compiles)")


def trace_processor_shell() -> str | None:
    """Perfetto's trace processor: ``CLTRACE_TRACE_PROCESSOR``, else ``../shared/tools/trace_processor_shell``
    beside the repository where it exists (the engine ui.perfetto.dev runs); None where neither does."""
    named = os.environ.get("CLTRACE_TRACE_PROCESSOR")
    shell = named or os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "tools",
                                  "trace_processor_shell")
    return os.path.realpath(shell) if os.path.isfile(shell) and os.access(shell, os.X_OK) else None



def pocl_platform() -> Any:
    """The PoCL platform ``POCL_PLATFORM`` chooses, in this process."""
    from cltrace.record.probe import verdict

    return eval(POCL_PLATFORM, {"cl": cl, "verdict": verdict})


def reset_cltrace() -> None:
    """Tracing off, sinks closed, recorder emptied and back at its default caps, no active queue."""
    cltrace.stop()
    for sink in list(RECORDER.sinks):
        RECORDER.remove_sink(sink)
    RECORDER.clear()
    RECORDER.configure(**RECORDER_DEFAULTS)
    RECORDER.meta.clear()
    cltrace.set_queue(None)
    regions._tls.stack.clear()
    regions._tls.stack.last_q = regions._tls.stack.last_ev = None
    regions.set_region_mode("auto")


@pytest.fixture()
def instrumented() -> Iterator[None]:
    """pyopencl hooked by ``cltrace.instrument()`` for the test, put back after."""
    cltrace.instrument()
    try:
        yield
    finally:
        cltrace.uninstrument()


@pytest.fixture()
def leave_pyopencl() -> Iterator[None]:
    """``cltrace.configure(record_pyopencl=False)`` for the test: tracing leaves pyopencl alone."""
    cltrace.configure(record_pyopencl=False)
    try:
        yield
    finally:
        cltrace.configure(record_pyopencl=True)


@pytest.fixture()
def region_mode() -> Iterator[Callable[[str], None]]:
    """Set how regions get their device span for the test (``regions.set_region_mode``); "auto" after."""
    yield regions.set_region_mode
    regions.set_region_mode("auto")


@pytest.fixture(params=["native", "python"])
def path_kind(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each test on the native trace scanner and on the general readers (``CLTRACE_NATIVE=0``'s path)."""
    from cltrace.read import scan

    if request.param == "native":
        if scan.NATIVE is None:
            pytest.skip("the native scanner is not in use (CLTRACE_NATIVE=0 or not built)")
    else:
        monkeypatch.setattr(scan, "NATIVE", None)
    return request.param


@pytest.fixture(autouse=True)
def clean_cltrace() -> Iterator[None]:
    reset_cltrace()
    yield
    reset_cltrace()


@pytest.fixture(scope="session")
def reset() -> Callable[[], None]:
    """``reset_cltrace`` for code that runs outside function fixtures (hypothesis examples)."""
    return reset_cltrace


def expected_domain(device: Any) -> str:
    """The clock a driver is known to stamp with: NVIDIA's OpenCL uses Unix-epoch ns, PoCL CLOCK_MONOTONIC."""
    return "unix-epoch" if "NVIDIA" in device.platform.name else "monotonic"


@pytest.fixture(scope="session")
def clock_domain(queue: Any) -> str:
    return expected_domain(queue.device)


@pytest.fixture(scope="session")
def cl_ctx() -> Any:
    return cl.Context([cltrace.default_device()])


@pytest.fixture(scope="session")
def queue(cl_ctx: Any) -> Any:
    """An in-order queue with PROFILING_ENABLE."""
    return cltrace.profiling_queue(cl_ctx)


@pytest.fixture(scope="session")
def plain_queue(cl_ctx: Any) -> Any:
    """A queue created without PROFILING_ENABLE."""
    return cl.CommandQueue(cl_ctx)


@dataclass(frozen=True)
class TinyKernels:
    """``add`` (a += b) and ``spin`` (a loop of ``iters`` steps per item) over ``n`` floats.

    ``cl.Kernel`` objects hold their arguments, so each thread should take its own
    with ``kernel(name)``; the shared ``add``/``spin`` are for single-threaded tests.
    """

    ctx: Any
    program: Any
    add: Any
    spin: Any
    a: Any
    b: Any
    n: int

    def kernel(self, name: str) -> Any:
        return cl.Kernel(self.program, name)

    def launch_add(self, queue: Any, kernel: Any = None) -> Any:
        return cltrace.launch(kernel or self.add, queue, (self.n,), None, self.a, self.b)

    def launch_spin(self, queue: Any, iters: int = 200, kernel: Any = None) -> Any:
        return cltrace.launch(kernel or self.spin, queue, (self.n,), None, self.a, np.int32(iters))


@pytest.fixture(scope="session")
def kernels(cl_ctx: Any) -> TinyKernels:
    n = 4096
    program = cl.Program(cl_ctx, KERNEL_SOURCE).build()
    mf = cl.mem_flags
    host = np.ones(n, dtype=np.float32)
    a = cl.Buffer(cl_ctx, mf.READ_WRITE | mf.COPY_HOST_PTR, hostbuf=host)
    b = cl.Buffer(cl_ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=host)
    return TinyKernels(cl_ctx, program, cl.Kernel(program, "add"), cl.Kernel(program, "spin"), a, b, n)


class ChromeTrace:
    """A Chrome JSON trace read back for checks. Slice times are integer nanoseconds."""

    def __init__(self, events: list[dict[str, Any]]) -> None:
        self.events = events
        meta = [e for e in events if e.get("ph") == "i" and e.get("name") == "cltrace.metadata"]
        self.meta: dict[str, Any] = meta[-1]["args"] if meta else {}
        self.host_pid = next(e["pid"] for e in events if e.get("ph") == "M" and e["name"] == "process_name")
        self.slices = [e for e in events if e.get("ph") == "X"]

    @classmethod
    def read(cls, path: str | os.PathLike[str]) -> "ChromeTrace":
        with open(path, encoding="utf-8") as fh:
            return cls(json.load(fh))

    @staticmethod
    def ns(us: float) -> int:
        return round(us * 1000)

    def interval(self, ev: dict[str, Any]) -> tuple[int, int]:
        b = self.ns(ev["ts"])
        return b, b + self.ns(ev["dur"])

    def tracks(self) -> dict[tuple[int, int], list[dict[str, Any]]]:
        out: dict[tuple[int, int], list[dict[str, Any]]] = {}
        for e in self.slices:
            out.setdefault((e["pid"], e["tid"]), []).append(e)
        return out

    def track_names(self) -> dict[tuple[int, int], str]:
        return {(e["pid"], e["tid"]): e["args"]["name"] for e in self.events
                if e.get("ph") == "M" and e.get("name") == "thread_name"}

    def process_names(self) -> dict[int, str]:
        return {e["pid"]: e["args"]["name"] for e in self.events
                if e.get("ph") == "M" and e.get("name") == "process_name"}

    def placements(self) -> dict[int, dict[str, dict[str, Any]]]:
        """span id -> {"host": slice, "device": slice (when it has one)}."""
        out: dict[int, dict[str, dict[str, Any]]] = {}
        for e in self.slices:
            where = "host" if e["pid"] == self.host_pid else "device"
            out.setdefault(e["args"]["span"], {})[where] = e
        return out

    def misnested(self) -> list[tuple[dict[str, Any], dict[str, Any]]]:
        """Pairs of slices on one track that overlap without one containing the other."""
        bad = []
        for evs in self.tracks().values():
            ivs = sorted(((*self.interval(e), e) for e in evs), key=lambda t: (t[0], -t[1]))
            stack: list[tuple[int, int, dict[str, Any]]] = []
            for b, end, e in ivs:
                while stack and stack[-1][1] <= b:
                    stack.pop()
                if stack and end > stack[-1][1]:
                    bad.append((stack[-1][2], e))
                stack.append((b, end, e))
        return bad

    def children_outside_parents(self) -> list[str]:
        """Each span must lie inside its parent on the host track, and inside its nearest
        ancestor placed on the same device track on that track."""
        spans = self.placements()
        problems = []
        for sid, pl in spans.items():
            host = pl["host"]
            parent = host["args"]["parent"]
            if parent and parent in spans:
                pb, pe = self.interval(spans[parent]["host"])
                cb, ce = self.interval(host)
                if not (pb <= cb and ce <= pe):
                    problems.append(f"host: span {sid} [{cb},{ce}] outside parent {parent} [{pb},{pe}]")
            dev = pl.get("device")
            if dev is None:
                continue
            anc = parent
            while anc and anc in spans:
                adev = spans[anc].get("device")
                if adev is not None and (adev["pid"], adev["tid"]) == (dev["pid"], dev["tid"]):
                    ab, ae = self.interval(adev)
                    cb, ce = self.interval(dev)
                    if not (ab <= cb and ce <= ae):
                        problems.append(f"device: span {sid} [{cb},{ce}] outside ancestor {anc} [{ab},{ae}]")
                    break
                anc = spans[anc]["host"]["args"]["parent"]
        return problems


@pytest.fixture(scope="session")
def chrome() -> type[ChromeTrace]:
    """``chrome.read(path)`` -> ChromeTrace with nesting checks."""
    return ChromeTrace


def file_packets(data: bytes) -> list[tuple[int, list[bytes]]]:
    """A .pftrace's own top-level packets, as (end offset in the file, the packets it holds): one for a plain
    packet, the inflated ones for a ``compressed_packets`` packet (read with zlib, as trace processor reads it)."""
    import zlib

    from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

    out = []
    pos = 0
    while pos < len(data):
        size = shift = 0
        start = pos + 1
        while True:
            b = data[start]
            start += 1
            size |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                break
        end = start + size
        if end > len(data):
            break
        p = pb.TracePacket.FromString(data[start:end])
        inner = [q.SerializeToString() for q in pb.Trace.FromString(zlib.decompress(p.compressed_packets)).packet] \
            if p.HasField("compressed_packets") else [data[start:end]]
        out.append((end, inner))
        pos = end
    return out
