"""Name → cell class, plus turning ``key=value`` strings into a cell's typed config."""

from __future__ import annotations

import dataclasses
import importlib
import math
import typing

from charlm.cells.base import RecurrentCell, check_options
from charlm.errors import CharlmError, closest

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


class CellRegistry:
    """The cells ``charlm train --cell NAME`` accepts; ``module:Class`` names a user's own cell."""

    def __init__(self, cells=()):
        self._cells: dict[str, type[RecurrentCell]] = {}
        for cell in cells:
            self.register(cell)

    def register(self, cell: type[RecurrentCell]) -> type[RecurrentCell]:
        _check_cell_class(cell, cell.__name__)
        if cell.name in self._cells:
            raise ValueError(f"cell name {cell.name!r} registered twice")
        self._cells[cell.name] = cell
        return cell

    def names(self) -> list[str]:
        return list(self._cells)

    def __iter__(self):
        return iter(self._cells.values())

    def get(self, name: str) -> type[RecurrentCell]:
        """The cell called ``name``; ``module:Class`` imports that module (the caller named it)."""
        if ":" in name:
            return _import_cell(name)
        if name in self._cells:
            return self._cells[name]
        close = closest(name, self._cells)
        if close:
            raise CharlmError(
                f"unknown cell {name!r}: did you mean {close!r}? (`charlm cells` lists every cell; module:Class "
                "names your own)"
            )
        raise CharlmError(
            f"unknown cell {name!r}; known cells: {', '.join(self._cells)} (or module:Class for your own)"
        )

    def resolve(
        self, name: str, *, cells=(), trust_code: bool = False, source: str = "the file"
    ) -> type[RecurrentCell]:
        """The cell that a file (a checkpoint, a config) names. A registered name is looked up; a
        user cell ``module:Class`` is imported only when the caller names it in ``cells`` (a class,
        or its ``module:Class`` string) or trusts the file's code."""
        if ":" not in name:
            try:
                return self.get(name)
            except CharlmError as error:  # a name no cell has: the file's, which the line names
                raise CharlmError(f"{source}: {error}") from None
        if isinstance(cells, (str, type)):  # one cell named alone
            cells = (cells,)
        if not isinstance(cells, (list, tuple, set, frozenset)):
            raise CharlmError(f"cells must be a list of cell classes or 'module:Class' names, not {cells!r}")
        for cell in cells:
            if isinstance(cell, str) and cell == name:
                return _import_cell(name)
            if isinstance(cell, type) and name in (
                f"{cell.__module__}:{cell.__qualname__}",
                f"{cell.__module__}:{cell.__name__}",
            ):
                _check_cell_class(cell, name)
                return cell
        if trust_code:
            return _import_cell(name)
        module = name.partition(":")[0]
        raise CharlmError(
            f"{source} asks to import module {module!r} for its cell {name!r}; charlm never runs code named in a file: "
            f"name the cell (--cell {name}, or cells=[...] in Python) or pass --trust-code if you trust it"
        )


def _check_cell_class(cell, label: str) -> None:
    if not (isinstance(cell, type) and issubclass(cell, RecurrentCell)):
        raise CharlmError(f"{label} is not a subclass of charlm.cells.RecurrentCell")
    if not cell.name:
        raise CharlmError(f"{label} has no `name` class attribute")
    if not dataclasses.is_dataclass(cell.Config):
        raise CharlmError(f"{label}.Config must be a dataclass")


def _import_cell(reference: str) -> type[RecurrentCell]:
    module_name, _, class_name = reference.partition(":")
    if not (all(part.isidentifier() for part in module_name.split(".")) and class_name.isidentifier()):
        # importlib raises ValueError or TypeError (a relative name) on what is not a module's name
        raise CharlmError(
            f"cell {reference!r} is not a registered name or module:Class (a module's dotted name, "
            "a colon and a class name, such as mycells:MyCell)"
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise CharlmError(f"cannot import {module_name!r} for cell {reference!r}: {error}") from None
    cell = getattr(module, class_name, None)
    if cell is None:
        raise CharlmError(f"module {module_name!r} has no class {class_name!r}")
    _check_cell_class(cell, reference)
    return cell


def parse_cell_options(cell: type[RecurrentCell], options: dict) -> object:
    """Build ``cell.Config`` from a dict whose values may be strings from the command line: each value
    converted to its field's type, then checked against the choices and bounds its field declares
    (``check_options``); a value outside them is said before a rule across fields (``__post_init__``)."""
    hints = typing.get_type_hints(cell.Config)
    fields = {field.name for field in dataclasses.fields(cell.Config)}
    values = {}
    for key, raw in options.items():
        key = key.replace("-", "_")
        if key not in fields:
            known = ", ".join(sorted(fields)) or "none"
            raise CharlmError(f"cell {cell.name!r} has no option {key!r} (its options: {known})")
        values[key] = _convert(raw, hints[key], key)
    try:
        config = cell.Config(**values)
    except (TypeError, ValueError) as error:  # a rule across options; a value outside its own bounds says so first
        check_options(cell, values)
        raise CharlmError(f"bad option for cell {cell.name!r}: {error}") from None
    check_options(cell, config)  # after __post_init__, which reads the old spellings of a value (peephole=true)
    return config


def _convert(raw, kind, key: str):
    """``raw`` (text from the command line, or a value from a JSON or TOML file) as the option's type:
    an integer option takes whole numbers only, a number option finite numbers only."""
    if typing.get_origin(kind) is typing.Union or type(kind).__name__ == "UnionType":
        choices = [k for k in typing.get_args(kind) if k is not type(None)]
        if raw is None or (isinstance(raw, str) and raw.lower() in ("none", "null")):
            return None
        kind = choices[0]
    if not isinstance(raw, str):
        return _checked(raw, kind, key)
    try:
        if kind is bool:
            if raw.lower() in _TRUE:
                return True
            if raw.lower() in _FALSE:
                return False
            raise ValueError
        if kind in (int, float):
            return _checked(kind(raw), kind, key)
    except ValueError:
        raise CharlmError(f"option {key}={raw!r} is not a valid {kind.__name__}") from None
    return raw


def _checked(value, kind, key: str):
    """A value of the option's own type: no 2.5 for an integer, no NaN or infinity for a number."""
    if kind is bool and not isinstance(value, bool):
        raise CharlmError(f"option {key}={value!r} must be true or false")
    if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise CharlmError(f"option {key}={value!r} must be a whole number")
    if kind is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise CharlmError(f"option {key}={value!r} must be a number")
        if not math.isfinite(value):
            raise CharlmError(f"option {key}={value!r} must be a finite number")
        return float(value)
    return value


def parse_key_values(pairs: list[str]) -> dict[str, str]:
    """``["a=1", "b=x"]`` → ``{"a": "1", "b": "x"}`` (for ``--cell-opt``)."""
    options = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise CharlmError(f"cell option {pair!r} is not of the form key=value")
        options[key.strip()] = value.strip()
    return options
