"""The core install works alone and each extra's feature names its extra.

Each test runs cltrace in a subprocess whose imports of the extras' modules really fail: a
``sys.meta_path`` finder raises ModuleNotFoundError for them, as a venv without the extra does (no
mock of cltrace). ``.ci/bare-venv.sh`` checks the same in a real venv holding only the core
(``pip install .``); it takes about 40 s, so it runs by hand, not here.
"""
from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import cltrace

# The top-level modules of the [otlp], [plot] and [clickhouse] extras and of the test tools.
EXTRA_MODULES = ("grpc", "opentelemetry.exporter", "opentelemetry.proto", "google.rpc", "requests",
                 "matplotlib", "chdb", "clickhouse_connect", "mako", "pocl_binary_distribution")

BLOCKER = textwrap.dedent(f"""
    import sys
    BLOCKED = {EXTRA_MODULES!r}

    class NotInstalled:
        def find_spec(self, name, path=None, target=None):
            if any(name == b or name.startswith(b + ".") for b in BLOCKED):
                raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
            return None

    sys.meta_path.insert(0, NotInstalled())
""")


def _python(code: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter where the extras are not installed."""
    full = {**os.environ, "CLTRACE_NO_BROWSER": "1", **(env or {})}
    for var in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "CLTRACE_STORE"):
        if env is None or var not in env:
            full.pop(var, None)
    return subprocess.run([sys.executable, "-c", BLOCKER + textwrap.dedent(code)], cwd=cwd, env=full,
                          capture_output=True, text=True, timeout=120)


def _cli(args: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return _python(f"""
        from cltrace.cli import main
        code = main({args!r})
        leaked = sorted(m for m in sys.modules if any(m == b or m.startswith(b + ".") for b in BLOCKED))
        assert not leaked, leaked
        sys.exit(code)
    """, cwd, env)


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A demo run's traces, written where no extra is installed."""
    d = tmp_path_factory.mktemp("core")
    r = _cli(["demo", "--steps", "4", "--format", "json,pftrace", "--out", "t"], d)
    assert r.returncode == 0, r.stderr
    return d


def _one_line_error(r: subprocess.CompletedProcess[str], feature: str, extra: str) -> None:
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert r.stderr == f"cltrace: error: {feature} needs the [{extra}] extra: pip install 'cltrace[{extra}]'\n"


def test_demo_and_summary_of_json_and_pftrace_need_no_extra(demo: Path) -> None:
    assert (demo / "t" / "demo.json").stat().st_size > 0 and (demo / "t" / "demo.pftrace").stat().st_size > 0
    for name in ("demo.pftrace", "demo.json"):
        r = _cli(["summary", f"t/{name}"], demo)
        assert r.returncode == 0, r.stderr
        assert "spans:" in r.stdout and "step" in r.stdout
    r = _cli(["analyze", "t/demo.pftrace", "--json"], demo)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["wall"]["wall_ns"] > 0


def test_otlp_flag_names_the_otlp_extra(demo: Path) -> None:
    for protocol in ("grpc", "http/protobuf"):
        r = _cli(["demo", "--steps", "2", "--out", "t2", "--otlp", "http://127.0.0.1:4318",
                  "--otlp-protocol", protocol], demo)
        _one_line_error(r, "--otlp", "otlp")
    r = _cli(["demo", "--steps", "2", "--out", "t2"], demo, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"})
    _one_line_error(r, "OTEL_EXPORTER_OTLP_ENDPOINT (OTLP export)", "otlp")
    assert not (demo / "t2").exists()  # stopped before the run, not after it
    (demo / "hello.py").write_text("print('ran')\n")
    r = _cli(["run", "--otlp", "http://127.0.0.1:4318", "hello.py"], demo)
    _one_line_error(r, "--otlp", "otlp")
    assert "ran" not in r.stdout


def test_plot_names_the_plot_extra_before_the_report(demo: Path) -> None:
    r = _cli(["analyze", "t/demo.pftrace", "--plot", "p.png"], demo)
    _one_line_error(r, "--plot", "plot")
    assert r.stdout == "" and not (demo / "p.png").exists()
    _one_line_error(_cli(["tune", "--plot", "sweep.png"], demo), "--plot", "plot")  # before the sweep


def test_store_names_the_clickhouse_extra_and_makes_no_folder(demo: Path) -> None:
    _one_line_error(_cli(["load", "t/demo.pftrace", "--store", "st"], demo), "the store", "clickhouse")
    assert not (demo / "st").exists()
    _one_line_error(_cli(["analyze", "--store", "http://127.0.0.1:1"], demo), "the store", "clickhouse")


def test_library_raises_one_line_import_errors(demo: Path) -> None:
    r = _python("""
        import cltrace
        from cltrace.errors import CltraceError
        from cltrace.store import Store
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

        for make in (lambda: cltrace.OtlpSink(endpoint="http://127.0.0.1:4318"), lambda: Store("st")):
            try:
                make()
            except ImportError as exc:
                assert isinstance(exc, CltraceError) and isinstance(exc, cltrace.MissingExtraError), type(exc)
                print(exc)
        sink = cltrace.OtlpSink(exporter=InMemorySpanExporter())  # a user's exporter needs only the SDK
        print(type(sink).__name__)
    """, demo)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [
        "OTLP export needs the [otlp] extra: pip install 'cltrace[otlp]'",
        "the store needs the [clickhouse] extra: pip install 'cltrace[clickhouse]'",
        "OtlpSink",
    ]


def test_cltrace_env_with_otlp_variables_warns_and_traces_on(tmp_path: Path) -> None:
    out = tmp_path / "env.json"
    r = _python("""
        import numpy as np
        import pyopencl as cl
        ctx = cl.create_some_context(interactive=False)
        q = cl.CommandQueue(ctx)
        buf = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, 1024)
        cl.enqueue_fill_buffer(q, buf, np.float32(0), 0, 1024)
        q.finish()
        print("ran")
    """, tmp_path, {"CLTRACE": "1", "CLTRACE_OUT": str(out), "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"})
    assert r.returncode == 0, r.stderr
    assert r.stdout == "ran\n"
    warnings = [line for line in r.stderr.splitlines() if "[otlp]" in line]
    assert warnings == ["cltrace: OTLP export from OTEL_EXPORTER_OTLP_* is off: "
                        "OTLP export needs the [otlp] extra: pip install 'cltrace[otlp]'"], r.stderr
    assert "fill" in [e.get("name") for e in json.loads(out.read_text())], "the fill is traced"


# Where the extras' modules may be imported: each place turns their absence into the one line.
IMPORTERS = {"export/otlp/transport.py", "analyzers/plot.py", "cli/checks.py", "tune/chart.py", "store/connect.py"}


def test_extras_are_imported_only_where_their_absence_is_named() -> None:
    root = Path(cltrace.__file__).parent
    found = set()
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            if any(n == b or n.startswith(b + ".") for n in names for b in EXTRA_MODULES):
                found.add(path.relative_to(root).as_posix())
    assert found == IMPORTERS
    for rel in IMPORTERS:
        assert "ExtraError(" in (root / rel).read_text(), rel
