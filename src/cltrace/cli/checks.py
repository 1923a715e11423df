"""Checks the commands run before any work: a mistake in the command line or the environment
is one ``cltrace: error: ...`` line (exit 2) at once, not a traceback after a long run."""
from __future__ import annotations

import os

from ..errors import CltraceError


def check_device() -> None:
    """The device CLTRACE_DEVICE names (or the default one) exists and its compiler works."""
    from ..record.queues import NoSuchDevice, checked_default_device

    try:
        checked_default_device()
    except NoSuchDevice as exc:
        raise CltraceError(f"{exc}; set CLTRACE_DEVICE to gpu, cpu, P:D or part of a device name "
                           "(`cltrace devices` lists them)") from None


def check_plot_path(path: str) -> None:
    """``path`` can take a matplotlib chart: a format matplotlib writes, in a folder that
    exists (made here) and can be written."""
    from matplotlib.figure import Figure

    from ..export.base import FOLDER_MODE
    from ..record.files import make_dirs

    kinds = Figure().canvas.get_supported_filetypes()
    ext = os.path.splitext(path)[1][1:].lower()
    if ext not in kinds:
        raise CltraceError(f"--plot {path}: matplotlib cannot tell the image format from {('.' + ext) if ext else 'no suffix'!r}; "
                           f"end the name in one of {', '.join('.' + k for k in sorted(kinds))}")
    if os.path.isdir(path):
        raise CltraceError(f"--plot {path}: is a folder; give a file name such as {os.path.join(path, 'sweep.png')!r}")
    folder = os.path.dirname(path)
    above = os.path.abspath(folder or ".")
    while not os.path.exists(above):
        above = os.path.dirname(above)
    if not os.path.isdir(above):
        raise CltraceError(f"--plot {path}: {above!r} is a file, not a folder; choose another path")
    try:
        if folder:
            make_dirs(folder, FOLDER_MODE)
        existed = os.path.exists(path)
        with open(path, "ab"):
            pass
        if not existed:
            os.remove(path)
    except OSError as exc:
        raise CltraceError(f"--plot {path}: cannot write there ({exc.strerror or exc}); choose another path") from None
