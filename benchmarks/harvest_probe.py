"""Who should read the stamps, and when: what reading a command's four profiling stamps (and releasing
its event) costs a launch loop, depending on the thread that does it and the moment. Raw pyopencl
enqueues of a tiny kernel, no cltrace in the loop; side by side in one run (median of rounds, ns a
launch, ratio to the untraced loop of the same mode).

``--finish-every 1`` (default; 50 launches + ``finish`` an iteration):
  kept / inline/finish / inline/lagged   events kept to the end; read by the launching thread right
                 after ``finish``; read by it every 16 launches, those of 16-32 launches ago
  python thread / native thread          a Python thread reads each batch after ``finish`` (GIL
                 released while reading); the reaper's tickets (a native thread reads and releases)
``--finish-every N`` (N > 1: a ``finish`` every N iterations):
  flush/k, status newest/k               ``flush``, or the newest event's status, every k launches
  lag L [xB], lag 1024 END, ...          the launching thread reads (all four stamps, or END only, or
                 after a wait / a status query) the events of L launches ago, B at a time
  after finish   the launching thread reads everything since the last ``finish`` right after it
  thread, lag 1024 / native thread       another thread reads them (Python, lagged; the reaper)
``--finish-every 0`` (one ``finish`` at the end, as bench_pipeline's end-to-end loop):
  cpu thread     a thread hashing buffers beside the loop (CPU work and GIL hand-offs, no driver call)
  thread lag L read/release/keep         a Python thread reads and/or releases events L launches old
  keep N / status / flush / clear        the loop keeps its newest N events (or all, and asks the
                 newest's status, flushes, or drops all of them every so many launches)

    python benchmarks/harvest_probe.py [--launches 50000] [--rounds 3] [--finish-every 1]
"""
from __future__ import annotations

import argparse
import collections
import ctypes
import queue as queue_mod
import statistics
import sys
import threading
import time

import numpy as np
import pyopencl as cl

import cltrace  # noqa: F401  (loads the native stamps reader)
from cltrace._ext import stamps as _stamps
from cltrace.timeline import stamps

SRC = "__kernel void k(__global float *x) { x[get_global_id(0)] += 1.0f; }"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--launches", type=int, default=50_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--finish-every", type=int, default=1,
                    help="finish every N iterations of 50 launches (past 1: the lag/flush/status variants; 0: one "
                         "finish at the end, events held in different numbers)")
    a = ap.parse_args()
    ctx = cl.create_some_context(interactive=False)
    q = cl.CommandQueue(ctx, properties=cl.command_queue_properties.PROFILING_ENABLE)
    buf = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, 4 * 1024)
    k = cl.Kernel(cl.Program(ctx, SRC).build(), "k")
    k.set_args(buf)
    enqueue = cl.enqueue_nd_range_kernel
    iters = a.launches // 50
    read_counts = collections.Counter()
    inside: collections.Counter = collections.Counter()  # seconds inside reads, by variant
    inside_n: collections.Counter = collections.Counter()
    during: collections.Counter = collections.Counter()  # events read while the loop ran (threads)
    yield_after: list = []  # what a variant leaves to read after its timed loop
    loop_only: list = []  # a variant's own timing of its loop (without joining its thread)

    def read(evs: list) -> None:
        hs = stamps.handles(evs)
        status, _ = stamps.read(hs)
        read_counts["read"] += int((status == 0).sum())

    lib = ctypes.CDLL(stamps.opencl_library())
    gpi = lib.clGetEventProfilingInfo
    gpi.argtypes = [ctypes.c_void_p, ctypes.c_uint, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_void_p]
    value = ctypes.c_uint64()
    ref = ctypes.byref(value)

    def reader(params: tuple):
        """Some of the four stamps, one ctypes call each (0x1280 QUEUED .. 0x1283 END)."""
        def f(evs: list) -> None:
            for ev in evs:
                h = ev.int_ptr
                for p in params:
                    gpi(h, p, 8, ref, None)
        return f

    def untraced() -> None:
        for _ in range(iters):
            for _ in range(50):
                enqueue(q, k, (1024,), None)
            q.finish()

    def kept() -> None:
        held = []
        for _ in range(iters):
            for _ in range(50):
                held.append(enqueue(q, k, (1024,), None))
            q.finish()
        yield_after.append(held)

    def inline_finish() -> None:
        for _ in range(iters):
            evs = [enqueue(q, k, (1024,), None) for _ in range(50)]
            q.finish()
            read(evs)

    def inline_lagged() -> None:
        window: collections.deque = collections.deque()
        n = 0
        for _ in range(iters):
            for _ in range(50):
                window.append(enqueue(q, k, (1024,), None))
                n += 1
                if n % 16 == 0 and len(window) >= 32:
                    read([window.popleft() for _ in range(16)])
            q.finish()
        read(list(window))

    def python_thread() -> None:
        inbox: queue_mod.SimpleQueue = queue_mod.SimpleQueue()

        def reader() -> None:
            while True:
                evs = inbox.get()
                if evs is None:
                    return
                read(evs)

        t = threading.Thread(target=reader, daemon=True)
        t.start()
        t0 = time.perf_counter()
        for _ in range(iters):
            evs = [enqueue(q, k, (1024,), None) for _ in range(50)]
            q.finish()
            inbox.put(evs)
        loop_only.append(time.perf_counter() - t0)
        inbox.put(None)
        t.join()

    def native_thread() -> None:
        if stamps.REAPER is None:
            return
        ts = np.empty(50 * iters, np.uint64)
        track = _stamps.track
        j = 0
        for _ in range(iters):
            for _ in range(50):
                ts[j] = track(enqueue(q, k, (1024,), None))
                j += 1
            q.finish()
        yield_after.append(ts)

    def lag(n_lag: int, every: int = 16, how=None, tag: str = ""):
        how = how or read
        def loop() -> None:
            window: collections.deque = collections.deque()
            for i in range(iters):
                for j in range(50):
                    window.append(enqueue(q, k, (1024,), None))
                    if len(window) >= n_lag + every:
                        t = time.perf_counter()
                        how([window.popleft() for _ in range(every)])
                        inside[tag] += time.perf_counter() - t
                        inside_n[tag] += every
                if i % a.finish_every == a.finish_every - 1:
                    q.finish()
            q.finish()
            read(list(window))
        return loop

    def wait_read(evs: list) -> None:
        stamps.wait(stamps.handles(evs))
        read(evs)

    def status_read(evs: list) -> None:
        for ev in evs:
            ev.command_execution_status
        read(evs)

    def after_finish() -> None:
        since: list = []
        for i in range(iters):
            for j in range(50):
                since.append(enqueue(q, k, (1024,), None))
            if i % a.finish_every == a.finish_every - 1:
                q.finish()
                t = time.perf_counter()
                read(since)
                inside["after finish"] += time.perf_counter() - t
                inside_n["after finish"] += len(since)
                since = []
        q.finish()
        read(since)

    def thread_lagged() -> None:
        inbox: queue_mod.SimpleQueue = queue_mod.SimpleQueue()

        def reader_thread() -> None:
            while True:
                evs = inbox.get()
                if evs is None:
                    return
                t = time.perf_counter()
                read(evs)
                inside["thread, lag 1024"] += time.perf_counter() - t
                inside_n["thread, lag 1024"] += len(evs)

        th = threading.Thread(target=reader_thread, daemon=True)
        th.start()
        window: collections.deque = collections.deque()
        t0 = time.perf_counter()
        for i in range(iters):
            for j in range(50):
                window.append(enqueue(q, k, (1024,), None))
            if len(window) >= 1024 + 50:
                inbox.put([window.popleft() for _ in range(50)])
            if i % a.finish_every == a.finish_every - 1:
                q.finish()
        q.finish()
        loop_only.append(time.perf_counter() - t0)
        during["thread, lag 1024"] += inside_n["thread, lag 1024"]
        inbox.put(list(window))
        inbox.put(None)
        th.join()

    def native_sparse() -> None:
        """The reaper's tickets, ``finish`` every ``--finish-every`` iterations."""
        ts = np.empty(50 * iters, np.uint64)
        track = _stamps.track
        j = 0
        before = stamps.reaper_stats()["reaped"]
        t0 = time.perf_counter()
        for i in range(iters):
            for _ in range(50):
                ts[j] = track(enqueue(q, k, (1024,), None))
                j += 1
            if i % a.finish_every == a.finish_every - 1:
                q.finish()
        q.finish()
        loop_only.append(time.perf_counter() - t0)
        during["native thread"] += stamps.reaper_stats()["reaped"] - before
        yield_after.append(ts)

    def flush_every(n: int):
        def loop() -> None:
            for i in range(iters):
                for j in range(50):
                    enqueue(q, k, (1024,), None)
                    if j % n == n - 1:
                        q.flush()
                if i % a.finish_every == a.finish_every - 1:
                    q.finish()
            q.finish()
        return loop

    def newest_status(every: int):
        def loop() -> None:
            for i in range(iters):
                for j in range(50):
                    ev = enqueue(q, k, (1024,), None)
                    if j % every == every - 1:
                        ev.command_execution_status
                if i % a.finish_every == a.finish_every - 1:
                    q.finish()
            q.finish()
        return loop

    def sparse_finish() -> None:
        for i in range(iters):
            for j in range(50):
                enqueue(q, k, (1024,), None)
            if i % a.finish_every == a.finish_every - 1:
                q.finish()
        q.finish()

    def held_loop(keep: int | None, status_every: int = 0, flush_every_n: int = 0, clear_every: int = 0):
        """One ``finish`` at the end, as bench_pipeline's end-to-end loop; keep the newest ``keep`` events
        (None: all), ask the newest's status / flush every N launches, drop all held every N."""
        def loop() -> None:
            held: collections.deque = collections.deque(maxlen=keep)
            ap = held.append
            for i in range(a.launches):
                ev = enqueue(q, k, (1024,), None)
                ap(ev)
                if status_every and i % status_every == 0:
                    ev.command_execution_status
                if flush_every_n and i % flush_every_n == 0:
                    q.flush()
                if clear_every and i % clear_every == 0:
                    held.clear()
            q.finish()
        return loop

    def no_finish() -> None:
        for _ in range(a.launches):
            enqueue(q, k, (1024,), None)
        q.finish()

    def thread_e2e(n_lag: int, do_read: bool, do_release: bool):
        """One ``finish`` at the end; a Python thread gets the events ``n_lag`` launches old in batches
        of 256 and reads their stamps and/or drops them (else keeps them to the end)."""
        def loop() -> None:
            inbox: queue_mod.SimpleQueue = queue_mod.SimpleQueue()
            keep: list = []

            def worker() -> None:
                while True:
                    evs = inbox.get()
                    if evs is None:
                        return
                    if do_read:
                        read(evs)
                    if not do_release:
                        keep.extend(evs)

            th = threading.Thread(target=worker, daemon=True)
            th.start()
            window: collections.deque = collections.deque()
            t0 = time.perf_counter()
            for i in range(a.launches):
                window.append(enqueue(q, k, (1024,), None))
                if len(window) >= n_lag + 256:
                    inbox.put([window.popleft() for _ in range(256)])
            q.finish()
            loop_only.append(time.perf_counter() - t0)
            inbox.put(None)
            th.join()
        return loop

    def cpu_thread(chunk: int):
        """One ``finish`` at the end; beside the loop, a thread hashes ``chunk``-byte buffers over and
        over (the GIL released while hashing, taken back between calls): CPU work and GIL hand-offs,
        no driver call."""
        def loop() -> None:
            import hashlib
            stop = threading.Event()
            data = bytes(chunk)
            calls = [0]

            def work() -> None:
                while not stop.is_set():
                    hashlib.sha256(data).digest()
                    calls[0] += 1

            th = threading.Thread(target=work, daemon=True)
            th.start()
            t0 = time.perf_counter()
            for _ in range(a.launches):
                enqueue(q, k, (1024,), None)
            q.finish()
            loop_only.append(time.perf_counter() - t0)
            stop.set()
            th.join()
            during[f"cpu thread, {chunk >> 10} KiB calls"] += calls[0]
        return loop

    if a.finish_every == 0:
        variants = {"untraced": no_finish, "cpu thread, 16 KiB calls": cpu_thread(16 << 10),
                    "cpu thread, 1024 KiB calls": cpu_thread(1 << 20), "thread lag 1024 read+release": thread_e2e(1024, True, True),
                    "thread lag 1024 release": thread_e2e(1024, False, True),
                    "thread lag 1024 read, keep": thread_e2e(1024, True, False),
                    "thread lag 16384 read+release": thread_e2e(16384, True, True),
                    "thread lag 0 read+release": thread_e2e(0, True, True)}
        run(variants, a, q, read, yield_after, loop_only, inside, inside_n, during)
        variants = {"untraced": no_finish, "keep all": held_loop(None), "keep 1024": held_loop(1024),
                    "keep 16384": held_loop(16384), "keep all, status/50": held_loop(None, status_every=50),
                    "keep all, flush/50": held_loop(None, flush_every_n=50),
                    "keep all, clear/5000": held_loop(None, clear_every=5000),
                    "keep all, clear/20000": held_loop(None, clear_every=20000)}
        run(variants, a, q, read, yield_after, loop_only, inside, inside_n, during)
        return
    if a.finish_every > 1:
        variants = {"untraced": sparse_finish, "flush/16": flush_every(16), "flush/50": flush_every(50),
                    "status newest/16": newest_status(16), "status newest/50": newest_status(50)}
        for n_lag in (16, 1024):
            variants[f"lag {n_lag}"] = lag(n_lag, tag=f"lag {n_lag}")
        variants["lag 1024 x256"] = lag(1024, 256, tag="lag 1024 x256")
        variants["lag 1024 END"] = lag(1024, how=reader((0x1283,)), tag="lag 1024 END")
        variants["lag 1024 wait+read"] = lag(1024, how=wait_read, tag="lag 1024 wait+read")
        variants["lag 1024 status+read"] = lag(1024, how=status_read, tag="lag 1024 status+read")
        variants["after finish"] = after_finish
        variants["thread, lag 1024"] = thread_lagged
        if stamps.REAPER is not None:
            variants["native thread"] = native_sparse
        run(variants, a, q, read, yield_after, loop_only, inside, inside_n, during)
        return
    variants = {"untraced": untraced, "kept": kept, "inline/finish": inline_finish,
                "inline/lagged": inline_lagged, "python thread": python_thread, "native thread": native_thread}
    run(variants, a, q, read, yield_after, loop_only, inside, inside_n, during)


def run(variants: dict, a, q, read, yield_after: list, loop_only: list, inside=None, inside_n=None, during=None) -> None:
    times: dict[str, list[float]] = {n: [] for n in variants}
    variants["untraced"]()
    for _ in range(a.rounds):
        for name, fn in variants.items():
            yield_after.clear()
            loop_only.clear()
            t0 = time.perf_counter()
            fn()
            dt = time.perf_counter() - t0
            times[name].append(loop_only[0] if loop_only else dt)
            for held in yield_after:  # untimed: the stamps of kept events, the tickets' slots
                if isinstance(held, np.ndarray):
                    stamps.wait_tickets(held)
                    stamps.done(held)
                else:
                    read(held)
    base = statistics.median(times["untraced"])
    print(f"device: {q.device.name.strip()}; python {sys.version.split()[0]}; {a.launches} launches a round")
    print(f"{'variant':24} {'ns/launch':>10} {'ratio':>7} {'ns inside a read':>17} {'read during loop':>17}")
    for name, ts in times.items():
        if stamps.REAPER is None and name == "native thread":
            continue
        m = statistics.median(ts)
        per = f"{inside[name] / inside_n[name] * 1e9:17.0f}" if inside and inside_n[name] else ""
        per = per or " " * 17
        if name.startswith("cpu thread"):
            share = f"{during[name] / (a.launches * a.rounds):14.2f} calls/launch"
        else:
            share = f"{during[name] / (a.launches * a.rounds):17.0%}" if during and name in during else ""
        print(f"{name:24} {m / a.launches * 1e9:10.0f} {m / base:7.3f} {per} {share}")


if __name__ == "__main__":
    main()
