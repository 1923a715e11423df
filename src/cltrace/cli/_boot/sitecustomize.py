"""Started in every Python child of ``cltrace run`` (this folder is first on their PYTHONPATH).

Costs nothing until the child imports pyopencl or cltrace: then tracing starts into the child's
own files (``cltrace.capture.children.start_child``) and pyopencl is instrumented, as ``cltrace
run`` does for the script itself. The sitecustomize this one shadows, if any, runs after it.
Whatever goes wrong costs the child its trace, with one warning line, never its run.
"""
import importlib.machinery
import importlib.util
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
_WATCHED = ("pyopencl", "cltrace")
_started = False


def _start(finished: str) -> None:
    """``finished``: the watched module that has just run."""
    global _started
    if _started:
        return
    pkg = sys.modules.get("cltrace")
    if finished != "cltrace" and pkg is not None and getattr(getattr(pkg, "__spec__", None), "_initializing", False):
        return  # pyopencl imported by cltrace itself: start when cltrace is complete
    _started = True
    try:
        sys.meta_path.remove(_FINDER)
    except ValueError:
        pass
    try:
        try:
            import cltrace.capture.children  # noqa: F401
        except ImportError:
            import json

            root = json.loads(os.environ.get("CLTRACE_FAMILY", "{}")).get("package_root")
            if not root or root in sys.path:
                raise
            sys.path.append(root)
        from cltrace.capture.children import start_child
        from cltrace.capture.instrument import instrument

        if start_child():
            instrument()
    except Exception as exc:
        sys.stderr.write(f"cltrace: child {os.getpid()}: not traced: {type(exc).__name__}: {exc}\n")


class _Finder:
    """Finds pyopencl and cltrace as usual, then starts tracing once one of them has run."""

    def find_spec(self, name, path=None, target=None):
        if name not in _WATCHED or _started:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        run = getattr(loader, "exec_module", None)
        if run is None:
            return spec

        def exec_module(module, _run=run):
            _run(module)
            _start(name)

        loader.exec_module = exec_module  # this module's own loader object: nothing else is touched
        return spec


_FINDER = _Finder()
if os.environ.get("CLTRACE_FAMILY"):
    sys.meta_path.insert(0, _FINDER)


def _chain() -> None:
    """Run the sitecustomize this one shadows (the next on sys.path), as Python would have."""
    spec = importlib.machinery.PathFinder.find_spec(
        "sitecustomize", [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE])
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


_chain()
