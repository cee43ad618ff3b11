"""Log lines in nsqd's format, on stderr.

nsqd logs through Go's ``log`` package with ``Ldate|Ltime|Lmicroseconds`` and its own level
names (``internal/lg``)::

    [nsqd] 2006/01/02 15:04:05.000000 INFO: TCP: listening on 127.0.0.1:4150

Test harnesses (gnsq's among them) wait for ``TCP: listening on`` in that output, and operators'
log tooling parses it, so lmqd writes the same shape with its own prefix (``[lmqd] `` by default,
``--log-prefix``). Times are local, as Go's ``log`` writes them.
"""

from __future__ import annotations

import datetime
import logging
import sys
from typing import Protocol

from lmqd.options import LOG_LEVELS

__all__ = ["LEVELS", "NsqdFormatter", "configure", "level_from_name", "set_level"]

LEVELS: dict[str, int] = dict(
    zip(
        LOG_LEVELS,
        (logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR, logging.CRITICAL),
        strict=True,
    )
)
"""``--log-level`` names (nsqd's) -> logging levels."""

# nsqd's LogLevel.String(): "WARNING" for warn, "FATAL" for fatal.
_LEVEL_NAMES = {
    logging.DEBUG: "DEBUG",
    logging.INFO: "INFO",
    logging.WARNING: "WARNING",
    logging.ERROR: "ERROR",
    logging.CRITICAL: "FATAL",
}


def level_from_name(name: str) -> int:
    """An nsqd level name (any case) -> a logging level; ValueError for anything else."""
    try:
        return LEVELS[name.lower()]
    except KeyError:
        raise ValueError(f"invalid log level '{name}' ({', '.join(LOG_LEVELS)})") from None


class NsqdFormatter(logging.Formatter):
    """``<prefix><YYYY/MM/DD HH:MM:SS.ffffff> <LEVEL>: <message>`` (+ traceback lines, if any)."""

    def __init__(self, prefix: str) -> None:
        super().__init__()
        self.prefix = prefix

    def format(self, record: logging.LogRecord) -> str:
        when = datetime.datetime.fromtimestamp(record.created).strftime("%Y/%m/%d %H:%M:%S.%f")
        level = _LEVEL_NAMES.get(record.levelno, record.levelname)
        line = f"{self.prefix}{when} {level}: {record.getMessage()}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        if record.stack_info:
            line += "\n" + self.formatStack(record.stack_info)
        return line


class LogSettings(Protocol):
    """What ``configure`` reads: lmqd's and lmqlookupd's options both have it."""

    @property
    def log_level(self) -> str: ...

    @property
    def log_prefix(self) -> str: ...


class _StderrHandler(logging.Handler):
    # Looks sys.stderr up per record rather than holding the stream it was created with, so a
    # redirected or replaced stderr (daemonisers, click's test runner) keeps receiving the logs.
    def emit(self, record: logging.LogRecord) -> None:
        try:
            stream = sys.stderr
            stream.write(self.format(record) + "\n")
            stream.flush()
        except Exception:
            self.handleError(record)


def configure(options: LogSettings) -> logging.Handler:
    """Send every log record at ``options.log_level`` or above to stderr in nsqd's format.

    Installs one handler on the root logger (so third-party libraries' records share the
    format) and sets the root level. Calling it again replaces the handler it installed before.
    Returns the handler, so a caller that is done with it can remove it.
    """
    root = logging.getLogger()
    for handler in list(root.handlers):
        if isinstance(handler, _StderrHandler):
            root.removeHandler(handler)
    handler = _StderrHandler()
    handler.setFormatter(NsqdFormatter(options.log_prefix))
    root.addHandler(handler)
    set_level(options.log_level)
    return handler


def set_level(name: str) -> None:
    """Change the level at run time (nsqd's ``PUT /config/log_level``); ValueError if unknown."""
    logging.getLogger().setLevel(level_from_name(name))
