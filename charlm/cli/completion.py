"""Shell completion (Tab) of the names an option takes: cells, corpora, a setting's choices.

Each press runs ``charlm`` anew, so nothing here imports torch or numpy: the cells' names are those
``charlm.cells`` declares (``CELL_NAMES``), the corpora are the recipes and the corpora prepared in
the data root (``charlm.corpora.root``). Typer keeps the candidates that start with the word typed.
"""

from __future__ import annotations

import dataclasses

from charlm.errors import CharlmError
from charlm.cells import CELL_NAMES
from charlm.corpora.root import data_root, prepared_names


def complete_cells(incomplete: str) -> list[str]:
    """``--cell``: the registered cells."""
    return list(CELL_NAMES)


def complete_cell_lists(incomplete: str) -> list[str]:
    """``--cells lstm,gru``: ``all``, or the list typed so far and one more registered cell."""
    done, comma, _ = incomplete.rpartition(",")
    named = set(done.split(comma)) if comma else set()
    listed = [done + comma + name for name in CELL_NAMES if name not in named]
    return listed if comma else ["all", *listed]


def complete_corpora(ctx, incomplete: str) -> list[str]:
    """``--corpus``: the built-in corpora, then the others prepared in the data root (``--data-dir`` if it
    was given before, else ``$CHARLM_DATA``, else ``./data``). Names alone: typer would wrap a description
    across lines in zsh's list."""
    from charlm.corpora.recipes import RECIPES  # brings tqdm: loaded only where corpora complete

    names = [name for name in RECIPES if name != "text"]  # `prepare text` makes a corpus of another name
    return names + [name for name in _prepared(ctx) if name not in RECIPES]


def complete_recipes(incomplete: str) -> list[str]:
    """``charlm prepare CORPUS``: the recipes, ``text`` (the user's own files) included."""
    from charlm.corpora.recipes import RECIPES  # brings tqdm: loaded only where corpora complete

    return list(RECIPES)


def _prepared(ctx) -> list[str]:
    try:
        return prepared_names(data_root(ctx.params.get("data_dir")))
    except (CharlmError, OSError):  # a data root that cannot be read: the built-in corpora alone
        return []


BY_FIELD = {"cell": complete_cells, "cells": complete_cell_lists, "corpus": complete_corpora}


def completion_for(owner, name: str):
    """The completion of the option of field ``name`` of a settings dataclass: its choices where it has
    some, else the names a cell or a corpus field takes; None for the others (typer's own)."""
    field = {f.name: f for f in dataclasses.fields(owner)}[name]
    choices = field.metadata.get("choices")
    if choices:
        return lambda incomplete: [str(choice) for choice in choices]
    return BY_FIELD.get(name)
