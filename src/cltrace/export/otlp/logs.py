"""Keeps the OpenTelemetry exporters' log records from a sink's workers out of the traced
program's stderr (they would print a retry warning per batch) and passes their errors on."""
from __future__ import annotations

import logging
from typing import Callable

_EXPORTER_LOGGERS = "opentelemetry.exporter"


class ExporterLogFilter(logging.Filter):
    """Swallows exporter records logged by the threads in ``threads``; hands their messages to
    ``on_error(message, final)``: ``final`` for errors, which hold the latest warning as their cause."""

    def __init__(self, on_error: Callable[[str, bool], None]) -> None:
        super().__init__()
        self.on_error = on_error
        self.threads: set[int] = set()
        self._cause: str | None = None
        self._loggers: list[logging.Logger] = []

    def install(self) -> None:
        """Attach to every ``opentelemetry.exporter*`` logger there is."""
        for name, lg in list(logging.Logger.manager.loggerDict.items()):
            if name.startswith(_EXPORTER_LOGGERS) and isinstance(lg, logging.Logger):
                lg.addFilter(self)
                self._loggers.append(lg)

    def remove(self) -> None:
        loggers, self._loggers = self._loggers, []
        for lg in loggers:
            lg.removeFilter(self)

    def filter(self, record: logging.LogRecord) -> bool:
        if record.thread not in self.threads:
            return True
        if record.levelno < logging.WARNING:
            return False
        try:
            msg = record.getMessage().splitlines()[0][:300]
        except Exception:
            return False
        if record.levelno >= logging.ERROR:
            # "gave up" errors say little; the latest retry warning holds the cause.
            cause = self._cause
            self.on_error(f"{msg} [{cause}]" if cause else msg, True)
        else:
            self._cause = msg
            self.on_error(msg, False)
        return False
