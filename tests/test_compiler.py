"""cltrace.compile and the program cache on real OpenCL (PoCL): cache hits and misses and their
spans, build failures, corrupt disk entries, tuned configurations, and the Kernel launch forms."""
from __future__ import annotations

import hashlib
import json
import os
from typing import Any

import numpy as np
import pyopencl as cl
import pytest

import cltrace
from cltrace.programs import tunedb
from cltrace.programs.compiler import ProgramCache, default_cache, default_queue, device_key
from cltrace.errors import CltraceError
from cltrace.record.recorder import RECORDER
from cltrace.timeline.tracks import COMPILE

SOURCE = """
#ifndef SCALE
#define SCALE 1
#endif
__kernel void scale(__global float *a) { a[get_global_id(0)] *= SCALE; }
__kernel void add(__global float *a, __global const float *b) {
    int i = get_global_id(0);
    a[i] += b[i];
}
__kernel void lsize(__global int *out) { out[get_global_id(0)] = (int)get_local_size(0); }
"""
N = 256


@pytest.fixture(autouse=True)
def cache_dir(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test gets empty caches (program binaries and the tune DB) under tmp_path."""
    d = str(tmp_path / "cache")
    monkeypatch.setenv("CLTRACE_CACHE_DIR", d)
    default_cache().clear()
    return d


def buffers(ctx: Any, queue: Any, *arrays: np.ndarray) -> list[Any]:
    mf = cl.mem_flags
    return [cl.Buffer(ctx, mf.READ_WRITE | mf.COPY_HOST_PTR, hostbuf=a) for a in arrays]


def read(queue: Any, buf: Any, n: int = N, dtype: Any = np.float32) -> np.ndarray:
    out = np.empty(n, dtype)
    cl.enqueue_copy(queue, out, buf)
    return out


def compile_spans() -> list[cltrace.Span]:
    return [s for s in RECORDER.spans() if s.cat in ("compile", "build")]


def test_miss_memory_disk_hits_and_their_spans(cl_ctx: Any, tmp_path: Any) -> None:
    cache = ProgramCache(tmp_path / "programs")
    with cltrace.trace():
        miss = cltrace.compile(SOURCE, "-cl-fast-relaxed-math", context=cl_ctx, cache=cache)
        mem = cltrace.compile(SOURCE, "-cl-fast-relaxed-math", context=cl_ctx, cache=cache)
        disk = cltrace.compile(SOURCE, ["-cl-fast-relaxed-math"], context=cl_ctx,
                               cache=ProgramCache(tmp_path / "programs"))
    assert (miss.cache_hit, miss.from_cache) == ("miss", False)
    assert (mem.cache_hit, mem.from_cache) == ("memory", True)
    assert (disk.cache_hit, disk.from_cache) == ("disk", True)
    assert mem.program is miss.program
    src_hash = hashlib.sha256(SOURCE.encode()).hexdigest()
    for p in (miss, mem, disk):
        assert p.source_hash == src_hash
        assert p.options == ("-cl-fast-relaxed-math",)
        assert p.device_key == device_key(cl_ctx.devices[0])
        assert p.binary_size > 0 and p.compile_ns > 0 and p.tuned is None
    assert miss.binary_size == disk.binary_size

    spans = compile_spans()
    tracks = {RECORDER.tracks.get(s.thread).kind for s in spans}
    assert tracks == {COMPILE}, "compile/build spans belong on the compile track"
    assert all(s.source == "host" and s.status == "ok" for s in spans)
    tops = [s for s in spans if s.name == "compile scale,add,lsize"]
    assert [t.attrs["cache"] for t in tops] == ["miss", "memory", "disk"]
    by_parent: dict[int, dict[str, cltrace.Span]] = {}
    for s in spans:
        by_parent.setdefault(s.parent, {})[s.name] = s
    for top, prog in zip(tops, (miss, mem, disk)):
        a = top.attrs
        assert a["source_hash"] == src_hash and a["options"] == "-cl-fast-relaxed-math"
        assert a["binary_size"] == prog.binary_size and a["duration_ns"] == prog.compile_ns
        assert a["from_cache"] is prog.from_cache
        assert top.host_ns == prog.compile_ns
        kids = by_parent[top.id]
        assert kids["cache lookup"].attrs["cache"] == a["cache"]
        for k in kids.values():
            assert top.host_begin <= k.host_begin <= k.host_end <= top.host_end
            assert k.path == (top.name, k.name)
    miss_kids = by_parent[tops[0].id]
    assert set(miss_kids) == {"cache lookup", "clBuildProgram", "cache store"}
    assert miss_kids["clBuildProgram"].cat == "build"
    assert miss_kids["clBuildProgram"].attrs["binary_size"] == miss.binary_size
    assert set(by_parent[tops[1].id]) == {"cache lookup"}
    assert set(by_parent[tops[2].id]) == {"cache lookup", "load binary"}
    assert by_parent[tops[2].id]["load binary"].cat == "build"


def test_disk_entry_is_checksummed_and_keyed(cl_ctx: Any, tmp_path: Any) -> None:
    cache = ProgramCache(tmp_path / "programs")
    prg = cltrace.compile(SOURCE, context=cl_ctx, cache=cache)
    key = cache.entry_key(prg.source_hash, prg.options, prg.device_key)
    data = open(cache.path(key), "rb").read()
    magic, header, binary = data.split(b"\n", 2)
    head = json.loads(header)
    assert head["size"] == len(binary) == prg.binary_size
    assert head["sha256"] == hashlib.sha256(binary).hexdigest()
    assert (head["source_hash"], head["device_key"]) == (prg.source_hash, prg.device_key)
    assert not [f for f in os.listdir(os.path.dirname(cache.path(key))) if f.endswith(".tmp")]
    # Options and device are part of the key: different options never hit this entry.
    other = cltrace.compile(SOURCE, defines={"SCALE": 3}, context=cl_ctx, cache=cache)
    assert other.cache_hit == "miss"


def test_defines_are_sorted_options_and_take_effect(cl_ctx: Any, queue: Any) -> None:
    prg = cltrace.compile(SOURCE, ["-cl-mad-enable"], context=cl_ctx, defines={"SCALE": 3, "A_FLAG": None})
    assert prg.options == ("-cl-mad-enable", "-DA_FLAG", "-DSCALE=3")
    (a,) = buffers(cl_ctx, queue, np.full(N, 2, np.float32))
    prg.scale[N, None, queue](a)
    assert np.all(read(queue, a) == 6)
    with pytest.raises(ValueError, match="C identifier"):
        cltrace.compile(SOURCE, context=cl_ctx, defines={"not valid": 1})


BROKEN = "__kernel void broken(__global float *a) { a[0] = cltrace_undefined_symbol; }"


def test_build_failure_raises_with_log_and_leaves_failed_span(cl_ctx: Any, tmp_path: Any) -> None:
    cache = ProgramCache(tmp_path / "programs")
    with cltrace.trace():
        with cltrace.region("setup"):
            with pytest.raises(cltrace.BuildError) as info:
                cltrace.compile(BROKEN, "-DX=1", context=cl_ctx, cache=cache)
    err = info.value
    assert isinstance(err, CltraceError)
    assert "cltrace_undefined_symbol" in err.build_log
    assert err.build_log in str(err) and "-DX=1" in str(err)
    spans = compile_spans()
    top = next(s for s in spans if s.name == "compile broken")
    build = next(s for s in spans if s.name == "clBuildProgram")
    assert top.status == build.status == "error"
    assert "cltrace_undefined_symbol" in build.attrs["build_log"]
    assert build.parent == top.id
    region = next(s for s in RECORDER.spans() if s.name == "setup")
    assert top.parent == region.id and top.path == ("setup", "compile broken")
    assert not os.path.exists(cache.directory) or not any(
        f.endswith(".clbin") for _, _, fs in os.walk(cache.directory) for f in fs)


def _corrupt_truncate(data: bytes) -> bytes:
    return data[: len(data) // 2]


def _corrupt_flip(data: bytes) -> bytes:
    i = len(data) - 100
    return data[:i] + bytes([data[i] ^ 0xFF]) + data[i + 1:]


def _corrupt_header(data: bytes) -> bytes:
    magic, header, binary = data.split(b"\n", 2)
    return magic + b"\n" + header[:-7] + b"\n" + binary


def _corrupt_key(data: bytes) -> bytes:
    magic, header, binary = data.split(b"\n", 2)
    head = json.loads(header)
    head["device_key"] = "some|other|device"
    return magic + b"\n" + json.dumps(head).encode() + b"\n" + binary


def _garbage(data: bytes) -> bytes:
    return os.urandom(len(data))


@pytest.mark.parametrize("corrupt", [_corrupt_truncate, _corrupt_flip, _corrupt_header, _corrupt_key,
                                     _garbage, lambda d: b""])
def test_corrupt_disk_entry_is_removed_and_rebuilt(cl_ctx: Any, queue: Any, tmp_path: Any, corrupt: Any) -> None:
    directory = tmp_path / "programs"
    prg = cltrace.compile(SOURCE, context=cl_ctx, cache=ProgramCache(directory))
    path = ProgramCache(directory).path(ProgramCache.entry_key(prg.source_hash, prg.options, prg.device_key))
    good = open(path, "rb").read()
    with open(path, "wb") as fh:
        fh.write(corrupt(good))
    with cltrace.trace():
        again = cltrace.compile(SOURCE, context=cl_ctx, cache=ProgramCache(directory))
    assert again.cache_hit == "miss"
    lookup = next(s for s in compile_spans() if s.name == "cache lookup")
    assert lookup.attrs["cache"] == "miss" and "corrupt" in lookup.attrs["cache.corrupt"]
    a, b = buffers(cl_ctx, queue, np.ones(N, np.float32), np.full(N, 2, np.float32))
    again.add[N, None, queue](a, b)
    assert np.all(read(queue, a) == 3)
    # The rebuilt entry is whole again: a fresh cache loads it from disk.
    assert open(path, "rb").read() == good
    assert cltrace.compile(SOURCE, context=cl_ctx, cache=ProgramCache(directory)).cache_hit == "disk"


def test_tuned_config_sets_defines_and_default_local_size(cl_ctx: Any, queue: Any) -> None:
    dev_key = device_key(cl_ctx.devices[0])
    src_hash = tunedb.source_hash(SOURCE)
    tunedb.store(src_hash, ("-DSCALE=2",), dev_key, {"defines": {"SCALE": 5, "TILE": 4}, "local_size": [16]})
    plain = cltrace.compile(SOURCE, context=cl_ctx)
    assert plain.tuned is None and plain.lsize.tuned_local_size is None
    prg = cltrace.compile(SOURCE, context=cl_ctx, defines={"SCALE": 2})
    assert prg.tuned == {"defines": {"SCALE": 5, "TILE": 4}, "local_size": [16]}
    assert prg.options == ("-DSCALE=2", "-DTILE=4"), "options given by the caller win over tuned defines"
    out = cl.Buffer(cl_ctx, cl.mem_flags.READ_WRITE, 4 * N)
    prg.lsize[N, None, queue](out)
    assert np.all(read(queue, out, dtype=np.int32) == 16)
    prg.lsize(queue, (N,), None, out)
    assert np.all(read(queue, out, dtype=np.int32) == 16)
    prg.lsize[N, 32, queue](out)
    assert np.all(read(queue, out, dtype=np.int32) == 32), "an explicit local size wins"
    (a,) = buffers(cl_ctx, queue, np.ones(N, np.float32))
    prg.scale[N, None, queue](a)
    assert np.all(read(queue, a) == 2)


def test_bad_tuned_config_is_ignored(cl_ctx: Any) -> None:
    dev_key = device_key(cl_ctx.devices[0])
    tunedb.store(tunedb.source_hash(SOURCE), (), dev_key, {"defines": {"X": 1}, "local_size": "wide"})
    prg = cltrace.compile(SOURCE, context=cl_ctx)
    assert prg.tuned is None and prg.options == ()


def test_pyopencl_form_while_tracing(cl_ctx: Any, queue: Any, tmp_path: Any) -> None:
    """``knl(queue, gs, ls, *args)`` traced: sizes as tuples or lists (not kept), ``wait_for`` and ``profile``
    passed on, each launch one span on the device."""
    prg = cltrace.compile(SOURCE, context=cl_ctx)
    a, b = buffers(cl_ctx, queue, np.zeros(N, np.float32), np.ones(N, np.float32))
    cltrace.start(str(tmp_path / "t.json"), quiet=True)
    try:
        ev = prg.add(queue, (N,), None, a, b)
        ev = prg.add(queue, [N], None, a, b, wait_for=[ev])
        p = cltrace.LaunchProfile()
        prg.add(queue, [N], [64], a, b, wait_for=[ev], profile=p).wait()
        assert p.kernel_ns > 0
    finally:
        cltrace.stop()
    assert np.all(read(queue, a) == 3)
    assert sum(1 for s in RECORDER.spans() if s.name == "add" and s.dev_start is not None) == 3


def test_kernel_launch_forms(cl_ctx: Any, queue: Any) -> None:
    prg = cltrace.compile(SOURCE, context=cl_ctx)
    assert prg.kernel("add") is prg.add
    assert sorted(prg.kernel_names) == ["add", "lsize", "scale"]
    a, b = buffers(cl_ctx, queue, np.zeros(N, np.float32), np.ones(N, np.float32))
    ev = prg.add[N, 64, queue](a, b)
    assert isinstance(ev, cl.Event)
    ev = prg.add[(N,), (64,), queue](a, b, wait_for=[ev])
    prg.add(queue, (N,), None, a, b, wait_for=[ev])
    assert np.all(read(queue, a) == 3)
    # Queue omitted: the program context's default profiling queue.
    dq = default_queue(prg.context)
    assert dq is default_queue(cl_ctx) and dq.properties & cl.command_queue_properties.PROFILING_ENABLE
    prg.add[N, None](a, b).wait()
    assert np.all(read(queue, a) == 4)
    with pytest.raises(TypeError, match="knl\\[global_size, local_size"):
        prg.add[N]
    with pytest.raises(AttributeError, match="no kernel 'nope'"):
        prg.nope
    with pytest.raises(LookupError):
        prg.kernel("nope")


def test_default_context_and_queue_are_shared() -> None:
    prg = cltrace.compile(SOURCE)
    assert prg.device.int_ptr == cltrace.default_device().int_ptr
    assert cltrace.compile(SOURCE).context is prg.context
    q = default_queue()
    assert q is default_queue(prg.context)


def test_traced_launches_record_kernel_spans(cl_ctx: Any, queue: Any, plain_queue: Any) -> None:
    prg = cltrace.compile(SOURCE, context=cl_ctx)
    a, b = buffers(cl_ctx, queue, np.zeros(N, np.float32), np.ones(N, np.float32))
    with cltrace.trace():
        prg.add[N, 64, queue](a, b)
        prg.add(queue, (N,), None, b, a)  # arguments swapped: bound again before the enqueue
        prg.add[N, 64, queue](a, b)
        queue.finish()
        prg.add[N, 64, plain_queue](a, b).wait()
    kernels = [s for s in RECORDER.spans() if s.cat == "kernel"]
    assert [s.name for s in kernels] == ["add"] * 4
    dev, host_only = kernels[:3], kernels[3]
    for s in dev:
        assert s.source == "device" and s.device_ns > 0
        assert s.attrs["program"] == prg.source_hash and s.attrs["from_cache"] is False
        assert s.attrs["global_size"] == [N]
    assert dev[0].attrs["local_size"] == [64] and dev[1].attrs["local_size"] is None
    assert host_only.source == "host"
    assert host_only.attrs["cltrace.device_time"].startswith("unavailable: queue without PROFILING_ENABLE")
    # a = 0 + 1 = 1; b = 1 + 1 = 2; a = 1 + 2 = 3; a = 3 + 2 = 5
    assert np.all(read(queue, a) == 5) and np.all(read(queue, b) == 2)


def test_changed_scalar_arguments_are_bound_again(cl_ctx: Any, queue: Any) -> None:
    src = "__kernel void put(__global float *a, const float v) { a[get_global_id(0)] = v; }"
    prg = cltrace.compile(src, context=cl_ctx)
    (a,) = buffers(cl_ctx, queue, np.zeros(N, np.float32))
    p = cltrace.LaunchProfile()
    for v in (1.5, 1.5, -0.0, 0.0, -0.0, 2.5, float("nan")):
        prg.put[N, None, queue](a, np.float32(v), profile=p)
        got = read(queue, a)
        if np.isnan(v):
            assert np.all(np.isnan(got))
        else:
            assert np.all(got == v) and np.all(np.signbit(got) == np.signbit(v))


MIXED = """__kernel void mixed(const int m, __global float *a, const float f, __local float *tmp, __global float *b,
                      const int k) {
    int g = get_global_id(0); tmp[get_local_id(0)] = f; a[g] = m * tmp[get_local_id(0)] + k; b[g] = f;
}"""


@pytest.mark.parametrize("traced", [False, True])
def test_numpy_scalars_take_the_buffer_setter_with_pyopencls_results_and_errors(cl_ctx: Any, queue: Any,
                                                                                tmp_path: Any, traced: bool) -> None:
    """A kernel launched with numpy scalars sets them through ``_set_arg_buf_multi`` (pyopencl's generic setter
    tries each as every kind of OpenCL object first: 6-9 us a scalar); every launch computes what pyopencl's own
    kernel computes, and a position that stops holding a scalar gets exactly pyopencl's error."""
    prg = cltrace.compile(MIXED, context=cl_ctx)
    own = cl.Kernel(cl.Program(cl_ctx, MIXED).build(), "mixed")
    a, b, a2, b2 = buffers(cl_ctx, queue, *(np.zeros(N, np.float32) for _ in range(4)))
    loc = cl.LocalMemory(4 * 64)
    if traced:
        cltrace.start(str(tmp_path / "t.json"), quiet=True)
    try:
        calls = [(np.int32(3), np.float32(2.0), np.int32(1)), (np.int32(4), np.float32(-0.5), np.int32(0)),
                 (np.int32(-2), np.float32(1.5), np.int32(7))]
        for form, (m, f, k) in zip(("call", "subscript", "call"), calls):
            if form == "call":
                prg.mixed(queue, (N,), (64,), m, a, f, loc, b, k)
            else:
                prg.mixed[N, 64, queue](m, a, f, loc, b, k)
            own(queue, (N,), (64,), m, a2, f, loc, b2, k)
            assert np.array_equal(read(queue, a), read(queue, a2)) and np.array_equal(read(queue, b), read(queue, b2))
            assert prg.mixed._setargs is not None
        for bad in (None, np.float64(2.0), 3):  # no bytes, the wrong size, a Python int: pyopencl's own error
            with pytest.raises(cl.Error) as ours:
                prg.mixed(queue, (N,), (64,), bad, a, np.float32(1.0), loc, b, np.int32(0))
            with pytest.raises(cl.Error) as theirs:
                own(queue, (N,), (64,), bad, a2, np.float32(1.0), loc, b2, np.int32(0))
            assert str(theirs.value).split(" - ")[0] in str(ours.value) and "kernel 'mixed'" in str(ours.value)
        prg.mixed(queue, (N,), (64,), np.int32(5), a, np.float32(1.0), loc, b, np.int32(1))  # scalars again
        assert np.all(read(queue, a) == 6)
    finally:
        if traced:
            cltrace.stop()
    if traced:
        ours = [s for s in RECORDER.spans() if s.name == "mixed" and s.attrs.get("program") == prg.source_hash]
        assert len(ours) == 4 and all(s.status == "ok" and s.dev_start is not None for s in ours)
        failed = [s for s in RECORDER.spans() if s.name == "mixed" and s.status == "error"]
        assert len(failed) == 3 and all("INVALID" in (s.error or "") for s in failed)  # one a refused launch


def test_binary_the_driver_rejects_is_removed_and_rebuilt(cl_ctx: Any, queue: Any, tmp_path: Any) -> None:
    cache = ProgramCache(tmp_path / "programs")
    dev_key = device_key(cl_ctx.devices[0])
    src_hash = tunedb.source_hash(SOURCE)
    key = cache.entry_key(src_hash, (), dev_key)
    cache.store(key, src_hash, (), dev_key, b"garbage" * 10)  # checksum fine, not a program binary
    with cltrace.trace():
        prg = cltrace.compile(SOURCE, context=cl_ctx, cache=cache)
    assert prg.cache_hit == "miss"
    spans = {s.name: s for s in compile_spans()}
    assert spans["cache lookup"].attrs["cache"] == "disk"
    assert spans["load binary"].status == "error" and "rejected" in spans["load binary"].error
    assert spans["clBuildProgram"].status == "ok" and "cache store" in spans
    a, b = buffers(cl_ctx, queue, np.ones(N, np.float32), np.ones(N, np.float32))
    prg.add[N, None, queue](a, b)
    assert np.all(read(queue, a) == 2)
    assert cltrace.compile(SOURCE, context=cl_ctx, cache=ProgramCache(cache.directory)).cache_hit == "disk"
