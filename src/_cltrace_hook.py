"""``CLTRACE=1 python train.py``: tracing an unmodified program switched on from its environment.

``cltrace.pth``, installed beside the ``cltrace`` package, runs one line when any interpreter of
the environment starts::

    import os; os.environ.get("CLTRACE", "").strip().lower() in ("1", "true", "yes", "on") and ...

so an interpreter without ``CLTRACE`` (or with ``CLTRACE=0``) pays one dictionary lookup and imports
nothing. With it set,
``from_env`` watches the imports: once the program has imported pyopencl, it imports ``cltrace``,
whose import starts tracing from the environment and instruments pyopencl as ``cltrace run`` does
(``cltrace.cli.from_env``). A program that never imports pyopencl (pip, a test runner's helpers)
loads nothing of cltrace and writes nothing.

This module is top-level, beside the package, because importing ``cltrace`` imports pyopencl and
numpy, which no interpreter start should pay; it imports only ``os`` and ``sys``. ``watch`` is also
how the Python children of ``cltrace run`` start tracing (``cltrace/cli/_boot/sitecustomize.py``).
"""
import os
import sys

_TRUE = ("1", "true", "yes", "on")


class _Watcher:
    """A meta-path finder: finds the watched modules as the others would, then calls
    ``on_loaded(name)`` after one of them has run, until ``on_loaded`` returns True."""

    def __init__(self, names, on_loaded):
        self.names = tuple(names)
        self.on_loaded = on_loaded
        self.done = False
        self._busy = False  # asking the other finders (one may be another watcher), or in on_loaded

    def find_spec(self, name, path=None, target=None):
        if self.done or self._busy or name not in self.names:
            return None
        self._busy = True
        try:
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(name, path, target)
                if spec is not None:
                    break
            else:
                return None
        finally:
            self._busy = False
        run = getattr(spec.loader, "exec_module", None)
        if run is None:
            return spec

        def exec_module(module, _run=run):
            _run(module)
            self._loaded(name)

        spec.loader.exec_module = exec_module  # this module's own loader object: nothing else is touched
        return spec

    def _loaded(self, name):
        if self.done or self._busy:  # (a watched module imported by on_loaded itself)
            return
        self._busy = True
        try:
            finished = self.on_loaded(name)
        finally:
            self._busy = False
        if not finished:
            return
        self.done = True
        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass


def watch(names, on_loaded):
    """Call ``on_loaded(name)`` after each import of a module in ``names`` runs, until it returns True."""
    watcher = _Watcher(names, on_loaded)
    sys.meta_path.insert(0, watcher)
    return watcher


_from_env = None


def from_env():
    """``CLTRACE`` on (1, true, yes, on): import cltrace once the program has imported pyopencl. Not in
    a child of a traced run (``CLTRACE_FAMILY``): the run's own bootstrap starts that one. Once per
    process (site may read a ``.pth`` file twice)."""
    global _from_env
    if _from_env is not None or os.environ.get("CLTRACE", "").strip().lower() not in _TRUE \
            or os.environ.get("CLTRACE_FAMILY"):
        return
    _from_env = watch(("pyopencl", "cltrace"), _import_cltrace)


def _import_cltrace(name):
    if name == "cltrace" or "cltrace" in sys.modules:  # its own import starts tracing, once complete
        return True
    try:
        import cltrace  # noqa: F401
    except Exception as exc:  # the program goes on, untraced
        sys.stderr.write(f"cltrace: CLTRACE=1: not traced: {type(exc).__name__}: {exc}\n")
    return True
