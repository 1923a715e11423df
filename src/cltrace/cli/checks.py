"""Checks the commands run before any work: a mistake in the command line or the environment
is one ``cltrace: error: ...`` line (exit 2) at once, not a traceback after a long run."""
from __future__ import annotations

import argparse
import os
from typing import Callable

from ..errors import CltraceError, MissingExtraError


def whole_number(least: int) -> Callable[[str], int]:
    """An argparse type: a whole number of at least ``least`` (``--top -1`` is a usage error, not a row
    quietly dropped)."""

    def parse(value: str) -> int:
        try:
            n = int(value)
        except ValueError:
            n = least - 1
        if n < least:
            raise argparse.ArgumentTypeError(f"expected a whole number >= {least}, not {value!r}")
        return n

    return parse


def port(value: str) -> int:
    """An argparse type: a TCP port, 1 to 65535."""
    n = whole_number(1)(value)
    if n > 65535:
        raise argparse.ArgumentTypeError(f"expected a port from 1 to 65535, not {value!r}")
    return n


def percent(value: str) -> float:
    """An argparse type: a percentage >= 0, ``5`` or ``5%``."""
    try:
        v = float(value.rstrip("%"))
    except ValueError:
        v = float("nan")
    if not v >= 0 or v == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a percentage >= 0 (e.g. 5 or 5%), not {value!r}")
    return v


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
    exists (made here) and can be written; matplotlib is installed."""
    try:
        from matplotlib.figure import Figure
    except ModuleNotFoundError:
        raise MissingExtraError("--plot", "plot") from None

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
