"""cltrace.copy: a recorded, non-blocking enqueue_copy."""
from __future__ import annotations

import numpy as np
import pyopencl as cl

import cltrace
from cltrace.record.recorder import RECORDER


def test_copy_records_a_transfer_span_with_bytes_and_device_time(queue):
    host = np.arange(4096, dtype=np.float32)
    buf = cl.Buffer(queue.context, cl.mem_flags.READ_WRITE, host.nbytes)
    back = np.empty_like(host)
    with cltrace.trace():
        with cltrace.region("io", queue):
            cltrace.copy(queue, buf, host, "h2d")
            ev = cltrace.copy(queue, back, buf)
    ev.wait()
    assert (back == host).all()
    spans = {s.name: s for s in RECORDER.spans()}
    for name, way in (("h2d", "HtoD"), ("copy", "DtoH")):
        s = spans[name]
        assert s.cat == "transfer" and s.attrs == {"bytes": host.nbytes, "direction": way}
        assert s.source == "device" and s.path == ("io", name)


def test_copy_with_tracing_off_records_nothing(queue):
    host = np.ones(64, dtype=np.float32)
    buf = cl.Buffer(queue.context, cl.mem_flags.READ_WRITE, host.nbytes)
    cltrace.copy(queue, buf, host, is_blocking=True)
    assert RECORDER.spans() == []


def test_copy_between_buffers_traced_and_untraced(queue):
    host = np.arange(256, dtype=np.float32)
    a = cl.Buffer(queue.context, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR, hostbuf=host)
    b = cl.Buffer(queue.context, cl.mem_flags.READ_WRITE, host.nbytes)
    c = cl.Buffer(queue.context, cl.mem_flags.READ_WRITE, host.nbytes)
    cltrace.copy(queue, b, a)  # off: a buffer-to-buffer copy takes no is_blocking
    with cltrace.trace():
        cltrace.copy(queue, c, b, "d2d")
    out = np.empty_like(host)
    cl.enqueue_copy(queue, out, c)
    assert (out == host).all()
    (s,) = [s for s in RECORDER.spans() if s.name == "d2d"]
    assert s.cat == "transfer" and s.source == "device" and s.attrs == {"bytes": host.nbytes, "direction": "DtoD"}
