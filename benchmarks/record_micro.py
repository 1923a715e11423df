"""CPU ns per call of the traced launch's pieces, each alone in a loop (best of 7): where a traced launch's
extra time goes.

    python benchmarks/record_micro.py
"""
import time, sys
import pyopencl as cl
import cltrace
from cltrace.record import regions
from cltrace.record.recorder import RECORDER
from cltrace import _state
SRC = "__kernel void k(__global float *x) { x[get_global_id(0)] += 1.0f; }"
q = cltrace.profiling_queue()
prg = cl.Program(q.context, SRC).build()
buf = cl.Buffer(q.context, cl.mem_flags.READ_WRITE, 4 * 1024)
k = cl.Kernel(prg, "k")
ev = cltrace.launch(k, q, (1024,), None, buf); q.finish()
rec = regions.record_launch
n = 20000
RECORDER.configure(resolve_interval_s=3600, max_pending=1<<22)
cltrace.start()
def t(label, fn):
    best = 1e9
    for _ in range(7):
        RECORDER.pending.clear()
        t0 = time.thread_time(); fn(); best = min(best, time.thread_time() - t0)
    print(f"{label:40s} {best / n * 1e9:7.0f} ns")
def host_only():
    for _ in range(n): rec("k", None, None, 0, 1, "kernel", None, None)
def with_event():
    for _ in range(n): rec("k", q, ev, 0, 1, "kernel", None, None)
def int_ptr():
    for _ in range(n): ev.int_ptr
def empty():
    for _ in range(n): pass
evs = [cltrace.launch(k, q, (1024,), None, buf) for _ in range(n)]; q.finish()
def fresh_events():
    for e in evs: rec("k", q, e, 0, 1, "kernel", None, None)
def untr():
    _state.ENABLED = False
    for _ in range(n): cltrace.launch(k, q, (1024,), None, buf)
    q.finish(); _state.ENABLED = True
def tr():
    for _ in range(n): cltrace.launch(k, q, (1024,), None, buf)
    q.finish()
def raw():
    for _ in range(n): k(q, (1024,), None, buf)
    q.finish()
for label, fn in [("empty loop", empty), ("ev.int_ptr", int_ptr), ("record host-only", host_only), ("record same event", with_event),
                  ("record distinct events", fresh_events), ("raw k(q,...)", raw), ("cltrace.launch untraced", untr), ("cltrace.launch traced", tr)]:
    t(label, fn)
cltrace.stop()
cltrace.start()
def raw_kw():
    for _ in range(n): k(q, (1024,), None, buf, wait_for=None)
    q.finish()
def raw2():
    for _ in range(n): k(q, (1024,), None, buf)
    q.finish()
for label, fn in [("raw k(q,...)", raw2), ("raw k(q,..., wait_for=None)", raw_kw), ("cltrace.launch untraced", untr), ("raw k(q,...)", raw2)]:
    t(label, fn)
cltrace.stop()
