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
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(_HERE)))  # beside the cltrace package


def _start(finished: str) -> bool:
    """``finished``: the watched module that has just run. True once the child is started (or cannot be)."""
    pkg = sys.modules.get("cltrace")
    if finished != "cltrace" and pkg is not None and getattr(getattr(pkg, "__spec__", None), "_initializing", False):
        return False  # pyopencl imported by cltrace itself: start when cltrace is complete
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
    return True


def _hook_module():
    """``_cltrace_hook`` (beside the package), loaded from its file: the child's sys.path is left as it is."""
    hook = sys.modules.get("_cltrace_hook")
    if hook is None:
        spec = importlib.util.spec_from_file_location("_cltrace_hook", os.path.join(_ROOT, "_cltrace_hook.py"))
        hook = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(hook)
    return hook


if os.environ.get("CLTRACE_FAMILY"):
    try:
        _hook_module().watch(("pyopencl", "cltrace"), _start)
    except Exception as exc:  # (a package installed without its hook module)
        sys.stderr.write(f"cltrace: child {os.getpid()}: not traced: {type(exc).__name__}: {exc}\n")


def _chain() -> None:
    """Run the sitecustomize this one shadows (the next on sys.path), as Python would have."""
    spec = importlib.machinery.PathFinder.find_spec(
        "sitecustomize", [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE])
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


_chain()
