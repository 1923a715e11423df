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
    for name in ("h2d", "copy"):
        s = spans[name]
        assert s.cat == "transfer" and s.attrs == {"bytes": host.nbytes}
        assert s.source == "device" and s.path == ("io", name)


def test_copy_with_tracing_off_records_nothing(queue):
    host = np.ones(64, dtype=np.float32)
    buf = cl.Buffer(queue.context, cl.mem_flags.READ_WRITE, host.nbytes)
    cltrace.copy(queue, buf, host, is_blocking=True)
    assert RECORDER.spans() == []
