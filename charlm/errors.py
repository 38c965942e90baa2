"""The exceptions that reach the user as a single line on stderr, and how a value is shown in one."""


def shown(value, width: int = 80) -> str:
    """``repr(value)``, cut to ``width`` characters (a value of 5,000 characters in a one-line error)."""
    text = repr(value)
    return text if len(text) <= width else text[: width - 3] + "..."


class CharlmError(Exception):
    """Bad input or an unusable resource: printed as one line, exit code ``exit_code``."""

    exit_code = 2


class ConfigError(CharlmError):
    """A setting out of its bounds. Says the field's name (``layers must be at least 1``); the
    command line prints the flag instead (``--layers must be at least 1``)."""

    def __init__(self, owner: type, field: str, reason: str):
        self.owner, self.field, self.reason = owner, field, reason
        super().__init__(f"{field} {reason}")


class OutOfVocabulary(CharlmError):
    """Text holds symbols that the vocabulary lacks."""

    def __init__(self, symbols, where: str | None = None):
        self.symbols = sorted(set(symbols))
        shown = ", ".join(repr(s) for s in self.symbols[:20])
        more = "" if len(self.symbols) <= 20 else f" and {len(self.symbols) - 20} more"
        message = f"text has symbols outside the vocabulary: {shown}{more}"
        if where is not None:  # text given by a user to score: say where, and what to do
            message += (
                f" (the first at {where})" if where else ""
            ) + '; pass --unknown skip to leave them out (unknown="skip" from Python)'
        super().__init__(message)
