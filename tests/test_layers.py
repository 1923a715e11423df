"""The package's layering: imports run one way, down the layers, and no module imports itself back.

Every import counts, also those inside functions and under ``TYPE_CHECKING``: a cycle that only
type checkers see still ties two modules together for a reader.
"""
from __future__ import annotations

import ast
import re
import os
import subprocess
import sys
from pathlib import Path

import cltrace

ROOT = Path(cltrace.__file__).parent

# Lowest first. A module may import its own package and any package of a lower rank.
LAYERS = ["timeline", "record", "export", "read", "analyzers", "merge", "store", "capture", "programs", "tune", "cli"]
BASE = {"cltrace.errors", "cltrace._state", "cltrace._version", "cltrace._native"}  # importable from anywhere
FACADE = {"cltrace", "cltrace.__main__"}  # the public facade may import anything
TOP_LEVEL_ALLOWED = {"__init__.py", "__main__.py", "errors.py", "_state.py", "_version.py", "_native.py"}


def _modules() -> dict[str, Path]:
    out = {}
    for p in ROOT.rglob("*.py"):
        parts = ("cltrace",) + p.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    is_pkg = path.name == "__init__.py"
    here = name.split(".") if is_pkg else name.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[: len(here) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            targets = [f"{mod}.{a.name}" if f"{mod}.{a.name}" in modules else mod for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in modules:  # "cltrace.export.chrome.X" -> the module that defines X
                t = t.rpartition(".")[0]
            if t and t != name:
                found.add(t)
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def _layer(mod: str) -> int | None:
    parts = mod.split(".")
    return LAYERS.index(parts[1]) if len(parts) > 1 and parts[1] in LAYERS else None


def test_no_import_cycles_between_modules() -> None:
    graph = _graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    cycles: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    sys.setrecursionlimit(10_000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    assert not cycles, f"import cycles: {cycles}"


def test_no_module_imports_a_higher_layer() -> None:
    bad = []
    for mod, deps in _graph().items():
        if mod in FACADE:
            continue
        mine = _layer(mod)
        assert mine is not None or mod in BASE, f"{mod} is in no layer: put it in one of {LAYERS}"
        for dep in deps:
            if dep in BASE:
                continue
            theirs = _layer(dep)
            if theirs is None or (mine is not None and theirs > mine) or mine is None:
                bad.append(f"{mod} -> {dep}")
    assert not bad, "imports against the layering " + f"{LAYERS} (lowest first): {sorted(bad)}"


def test_only_a_handful_of_modules_at_the_top_level() -> None:
    top = {p.name for p in ROOT.glob("*.py")}
    assert top <= TOP_LEVEL_ALLOWED, f"move into a layer package: {sorted(top - TOP_LEVEL_ALLOWED)}"
    for pkg in LAYERS:
        doc = ast.get_docstring(ast.parse((ROOT / pkg / "__init__.py").read_text()))
        assert doc and "import" in doc.lower(), f"cltrace/{pkg}/__init__.py must say what the layer does and may import"


def test_import_cltrace_loads_neither_opentelemetry_nor_perfetto() -> None:
    code = ("import sys, cltrace; "
            "print(sorted({m.split('.')[0] for m in sys.modules if m.split('.')[0] in ('opentelemetry', 'perfetto', 'google')}))")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CLTRACE", "OTEL_"))}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
LOADERS = {"import_module", "__import__", "run_path", "run_module", "spec_from_file_location"}


def _names_loaded(path: Path) -> set[str]:
    """The top-level names a script imports, also inside functions, and the string literals it hands to
    a loader (importlib, runpy); a relative import counts as its dotted name."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            found.add((node.module or "").split(".")[0] if not node.level else "." * node.level + (node.module or ""))
            if node.level:
                found.update(a.name for a in node.names)
        elif isinstance(node, ast.Call):
            fn = node.func
            name = fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", "")
            if name in LOADERS:
                found.update(Path(a.value).stem for a in node.args
                             if isinstance(a, ast.Constant) and isinstance(a.value, str))
    return found


def test_no_benchmark_imports_another() -> None:
    """Each file in benchmarks/ reads alone: what two share is copied, not imported (the test helper
    ``tests/otlp_collector.py`` is not a benchmark)."""
    scripts = sorted(BENCHMARKS.glob("*.py"))
    assert len(scripts) > 5, f"no benchmarks found in {BENCHMARKS}"
    stems = {p.stem for p in scripts}
    bad = [f"{p.name} -> {n}" for p in scripts for n in sorted(_names_loaded(p) & stems - {p.stem})]
    bad += [f"{p.name} -> {n}" for p in scripts for n in sorted(_names_loaded(p)) if n.startswith(".")]
    assert not bad, f"benchmarks importing other benchmarks (copy what they share instead): {bad}"


# ---- the C files of the one native module (cltrace._ext) --------------------------------------------
_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
_DECL = re.compile(r"^(?!static|typedef|extern|#|\s)[\w\s\*]*?\b(\w+)\s*\([^;{]*\)\s*;", re.M)


def _c_units() -> dict[Path, set[Path]]:
    """Each .c/.h file under the package and the files it includes (quoted includes, resolved beside it)."""
    files = sorted([*ROOT.rglob("*.c"), *ROOT.rglob("*.h")])
    return {f: {(f.parent / inc).resolve() for inc in _INCLUDE.findall(f.read_text())} for f in files}


def test_no_c_file_includes_another_c_file() -> None:
    bad = [f"{f.relative_to(ROOT)} includes {i.name}" for f, incs in _c_units().items() for i in incs if i.suffix == ".c"]
    assert not bad, f"compile .c files apart (setup.py lists them) and share through a header: {bad}"


def test_a_header_s_functions_are_defined_in_the_c_file_of_its_name() -> None:
    """So an #include names the file whose code it calls: the include graph below is the call graph too."""
    bad = []
    for h in ROOT.rglob("*.h"):
        for fn in _DECL.findall(h.read_text()):
            c = h.with_suffix(".c")
            if not c.exists() or not re.search(rf"^{fn}\(", c.read_text(), re.M):
                bad.append(f"{h.relative_to(ROOT)}: {fn}")
    assert not bad, f"declared in a header, defined elsewhere: {bad}"


def test_no_circle_between_c_files() -> None:
    """Between the stems (x.c with its x.h): who includes whose header, one way only."""
    units = _c_units()
    graph: dict[str, set[str]] = {}
    for f, incs in units.items():
        me = str(f.with_suffix("").relative_to(ROOT))
        graph.setdefault(me, set()).update(str(i.with_suffix("").relative_to(ROOT)) for i in incs
                                           if i.with_suffix("") != f.with_suffix("") and i.parent.is_relative_to(ROOT))
    seen: dict[str, int] = {}  # 1 on the path, 2 done

    def visit(v: str, path: list[str]) -> None:
        seen[v] = 1
        for w in sorted(graph.get(v, ())):
            assert seen.get(w) != 1, f"a circle between C files: {' -> '.join(path + [v, w])}"
            if w not in seen:
                visit(w, path + [v])
        seen[v] = 2

    for v in sorted(graph):
        if v not in seen:
            visit(v, [])
