"""Call sites: the first user frame, skipping cltrace, pyopencl and listed library modules."""
import sys

from cltrace.record import callsite


def test_here_is_the_calling_line():
    site = callsite.here(); line = sys._getframe().f_lineno
    assert (site.file, site.line) == (__file__, line)
    assert site.function == "test_here_is_the_calling_line"


def test_library_modules_are_skipped(tmp_path, monkeypatch):
    (tmp_path / "mylib_cs.py").write_text("from cltrace.record import callsite\n"
                                          "def wrapper():\n    return callsite.here()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import mylib_cs
    assert mylib_cs.wrapper().file.endswith("mylib_cs.py")
    callsite.set_library_modules(["mylib_cs"])
    try:
        site = mylib_cs.wrapper(); line = sys._getframe().f_lineno
    finally:
        callsite.set_library_modules([])
    assert (site.file, site.line) == (__file__, line)
