"""The .json and the .pftrace of one run show the same process/track tree, named for users.

Read as Perfetto's trace processor reads them: Chrome JSON processes and threads by pid/tid
and their ``process_name``/``thread_name`` metadata; Perfetto track descriptors by their
process/thread descriptors and parent uuids. Where Perfetto's trace processor is available
(``CLTRACE_TRACE_PROCESSOR``, or ``../shared/tools/trace_processor_shell`` beside the repository), both files
are also loaded into it: its tables give the same tree, and it reports no import error or data loss.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from typing import Any

import pytest
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

from cltrace.read.perfetto import iter_packets

from conftest import trace_processor_shell  # noqa: E402  (tests/ is on sys.path under pytest)

Tree = dict[tuple[int, str], set[str]]  # (pid, process name) -> names of its slice-bearing tracks


@pytest.fixture(scope="module")
def run_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str, str]:
    """Both formats of one run of a script (``python3 train.py --epochs 2``), and its stderr."""
    d = tmp_path_factory.mktemp("tree")
    script = d / "train.py"
    script.write_text(textwrap.dedent("""
        import threading
        import numpy as np
        import pyopencl as cl
        import cltrace
        q = cltrace.profiling_queue()
        buf = cl.Buffer(q.context, cl.mem_flags.READ_WRITE, 4096)
        src = "__kernel void k(__global float *a) { a[get_global_id(0)] += 1.0f; }"
        prg = cl.Program(q.context, src).build()
        def work(name):
            with cltrace.region(name, q):
                prg.k(q, (1024,), None, buf)
                cl.enqueue_copy(q, np.empty(1024, np.float32), buf)
        cltrace.start("run.json", "run.pftrace")
        cltrace.compile(src, context=q.context)
        work("main")
        t = threading.Thread(target=work, args=("worker",), name="loader")
        t.start(); t.join()
        q.finish()
        cltrace.stop()
    """))
    p = subprocess.run([sys.executable, "train.py", "--epochs", "2"], cwd=d, capture_output=True, text=True,
                       timeout=120, env={k: v for k, v in os.environ.items() if not k.startswith("CLTRACE")})
    assert p.returncode == 0, p.stderr
    return str(d / "run.json"), str(d / "run.pftrace"), p.stderr


def json_tree(path: str) -> Tree:
    with open(path) as fh:
        events = json.load(fh)
    procs = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e["name"] == "process_name"}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
               if e.get("ph") == "M" and e["name"] == "thread_name"}
    tree: Tree = {}
    for e in events:
        if e.get("ph") == "X":
            tree.setdefault((e["pid"], procs[e["pid"]]), set()).add(threads[(e["pid"], e["tid"])])
    return tree


def pftrace_tree(path: str) -> Tree:
    with open(path, "rb") as fh:
        data = fh.read()
    descs: dict[int, Any] = {}
    seq_uuid: dict[int, int] = {}
    sliced: set[int] = set()
    for _, raw in iter_packets(data):
        p = pb.TracePacket.FromString(raw)
        if p.HasField("track_descriptor"):
            descs[p.track_descriptor.uuid] = p.track_descriptor
        if p.HasField("trace_packet_defaults"):
            seq_uuid[p.trusted_packet_sequence_id] = p.trace_packet_defaults.track_event_defaults.track_uuid
        if p.HasField("track_event") and p.track_event.type == pb.TrackEvent.TYPE_SLICE_BEGIN:
            te = p.track_event
            sliced.add(te.track_uuid if te.HasField("track_uuid") else seq_uuid[p.trusted_packet_sequence_id])
    procs = {d.process.pid: (u, d.process.process_name) for u, d in descs.items() if d.HasField("process")}
    by_uuid = {u: pid for pid, (u, _) in procs.items()}
    tree: Tree = {}
    for uuid in sliced:
        d = descs[uuid]
        if d.HasField("thread"):  # a thread track belongs to the process of its pid
            pid, name = d.thread.pid, d.thread.thread_name
            assert not d.HasField("parent_uuid")
        else:  # a named track must hang under a process, never be a global track
            assert d.parent_uuid in by_uuid, f"track {d.name!r} is outside every process"
            pid, name = by_uuid[d.parent_uuid], d.name
        tree.setdefault((pid, procs[pid][1]), set()).add(name)
    return tree


def test_both_formats_show_the_same_tree(run_files: tuple[str, str, str]) -> None:
    js, pf, _ = run_files
    jt, pt = json_tree(js), pftrace_tree(pf)
    assert jt == pt
    names = {name: children for (_, name), children in jt.items()}
    host = [n for n in names if not n.startswith("OpenCL: ")]
    assert len(host) == 1 and host[0].endswith(" train.py --epochs 2")  # as `ps` shows the program
    assert host[0].split()[0].startswith("python")
    assert names[host[0]] >= {"MainThread", "loader", "OpenCL compile"}
    (device,) = [n for n in names if n.startswith("OpenCL: ")]
    assert len(names[device]) == 2  # the queue, as used by each of the two threads
    assert all(" · queue 0" in t for t in names[device])


def trace_processor_tree(path: str, shell: str) -> Tree:
    from perfetto.trace_processor import TraceProcessor, TraceProcessorConfig

    with TraceProcessor(trace=path, config=TraceProcessorConfig(bin_path=shell)) as tp:
        rows = tp.query("""
            select p.pid as pid, p.name as process, coalesce(t.name, tr.name) as track
            from slice s join track tr on s.track_id = tr.id
            left join thread_track tt on tt.id = tr.id left join thread t on t.utid = tt.utid
            left join process_track pt on pt.id = tr.id
            join process p on p.upid = coalesce(t.upid, pt.upid)
            where s.name != 'cltrace.metadata'  -- the run's metadata instant, on the process track: no user's work
            group by 1, 2, 3""")
        tree: Tree = {}
        for r in rows:
            tree.setdefault((r.pid, r.process), set()).add(r.track)
        return tree


def _shell() -> str:
    shell = trace_processor_shell()
    if shell is None:
        pytest.skip("no trace processor: set CLTRACE_TRACE_PROCESSOR to a trace_processor_shell binary, or put one "
                    "at ../shared/tools/ (the descriptor check above runs everywhere)")
    return shell


def test_trace_processor_shows_the_same_tree(run_files: tuple[str, str, str]) -> None:
    shell = _shell()
    js, pf, _ = run_files
    assert trace_processor_tree(js, shell) == trace_processor_tree(pf, shell) == json_tree(js)


def test_trace_processor_imports_both_without_error_or_loss(run_files: tuple[str, str, str]) -> None:
    from perfetto.trace_processor import TraceProcessor, TraceProcessorConfig

    shell = _shell()
    for path in run_files[:2]:
        with TraceProcessor(trace=path, config=TraceProcessorConfig(bin_path=shell)) as tp:
            bad = [(r.name, r.idx, r.value) for r in tp.query(
                "select name, idx, value from stats where severity in ('error', 'data_loss') and value > 0")]
            slices = next(iter(tp.query("select count(*) as n from slice"))).n
        assert bad == [], f"{os.path.basename(path)}: {bad}"
        assert slices >= 6, path  # regions, kernels and copies of both threads, compile
