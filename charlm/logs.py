"""charlm's messages go through the standard ``logging`` module, logger ``"charlm"``.

A Python caller silences them with ``logging.getLogger("charlm").setLevel(logging.WARNING)`` or
redirects them with handlers of its own. When nobody has configured logging, the first message
installs a handler on stderr (rich's on a terminal), so scripts and the CLI both show progress.
"""

from __future__ import annotations

import logging
import sys

logger = logging.getLogger("charlm")
_HANDLER_NAME = "charlm-default"


def get_logger() -> logging.Logger:
    """The charlm logger, with a default stderr handler unless logging is configured elsewhere."""
    if not logger.handlers and not logging.getLogger().handlers:
        use_default_handler()
    return logger


class _CurrentStderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is when a message is emitted (as ``logging.lastResort``
    does), so a handler installed while stderr was redirected never writes to a stale stream."""

    def __init__(self):
        logging.Handler.__init__(self)

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value):  # StreamHandler.setStream assigns it; the stream stays sys.stderr
        pass


def use_default_handler(stream=None) -> None:
    """(Re)install charlm's own handler: rich on a terminal, plain lines otherwise. Without
    ``stream`` it writes to the ``sys.stderr`` of the moment of each message."""
    for handler in list(logger.handlers):
        if handler.get_name() == _HANDLER_NAME:
            logger.removeHandler(handler)
    if (stream or sys.stderr).isatty():
        from rich.console import Console
        from rich.logging import RichHandler

        console = Console(file=stream) if stream is not None else Console(stderr=True)
        handler = RichHandler(console=console, show_time=False, show_level=False, show_path=False,
                              markup=False, highlighter=None)
    else:
        handler = logging.StreamHandler(stream) if stream is not None else _CurrentStderrHandler()
    handler.set_name(_HANDLER_NAME)
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger.addHandler(handler)
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.INFO)
    logger.propagate = False


def info(message: str) -> None:
    """A progress message (the default ``log`` callback of the corpus machinery)."""
    get_logger().info(message)
