"""Golden outputs: two traces of ``cltrace demo``, kept in ``tests/golden/`` (``cltrace demo`` rewrites
``traces/``), merged into Chrome JSON give exactly the bytes kept beside them (gzipped), on the native
path and on the fallback (``CLTRACE_NATIVE=0``; CI runs both).

What they hold: the readers of both formats, the merge (tracks, names, clock alignment) and the Chrome
writer, byte for byte. A refactor that changes any of it fails here with the first line that differs; a
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
CASES = {"demo-json-merged.json.gz": "demo.json.gz", "demo-pftrace-merged.json.gz": "demo.pftrace"}  # golden <- input


def merged(source: str, work: Path) -> bytes:
    """``cltrace merge`` of the input ``source`` (unpacked into ``work``, where it runs: the merge records the
    path it was given), the merged file's bytes."""
    name = source.removesuffix(".gz")
    data = (GOLDEN / source).read_bytes()
    (work / name).write_bytes(gzip.decompress(data) if source.endswith(".gz") else data)
    subprocess.run([sys.executable, "-m", "cltrace", "merge", name, "-o", "merged.json"], check=True,
                   capture_output=True, timeout=300, cwd=work)
    return (work / "merged.json").read_bytes()


def first_difference(got: bytes, want: bytes) -> str:
    for i, (g, w) in enumerate(zip(got.splitlines(), want.splitlines()), 1):
        if g != w:
            return f"line {i}:\n  got  {g[:300]!r}\n  want {w[:300]!r}"
    return f"lengths differ: {len(got.splitlines())} lines against {len(want.splitlines())}"


@pytest.mark.parametrize("golden", sorted(CASES))
def test_a_demo_trace_merges_into_its_golden_bytes(golden: str, tmp_path: Path) -> None:
    got = merged(CASES[golden], tmp_path)
    want = gzip.decompress((GOLDEN / golden).read_bytes())
    assert got == want, f"{golden}: {first_difference(got, want)} (meant? python tests/test_golden.py)"


if __name__ == "__main__":  # regenerate the goldens from the code as it is
    import tempfile

    for name, source in sorted(CASES.items()):
        work = Path(tempfile.mkdtemp())
        try:
            data = merged(source, work)
        finally:
            shutil.rmtree(work)
        (GOLDEN / name).write_bytes(gzip.compress(data, 9, mtime=0))
        print(f"{name}: {len(data):,} bytes from {source}")
