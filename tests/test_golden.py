"""Golden outputs: two traces of ``cltrace demo``, kept in ``tests/golden/`` (``cltrace demo`` rewrites
``traces/``), merged into Chrome JSON and into .pftrace give exactly the bytes kept beside them (gzipped), on
the native path and on the fallback (``CLTRACE_NATIVE=0``; CI runs both). A .pftrace is compared with its
compressed packets expanded (``read.inflate``): isal and zlib pack the same packets into different bytes.

What they hold: the readers of both formats, the merge (tracks, names, clock alignment) and both writers,
byte for byte. A refactor that changes any of it fails here with the first line that differs; a
change of output that is meant regenerates them (``python tests/test_golden.py``) in the same commit, so
the diff of the goldens shows what changed.
"""
from __future__ import annotations

import gzip
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

GOLDEN = Path(__file__).resolve().parent / "golden"
CASES = {  # golden <- input
    "demo-json-merged.json.gz": "demo.json.gz", "demo-pftrace-merged.json.gz": "demo.pftrace",
    "demo-json-merged.pftrace.gz": "demo.json.gz", "demo-pftrace-merged.pftrace.gz": "demo.pftrace",
}


def merged(source: str, work: Path, out: str) -> bytes:
    """``cltrace merge`` of the input ``source`` (unpacked into ``work``, where it runs: the merge records the
    path it was given) into ``out``: its bytes, a .pftrace's compressed packets expanded."""
    from cltrace.read.inflate import expand

    name = source.removesuffix(".gz")
    data = (GOLDEN / source).read_bytes()
    (work / name).write_bytes(gzip.decompress(data) if source.endswith(".gz") else data)
    subprocess.run([sys.executable, "-m", "cltrace", "merge", name, "-o", out], check=True,
                   capture_output=True, timeout=300, cwd=work)
    got = (work / out).read_bytes()
    return expand(got).data if out.endswith(".pftrace") else got


def output_of(golden: str) -> str:
    return "merged" + Path(golden.removesuffix(".gz")).suffix


def first_difference(got: bytes, want: bytes) -> str:
    if b"\n" not in want[:4096]:  # packets: the first differing byte
        at = next((i for i, (g, w) in enumerate(zip(got, want)) if g != w), min(len(got), len(want)))
        return f"byte {at} of {len(got)} against {len(want)}: got {got[at:at + 32]!r}, want {want[at:at + 32]!r}"
    for i, (g, w) in enumerate(zip(got.splitlines(), want.splitlines()), 1):
        if g != w:
            return f"line {i}:\n  got  {g[:300]!r}\n  want {w[:300]!r}"
    return f"lengths differ: {len(got.splitlines())} lines against {len(want.splitlines())}"


@pytest.mark.parametrize("golden", sorted(CASES))
def test_a_demo_trace_merges_into_its_golden_bytes(golden: str, tmp_path: Path) -> None:
    got = merged(CASES[golden], tmp_path, output_of(golden))
    want = gzip.decompress((GOLDEN / golden).read_bytes())
    assert got == want, f"{golden}: {first_difference(got, want)} (meant? python tests/test_golden.py)"


@pytest.mark.parametrize("golden", sorted(CASES))
def test_perfettos_trace_processor_imports_each_golden_without_error_or_loss(golden: str, tmp_path: Path) -> None:
    """The bytes held as right are also what Perfetto's engine (the UI's) reads cleanly: no stat of severity
    error or data_loss, and the demo's slices all there."""
    from perfetto.trace_processor import TraceProcessor, TraceProcessorConfig

    from conftest import trace_processor_shell

    shell = trace_processor_shell()
    if shell is None:
        pytest.skip("no trace processor: set CLTRACE_TRACE_PROCESSOR, or put one at ../shared/tools/")
    path = tmp_path / golden.removesuffix(".gz")
    path.write_bytes(gzip.decompress((GOLDEN / golden).read_bytes()))
    with TraceProcessor(trace=str(path), config=TraceProcessorConfig(bin_path=shell)) as tp:
        bad = [(r.name, r.idx, r.value) for r in tp.query(
            "select name, idx, value from stats where severity in ('error', 'data_loss') and value > 0")]
        slices = next(iter(tp.query("select count(*) as n from slice"))).n
    assert bad == [], f"{golden}: {bad}"
    assert slices > 1000, golden


if __name__ == "__main__":  # regenerate the goldens from the code as it is
    import tempfile

    for name, source in sorted(CASES.items()):
        work = Path(tempfile.mkdtemp())
        try:
            data = merged(source, work, output_of(name))
        finally:
            shutil.rmtree(work)
        (GOLDEN / name).write_bytes(gzip.compress(data, 9, mtime=0))
        print(f"{name}: {len(data):,} bytes from {source}")
