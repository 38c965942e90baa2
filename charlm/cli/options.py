"""Command-line options built from the settings dataclasses of ``charlm.config``.

``@settings_options(TrainConfig)`` adds one typer option per field to a command: its flag, its
help with the default and the bounds or the choices taken from the field. The bounds and
choices themselves are checked by the library (``charlm.config.validate``), so the command line
and Python callers get the same message. Every option defaults to None, so the command receives
only the values the user gave (``given``) and can layer them over a config file or a checkpoint.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import typing
from typing import Optional

import typer
from rich.markup import escape

from charlm.cli.completion import completion_for
from charlm.settings import bound_text, flag_of
from charlm.files import check_directory, path_value


def help_text(owner, name: str) -> str:
    """A field's help with its default: ``Parallel streams per step. (default: 250)``."""
    field = {f.name: f for f in dataclasses.fields(owner)}[name]
    shown = field.metadata.get("show_default")
    if shown is None:
        default = field.default_factory() if field.default_factory is not dataclasses.MISSING else field.default
        shown = "none" if default is None else _plain(default)
    bounds = bound_text(field.metadata)
    must = f" Must be {bounds}." if bounds else ""
    if field.metadata.get("choices"):
        must = f" One of: {', '.join(map(str, field.metadata['choices']))}."
    return escape(f"{field.metadata['help']}{must} (default: {shown})")  # typer reads help as rich markup


# The panels `--help` groups a command's settings into, so that a long list reads at 80 columns.
PANELS = {
    "Model": (
        "cell",
        "hidden_size",
        "params",
        "layers",
        "embed_size",
        "dropout",
        "wiring",
        "block_conv",
        "block_expansion",
        "tie_weights",
        "head_bias",
    ),
    "Regularisation": (
        "dropout_embed",
        "dropout_input",
        "dropout_hidden",
        "dropout_output",
        "weight_drop",
        "ar",
        "tar",
    ),
    "Data": ("corpus", "text", "data_dir", "train_fraction", "batch_size", "bptt", "unknown"),
    "Optimisation": (
        "optimizer",
        "lr",
        "weight_decay",
        "decay_on",
        "adam_betas",
        "momentum",
        "nesterov",
        "accumulate",
        "clip",
        "seed",
        "precision",
    ),
    "Schedule and stopping": (
        "schedule",
        "lr_decay",
        "min_lr",
        "plateau_factor",
        "warmup_steps",
        "epochs",
        "patience",
        "max_minutes",
        "max_tokens",
    ),
    "Evaluation": ("eval_batch_size", "eval_every", "eval_fraction", "test_every_epoch"),
    "Saving and logging": (
        "run_dir",
        "init_from",
        "save_every",
        "keep_checkpoints",
        "log_every",
        "print_every",
        "tensorboard",
        "wandb",
        "wandb_project",
    ),
    "Hardware": ("device", "compile", "cuda_graph", "tf32", "dist_timeout"),
}
PANEL_OF = {name: panel for panel, names in PANELS.items() for name in names}


def option_for(owner, name: str, *extra_flags: str, help: str | None = None):
    """The typer option of one field (default None: the command sees whether it was given)."""
    flags = [flag_of(owner, name), *extra_flags]
    if _base_type(_hints(owner)[name]) is bool:
        flags = [f"{flags[0]}/--no-{flags[0].removeprefix('--')}"]
    hint = _hints(owner)[name]
    metavar = f"<{typing.get_args(hint)[0].__name__}>" if typing.get_origin(hint) is list else None  # not <list[str]>
    return typer.Option(
        None,
        *flags,
        help=help or help_text(owner, name),
        show_default=False,
        rich_help_panel=PANEL_OF.get(name),
        metavar=metavar,
        autocompletion=completion_for(owner, name),
    )


def option_type(owner, name: str):
    """The annotation of a field's option: Optional of its type (choices are checked by the library);
    a list field is an option given once per item."""
    hint = _hints(owner)[name]
    if typing.get_origin(hint) is list:
        return Optional[typing.List[typing.get_args(hint)[0]]]
    return Optional[_base_type(hint)]


def settings_options(owner, *, into: str = "given", exclude: tuple = ()):
    """Decorate a command: add an option for each command-line field of ``owner`` (except
    ``exclude``); the command is called with ``into=`` the dict of the values given."""

    def decorate(command):
        names = [f.name for f in dataclasses.fields(owner) if f.metadata.get("cli", True) and f.name not in exclude]
        own = [p for p in inspect.signature(command).parameters.values() if p.name != into]
        own_hints = typing.get_type_hints(command)
        own = [p.replace(annotation=own_hints.get(p.name, p.annotation)) for p in own]
        added = [
            inspect.Parameter(
                name,
                inspect.Parameter.KEYWORD_ONLY,
                default=option_for(owner, name),
                annotation=option_type(owner, name),
            )
            for name in names
        ]

        @functools.wraps(command)
        def wrapper(**values):
            given = {name: values.pop(name) for name in names if values.get(name) is not None}
            for name in names:
                values.pop(name, None)
            return command(**values, **{into: given})

        del wrapper.__wrapped__
        parameters = own + added
        wrapper.__signature__ = inspect.Signature(sorted(parameters, key=lambda p: p.kind))
        wrapper.__annotations__ = {p.name: p.annotation for p in parameters}
        return wrapper

    return decorate


@functools.cache
def _hints(owner) -> dict:
    """The evaluated annotations of a settings dataclass, once per dataclass (not once per option: start-up)."""
    return typing.get_type_hints(owner)


def _base_type(hint):
    arguments = [kind for kind in typing.get_args(hint) if kind is not type(None)]
    return arguments[0] if arguments else hint


def _plain(value) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def dynamic_option(value: str | None):
    """The callback of ``--dynamic``: its method checked as it is read, before the rest of the line is,
    so that ``--dynamic --dyn-lr 0.1`` (the next option taken as the method) names the methods instead
    of an "unexpected extra argument"."""
    if value is not None:
        from charlm.inference.dynamic_options import check_method

        check_method(value, [])
    return value


def directory_flag(flag: str, help: str):
    """A directory option (``--data-dir``, ``--run-dir``, ``--dir``): None unless given, checked as it is read
    (:func:`directory_option`), shown as ``<path>``."""
    return typer.Option(None, flag, callback=directory_option, help=help, metavar="<path>")


def directory_option(param: typer.CallbackParam, value):
    """The callback of a directory option (``--data-dir``): an empty path or a file where the directory
    belongs is bad input, said with the option's name as it is read (``charlm.files``)."""
    if value is not None:
        check_directory(path_value(value, param.opts[0]), param.opts[0])
    return value
