"""charlm's messages go through the standard ``logging`` module, logger ``"charlm"``.

A Python caller silences them with ``logging.getLogger("charlm").setLevel(logging.WARNING)`` or
redirects them with handlers of its own. When nobody has configured logging, the first message
installs a handler on stderr (rich's on a terminal), so scripts and the CLI both show progress.
Progress bars (``progress_bar``), for training and for scoring alike, are drawn on stderr only
where it is a terminal.
"""

from __future__ import annotations

import contextlib
import logging
import math
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
        handler = RichHandler(
            console=console, show_time=False, show_level=False, show_path=False, markup=False, highlighter=None
        )
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


# The label and the figures first, then the bar: a narrow terminal narrows the bar, never the figures.
BAR_FORMAT = "{desc}{postfix} |{bar}| {n_fmt}/{total_fmt} eta {remaining}"


def progress_bar(total: int, label: str, *, initial: int = 0, show: bool = True, scale: bool = False):
    """A tqdm bar on stderr, drawn only where ``show`` and stderr is a terminal (nothing otherwise);
    its figures go in with ``set_postfix_str``. ``scale``: counts shown as 2.30M."""
    from tqdm import tqdm

    return tqdm(
        total=total,
        initial=initial,
        desc=label,
        unit_scale=scale,
        leave=False,
        disable=None if show else True,
        dynamic_ncols=True,
        bar_format=BAR_FORMAT,
    )


class ProgressBars:
    """One ``progress_bar`` per stage of a scoring, with the running bits per symbol: ``stage(label,
    total)`` is a context giving ``callback(tokens, nats)``."""

    def __init__(self, unit: str = "bpc"):
        self.unit = unit

    @contextlib.contextmanager
    def stage(self, label: str, total: int):
        with progress_bar(total, label, scale=True) as bar:
            seen = {"tokens": 0, "nats": 0.0}

            def callback(tokens: int, nats: float) -> None:
                seen["tokens"] += tokens
                seen["nats"] += nats
                if seen["nats"]:
                    bar.set_postfix_str(f"{self.unit} {seen['nats'] / math.log(2) / seen['tokens']:.3f}", refresh=False)
                bar.update(tokens)

            yield callback
