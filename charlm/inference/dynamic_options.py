"""The options of dynamic evaluation as the command line gives them: which flags need a method,
which only rms takes, which conflict with the protocol (``--adapt-on``, ``--search-prefix``,
``--save-adapted``); checked before anything is loaded or scored."""

from __future__ import annotations

import os
from pathlib import Path

from charlm.config_inference import DynamicOptions
from charlm.errors import CharlmError
from charlm.files import path_value
from charlm.inference.dynamic import METHODS
from charlm.settings import INT64_MAX


# Command-line flags → DynamicOptions fields; the flags that only rms uses.
FIELDS_BY_FLAG = {
    "--dyn-lr": "lr",
    "--dyn-decay": "decay",
    "--dyn-eps": "eps",
    "--segment": "segment",
    "--batch-size": "batch_size",
    "--dyn-stat-batches": "stat_batches",
    "--dyn-stat-batch-size": "stat_batch_size",
}
RMS_ONLY_FLAGS = ("--dyn-decay", "--dyn-eps", "--dyn-stat-batches", "--dyn-stat-batch-size")
STATIC_TOO_FLAGS = ("--batch-size", "--bptt")


def resolve_options(method: str | None, given: dict, *, search: bool = False) -> DynamicOptions | None:
    """DynamicOptions from command-line values (flag → value, None or False where not given);
    None for static evaluation. Every option that makes no sense with the others is an error."""
    named = [flag for flag, value in given.items() if value is not None and value is not False]
    dynamic_only = [flag for flag in named if flag not in STATIC_TOO_FLAGS] + (["--dyn-search"] if search else [])
    check_method(method, dynamic_only)
    if method is None:
        return None
    if given.get("--bptt") is not None:
        raise CharlmError(
            "--bptt sets the windows of static evaluation; dynamic evaluation uses --segment for both figures"
        )
    for flag in named:
        if flag in RMS_ONLY_FLAGS and method != "rms":
            raise CharlmError(f"{flag} applies to --dynamic rms only")
    if search:
        for flag in ("--dyn-lr", "--dyn-decay"):
            if given.get(flag) is not None:
                raise CharlmError(f"--dyn-search chooses {flag}: give one or the other")
    elif given.get("--search-prefix") is not None:
        raise CharlmError("--search-prefix applies to --dyn-search only")
    values = {FIELDS_BY_FLAG[flag]: given[flag] for flag in named if flag in FIELDS_BY_FLAG}
    options = DynamicOptions(method=method, **values)
    options.validate()
    return options


def check_method(method: str | None, dynamic_only: list[str], *, purpose: str = "evaluation") -> None:
    """What every command with ``--dynamic`` checks first: the ``dynamic_only`` flags given need a
    method, and the method must be one of ``METHODS``."""
    if method is None and dynamic_only:
        raise CharlmError(f"{dynamic_only[0]} applies to dynamic {purpose}: add --dynamic sgd or --dynamic rms")
    if method is not None and method not in METHODS:
        taken = (
            f": it takes a method first, as in --dynamic sgd {method}" if method.startswith("-") else ""
        )  # an option
        raise CharlmError(f"--dynamic must be {' or '.join(METHODS)}, not {method!r}{taken}")


def check_adapted_path(path, source, force: bool = False) -> None:
    """Fail before the long evaluation, not after it, if the adapted checkpoint cannot be written, or
    would replace a file without ``force`` (as `charlm export` asks for --force)."""
    path = path_value(path, "--save-adapted")
    if path.is_dir():
        raise CharlmError(f"--save-adapted {path} is a directory: give a file name such as {path / 'adapted.pt'}")
    if not path.parent.is_dir():
        raise CharlmError(f"--save-adapted {path}: the directory {path.parent} does not exist")
    if path.resolve() == Path(source).resolve():
        raise CharlmError(f"--save-adapted {path} would overwrite the evaluated checkpoint")
    if os.path.lexists(path) and not force:
        raise CharlmError(f"--save-adapted {path} exists: pass --force to replace it, or give another file name")


def check_protocol(split: str, adapt_on: str | None, search_prefix: int | None) -> None:
    if adapt_on is not None and adapt_on != "valid":
        raise CharlmError(f"--adapt-on must be valid, not {adapt_on!r}")
    if adapt_on == split:
        raise CharlmError(f"--adapt-on {adapt_on} adapts before scoring another split: use it with --split test")
    if search_prefix is not None and (
        isinstance(search_prefix, bool) or not isinstance(search_prefix, int) or not 2 <= search_prefix <= INT64_MAX
    ):  # Model.evaluate passes it unchecked
        raise CharlmError(
            f"--search-prefix must be a whole number of characters from 2 to {INT64_MAX}, not {search_prefix!r}"
        )
