"""The one exception type that reaches the user as a single line on stderr."""


class CharlmError(Exception):
    """Bad input or an unusable resource: printed as one line, exit code ``exit_code``."""

    exit_code = 2


class OutOfVocabulary(CharlmError):
    """Text holds symbols that the vocabulary lacks."""

    def __init__(self, symbols):
        self.symbols = sorted(set(symbols))
        shown = ", ".join(repr(s) for s in self.symbols[:20])
        more = "" if len(self.symbols) <= 20 else f" and {len(self.symbols) - 20} more"
        super().__init__(f"text has symbols outside the vocabulary: {shown}{more}")
