"""How every trace format names and numbers its processes, so that each shows the same tree.

The host process is named after the program as a process list shows it (``python3 train.py
--epochs 3``); each OpenCL device is a process of its own (``OpenCL: <device>``) whose threads
are its queues, with a pid that follows from the device's place in the registry.

A command line often carries secrets (``--password=...``, ``API_TOKEN=...``), and every trace file
and OTLP export would carry them on. ``command_args`` is the one place any output takes the command
line from: the values of arguments whose names look like secrets are replaced by ``***`` (see
``redact``), or, with ``CLTRACE_COMMAND_LINE=off`` (``cltrace.configure(command_line="off")``), the
arguments are left out and the host process is named after the interpreter and the script's file name
alone.
"""
from __future__ import annotations

import logging
import os
import re
import sys
from typing import Any, Sequence

DEVICE_PID_BASE = 1_000_000
_MAX_NAME = 256
REDACTED = "***"
COMMAND_LINE_MODES = ("redacted", "off")
COMMAND_LINE_VAR = "CLTRACE_COMMAND_LINE"

# A name looks like a secret's where it contains one of these words (any case): over-redacting an
# ``--author`` costs a reader little, a leaked token costs its owner a lot.
_SECRET = re.compile(r"passw(or)?d|token|secret|key|auth|credential", re.IGNORECASE)
_ASSIGNMENT = re.compile(r"^([-+]*[A-Za-z_][A-Za-z0-9_.\-]*)=(.*)$", re.DOTALL)  # --name=v, NAME=v, db.password=v
_URL_PASSWORD = re.compile(r"(://[^/@:\s]*:)[^/@\s]*@")  # scheme://user:PASSWORD@host

_mode: str | None = None  # configure()'s choice; None: CLTRACE_COMMAND_LINE decides
_warned = False  # an unknown CLTRACE_COMMAND_LINE was said once


def set_command_line(mode: str) -> None:
    """``"redacted"`` (the default) or ``"off"`` for every output written from now on, over
    CLTRACE_COMMAND_LINE; a ValueError names the choices."""
    global _mode
    if mode not in COMMAND_LINE_MODES:
        raise ValueError(f"command_line={mode!r}: choose one of {', '.join(map(repr, COMMAND_LINE_MODES))}")
    _mode = mode


def command_line_mode() -> str:
    """The mode in effect: ``configure``'s, else CLTRACE_COMMAND_LINE's (an unknown value: ``off``, the
    safer reading, so a typo never puts secrets into a file), else ``redacted``."""
    if _mode is not None:
        return _mode
    raw = os.environ.get(COMMAND_LINE_VAR, "").strip().lower()
    if not raw:
        return "redacted"
    if raw not in COMMAND_LINE_MODES:
        global _warned
        if not _warned:
            _warned = True
            logging.getLogger("cltrace").warning(
                "cltrace: %s=%r is not one of %s: the command line is left out of the outputs (set it to "
                "redacted or off)", COMMAND_LINE_VAR, os.environ[COMMAND_LINE_VAR], ", ".join(COMMAND_LINE_MODES))
        return "off"
    return raw


def _looks_secret(name: str) -> bool:
    return bool(_SECRET.search(name))


def redact(args: Sequence[str]) -> list[str]:
    """``args`` with the values of secret-looking arguments replaced by ``***``: ``--password=x``,
    ``--api-key x`` (the next argument, unless it is an option itself, ``--...``), ``TOKEN=x`` and
    ``db.password=x``, and the password of a URL (``https://user:x@host``)."""
    out: list[str] = []
    hide_next = False
    for a in args:
        a = str(a)
        if hide_next and not a.startswith("--"):
            out.append(REDACTED)
            hide_next = False
            continue
        hide_next = False
        m = _ASSIGNMENT.match(a)
        if m is not None and _looks_secret(m.group(1)):
            out.append(f"{m.group(1)}={REDACTED}")
            continue
        if a.startswith("-") and m is None and _looks_secret(a):
            hide_next = True  # --password VALUE: the value is the next argument
        out.append(_URL_PASSWORD.sub(rf"\1{REDACTED}@", a))
    return out


def command_args() -> list[str] | None:
    """The program's arguments as outputs may show them (``sys.argv``, redacted), or None where the
    command line is left out (``command_line="off"``)."""
    if command_line_mode() == "off":
        return None
    return redact(sys.argv)


def program_name() -> str:
    """``<interpreter> <argv...>``, as ``ps`` shows a Python program (``python3 train.py``), redacted;
    with the command line left out, ``<interpreter> <script file name>``."""
    orig = getattr(sys, "orig_argv", None) or [sys.executable or "python"]
    exe = os.path.basename(orig[0]) or "python"
    args = command_args()
    if args is None:
        script = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
        args = [script] if script and not script.startswith("-") else []
    name = " ".join([exe, *(a for a in args if a)])
    return name if len(name) <= _MAX_NAME else name[:_MAX_NAME - 1] + "…"


def device_pid(registry: Any, device_key: str) -> int:
    """The pid a device's process gets: 1000001 for the first device the recorder registered, and so on."""
    keys = list(registry.devices)
    return DEVICE_PID_BASE + 1 + (keys.index(device_key) if device_key in keys else len(keys))
