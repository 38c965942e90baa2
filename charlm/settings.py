"""How charlm declares and checks a setting: ``setting(...)`` fields carrying their help and bounds,
``validate`` against those bounds, ``from_dict`` with each value checked against the field's type,
and the JSON settings file of ``--config``. The settings themselves, with their defaults, are in
``charlm.config``; the command line builds its options from the same fields (``charlm.cli.options``).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import numbers
import os
import types
import typing
from pathlib import Path

from charlm.errors import CharlmError, ConfigError, closest, shown
from charlm.files import path_value, read_bytes


def setting(
    default,
    help: str,
    *,
    flag: str | None = None,
    min=None,
    max=None,
    min_open: bool = False,
    max_open: bool = False,
    choices: tuple | None = None,
    show_default: str | None = None,
    cli: bool = True,
):
    """A dataclass field with its help text and bounds; ``flag`` overrides ``--field-name``.

    ``show_default`` replaces the default in the help text (for defaults that depend on others);
    ``cli=False`` keeps the field off the command line.
    """
    metadata = {
        "help": help,
        "flag": flag,
        "min": min,
        "max": max,
        "min_open": min_open,
        "max_open": max_open,
        "choices": choices,
        "show_default": show_default,
        "cli": cli,
    }
    if isinstance(default, (dict, list)):
        return dataclasses.field(default_factory=lambda: type(default)(default), metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def flag_of(owner, name: str) -> str:
    """The command-line flag of field ``name`` of dataclass ``owner``."""
    for field in dataclasses.fields(owner):
        if field.name == name:
            return field.metadata.get("flag") or "--" + name.replace("_", "-")
    return "--" + name.replace("_", "-")


def bound_text(metadata) -> str:
    """``at least 1``, ``in (0, 1]``, ``positive``... from a field's bounds."""
    low, high = metadata.get("min"), metadata.get("max")
    if low is not None and high is not None:
        return f"in {'(' if metadata['min_open'] else '['}{low}, {high}{')' if metadata['max_open'] else ']'}"
    if low is not None:
        if metadata["min_open"]:
            return "positive" if low == 0 else f"greater than {low}"
        return "zero or positive" if low == 0 else f"at least {low}"
    if high is not None:
        return f"less than {high}" if metadata["max_open"] else f"at most {high}"
    return ""


# Every integer setting is bounded by its type, whatever its own bounds: it must fit a signed 64-bit
# integer, the type torch, numpy and the checkpoints hold it in (a seed, a size, a budget of tokens);
# every number setting must be finite. Seeds are also at least 0 (``setting(..., min=0)``).
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def number_kind(owner, name: str) -> type | None:
    """``int`` or ``float`` for a field annotated as one (optionally ``| None``), else None."""
    hint = _type_hints(owner)[name]
    kinds = [kind for kind in (typing.get_args(hint) or (hint,)) if kind is not type(None)]
    return kinds[0] if len(kinds) == 1 and kinds[0] in (int, float) else None


@functools.lru_cache(maxsize=None)
def _type_hints(owner) -> dict:
    return typing.get_type_hints(owner)  # read once per class: evaluating the annotations is slow


def check_number(owner, name: str, value, kind: type) -> None:
    """``value`` is a number of ``kind`` that its type can hold: a finite float, or an integer
    (not a bool, not 1.5) within 64 bits."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral if kind is int else numbers.Real):
        raise ConfigError(owner, name, f"must be {_KIND_NAMES[kind]}, not {value!r}")
    if kind is float and not math.isfinite(value):
        raise ConfigError(owner, name, f"must be a finite number, not {value}")
    if kind is int and not INT64_MIN <= value <= INT64_MAX:
        limit = f"at most {INT64_MAX}" if value > 0 else f"at least {INT64_MIN}"
        raise ConfigError(owner, name, f"must be {limit} (a 64-bit integer), not {shown(value, 40)}")


def validate(settings) -> None:
    """Check every field of a settings dataclass against its type (``check_type``, ``number_kind``),
    its bounds and its choices (None is 'unset', where the field may be unset)."""
    owner = type(settings)
    for field in dataclasses.fields(settings):
        if field.metadata:
            check_field(owner, field, getattr(settings, field.name))


def check_field(owner, field: dataclasses.Field, value) -> None:
    """One value of a field of settings dataclass ``owner`` against the field's type, choices and bounds,
    as ``validate`` checks each (a cell's options are checked this way before the rules across them)."""
    meta = field.metadata
    check_type(owner, field.name, value)
    if value is None:
        return
    choices = meta.get("choices")
    if choices and value not in choices:
        raise ConfigError(owner, field.name, f"must be one of {', '.join(map(str, choices))}, not {value!r}")
    _check_bounds(owner, field.name, value, meta)
    kind = number_kind(owner, field.name)
    if kind is not None:  # after the bounds, which say more of a NaN ("must be positive, not nan")
        check_number(owner, field.name, value, kind)


def _check_bounds(owner, name: str, value, meta) -> None:
    low, high = meta.get("min"), meta.get("max")
    if low is None and high is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(owner, name, f"must be a number, not {value!r}")
    ok = not (isinstance(value, float) and math.isnan(value))
    if low is not None:
        ok = ok and (value > low if meta["min_open"] else value >= low)
    if high is not None:
        ok = ok and (value < high if meta["max_open"] else value <= high)
    if not ok:
        raise ConfigError(owner, name, f"must be {bound_text(meta)}, not {shown(value, 40)}")


_KIND_NAMES = {
    int: "an integer",
    float: "a number",
    str: "text",
    bool: "true or false",
    dict: "an object",
    list: "a list",
}


def field_kinds(owner, name: str) -> tuple[tuple, bool]:
    """The types field ``name`` of ``owner`` takes (``list`` for ``list[str]``) and whether it may be None."""
    hint = _type_hints(owner)[name]
    union = typing.get_origin(hint) in (typing.Union, types.UnionType)
    kinds = typing.get_args(hint) if union else (hint,)
    return tuple(typing.get_origin(kind) or kind for kind in kinds if kind is not type(None)), type(None) in kinds


def check_type(owner, name: str, value) -> None:
    """``value`` is of the type field ``name`` is annotated with, as Python gives it (``validate``) or
    a file does (``from_dict``): None only where the field may be unset; text, true or false, an object
    or a list where the field is one. A number field's value is checked by ``check_number``, which says
    more. (Text that becomes a path is checked where it does: ``charlm.files.path_value``.)"""
    allowed, optional = field_kinds(owner, name)
    if value is None:
        if not optional:
            raise ConfigError(owner, name, f"must be {_KIND_NAMES.get(allowed[0], allowed[0].__name__)}, not None")
        return
    if {int, float} & set(allowed):
        return
    if (isinstance(value, bool) and bool not in allowed) or not isinstance(value, allowed):
        raise ConfigError(
            owner, name, f"must be {_KIND_NAMES.get(allowed[0], allowed[0].__name__)}, not {shown(value)}"
        )


def from_dict(cls, values: dict):
    """``cls(**values)`` with each value checked against the field's type (numbers for a text field,
    such as a budget of 1000000, are taken as text; ints are floats)."""
    known = {field.name for field in dataclasses.fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        close = closest(unknown[0], known)
        hint = f" (did you mean {close!r}?)" if close else ""
        raise CharlmError(
            f"unknown {cls.__name__} setting{'s' if len(unknown) > 1 else ''}: {', '.join(map(repr, unknown))}{hint}"
        )
    checked = {}
    for name, value in values.items():
        allowed, optional = field_kinds(cls, name)
        if value is None and optional:
            pass
        elif isinstance(value, bool) and bool not in allowed:
            raise ConfigError(cls, name, f"must be {_KIND_NAMES.get(allowed[0], allowed[0].__name__)}, not {value!r}")
        elif str in allowed and isinstance(value, (int, float)) and not isinstance(value, bool):
            value = str(value)
        elif str in allowed and isinstance(value, os.PathLike) and isinstance(os.fspath(value), str):
            value = os.fspath(value)  # charlm.train(run_dir=Path(...)) from Python
        elif float in allowed and isinstance(value, numbers.Real):
            value = _as_float(cls, name, value)  # an int, or numpy's float32
        elif int in allowed and isinstance(value, numbers.Integral):
            value = int(value)  # numpy's int64: a config.json or a checkpoint holds plain ints
        elif not isinstance(value, allowed):
            raise ConfigError(
                cls, name, f"must be {_KIND_NAMES.get(allowed[0], allowed[0].__name__)}, not {shown(value)}"
            )
        checked[name] = value
    return cls(**checked)


def _as_float(owner, name: str, value) -> float:
    """A number as a float; an integer too large for one (``10**400`` in a config file) is not finite."""
    try:
        return float(value)
    except OverflowError:
        raise ConfigError(owner, name, f"must be a finite number, not {shown(value, 40)}") from None


def read_config_file(path: str | Path) -> dict:
    """A JSON object of training settings (keys as in TrainConfig, e.g. "cell_options": {...})."""
    path = path_value(path, "config file")
    try:
        values = json.loads(read_bytes(path, "config file").decode("utf-8"))
    except ValueError as error:  # not UTF-8, not JSON, or an integer of more digits than Python converts
        raise CharlmError(f"config file {path} is not valid JSON: {error}") from None
    except RecursionError:
        raise CharlmError(f"config file {path} is not valid JSON: its values are nested too deeply") from None
    if not isinstance(values, dict):
        raise CharlmError(f"config file {path} must hold a JSON object")
    return renamed({key.replace("-", "_"): value for key, value in values.items()})


RENAMED_SETTINGS = {"hidden": "hidden_size"}  # as files written before charlm 0.4 name them


def renamed(values: dict) -> dict:
    """``values`` with the settings of ``RENAMED_SETTINGS`` under their names of today."""
    new = {key: RENAMED_SETTINGS[key] for key in values if RENAMED_SETTINGS.get(key) not in (None, *values)}
    return {new.get(key, key): value for key, value in values.items()}
