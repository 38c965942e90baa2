"""The exceptions that reach the user as a single line on stderr, and how a value is shown in one."""

import difflib
import re


def closest(name: str, known) -> str | None:
    """The one of ``known`` that ``name`` is most likely a slip of the keyboard for, letter case aside
    (difflib's ratio of at least 0.6, as click suggests a command or an option), or None."""
    by_lowered = {}
    for each in known:
        by_lowered.setdefault(str(each).lower(), each)
    match = difflib.get_close_matches(str(name).lower(), list(by_lowered), n=1)
    return by_lowered[match[0]] if match else None


def shown(value, width: int = 80) -> str:
    """``repr(value)``, cut to ``width`` characters (a value of 5,000 characters in a one-line error)."""
    text = repr(value)
    return text if len(text) <= width else text[: width - 3] + "..."


_KINDS = {
    list: "a list",
    tuple: "a list",
    str: "text",
    bytes: "bytes",
    bool: "true or false",
    type(None): "null",
    dict: "a mapping",
    int: "a number",
    float: "a number",
}


def kind_of(value) -> str:
    """What ``value`` is, in words (``a number``, ``a list``, ``text``, ``a tensor``), for a message that
    says what a file or an argument holds instead of what it should. Knows a tensor without importing torch."""
    if any(cls.__name__ == "Tensor" and cls.__module__.startswith("torch") for cls in type(value).__mro__):
        return "a tensor"
    name = type(value).__name__
    if name == "ndarray":  # numpy's
        return "an array"
    return _KINDS.get(type(value), f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}")


class CharlmError(Exception):
    """Bad input or an unusable resource: printed as one line, exit code ``exit_code``."""

    exit_code = 2


class ConfigError(CharlmError):
    """A setting out of its bounds. Says the field's name (``epochs must be at least 1``); the
    command line prints the flag instead (``--epochs must be at least 1``)."""

    def __init__(self, owner: type, field: str, reason: str):
        self.owner, self.field, self.reason = owner, field, reason
        super().__init__(f"{field} {reason}")


class NoCheckpoint(CharlmError):
    """A run directory that holds no checkpoint (best.pt or last.pt). The boundaries, the command line
    and ``charlm.load``, say why (``charlm.runs.first_save``): its run is training, or stopped before
    its first save."""

    def __init__(self, path, message: str | None = None):
        self.path = path
        super().__init__(message or f"run directory {path} holds no checkpoint (best.pt or last.pt)")


class RunInUse(CharlmError):
    """A run directory whose lock another live process holds (``charlm.runs.directory``): a sweep process
    skips the point; everywhere else it is bad input like any other."""


class OutOfVocabulary(CharlmError):
    """Text holds symbols that the vocabulary lacks."""

    SKIP = 'pass --unknown skip to leave them out (unknown="skip" from Python)'  # how, where ``where`` is given

    def __init__(self, symbols, where: str | None = None, skip: str = SKIP):
        self.symbols, self.where = sorted(set(symbols)), where
        shown = ", ".join(repr(s) for s in self.symbols[:20])
        more = "" if len(self.symbols) <= 20 else f" and {len(self.symbols) - 20} more"
        message = f"text has symbols outside the vocabulary: {shown}{more}"
        if where is not None:  # text given by a user to score: say where, and what to do
            message += (f" (the first at {where})" if where else "") + f"; {skip}"
        super().__init__(message)

    def skipped_by(self, skip: str) -> "OutOfVocabulary":
        """The same error, saying how to leave the symbols out in the caller's own terms (``skip``)."""
        return OutOfVocabulary(self.symbols, self.where, skip)


class OutOfMemory(CharlmError):
    """Memory ran out while a command ran (``out_of_memory``): exit code 1, the machine is short, not the input.
    ``what`` ran out and the ``advice`` of the caller that said so (a command line's options, Python's names)."""

    exit_code = 1

    def __init__(self, what: str, advice: str):
        self.what, self.advice = what, advice
        super().__init__(f"{what}: {advice}")

    def advised(self, advice: str) -> "OutOfMemory":
        """The same failure with another caller's ``advice`` (a command that loaded through ``charlm.load``)."""
        return OutOfMemory(self.what, advice)


OUT_OF_MEMORY_ADVICE = "free memory, or use a machine with more"  # where no option of the command helps
_ALLOCATION = re.compile(r"allocate (\d+(?:\.\d+)?) ?(bytes|[KMGTPE]iB)", re.IGNORECASE)


def out_of_memory(error: BaseException, advice: str = OUT_OF_MEMORY_ADVICE) -> OutOfMemory | None:
    """``error`` as one line if it says an allocation failed (torch's ``OutOfMemoryError``, an allocator's
    ``RuntimeError`` such as "DefaultCPUAllocator: can't allocate memory", Python's ``MemoryError``), else
    None. The memory checks before a run (``charlm.runtime.memory``) estimate training; whatever else runs
    out (scoring, dynamic evaluation, a GPU's library workspaces) reaches the boundaries, the command line
    and ``charlm.train``/``charlm.load``, and is told here, with the ``advice`` of the command that ran
    (the options it has)."""
    message = " ".join(str(error).split())
    allocator = isinstance(error, RuntimeError) and re.search(r"can't allocate memory|out of memory", message, re.I)
    if not (isinstance(error, MemoryError) or type(error).__name__ == "OutOfMemoryError" or allocator):
        return None
    lowered = message.lower()
    on = "cpu" if isinstance(error, MemoryError) or "cpuallocator" in lowered else None
    on = on or next((kind for kind in ("cuda", "mps", "xpu") if kind in lowered), "the device")
    size = _ALLOCATION.search(message)
    if size and size[2].lower() == "bytes":
        number = int(float(size[1]))
        what = f"{number / 1024**3:,.1f} GiB" if number >= 1024**3 / 10 else f"{number / 1024**2:,.1f} MiB"
    else:
        what = f"{size[1]} {size[2]}" if size else None
    failed = f" (an allocation of {what} failed)" if what else ""
    return OutOfMemory(f"out of memory on {on}{failed}", advice)
