"""Finding corpora: the recipes by name, and the prepared corpora in a data root."""

import os
import re
from dataclasses import dataclass
from pathlib import Path

from charlm.corpora.recipes import RECIPES, Recipe
from charlm.corpora.root import META, data_root, prepared_names
from charlm.corpora.store import PreparedCorpus, open_prepared
from charlm.errors import CharlmError
from charlm.files import is_plain_name


def get_recipe(name: str) -> Recipe:
    if name not in RECIPES:
        raise CharlmError(f"unknown corpus {name!r}: known corpora are {', '.join(RECIPES)}")
    return RECIPES[name]


def load_corpus(name: str, data_dir: str | Path | None = None) -> PreparedCorpus:
    """The prepared corpus ``name``; a CharlmError saying which `charlm prepare` to run when it is missing."""
    if not is_plain_name(name):  # a name from a checkpoint, a config file or a plan: never a path
        raise CharlmError(f"{name!r} is not a corpus name (letters, digits, '.', '_' or '-', not starting with one)")
    root = data_root(data_dir)
    if os.path.lexists(root / name / META):  # a link to nowhere is a damaged corpus, not a missing one
        return open_prepared(root / name)
    raise CharlmError(f"corpus {name!r} is not prepared in {root}/: {_how_to_prepare(name)}")


def vocabulary_size(name: str, data_dir: str | Path | None = None) -> tuple[int | None, bool]:
    """The vocabulary size of corpus ``name``: its prepared form's, else the size its recipe
    documents (the second value says it was assumed); None when neither is known."""
    try:
        return load_corpus(name, data_dir).vocab_size, False
    except CharlmError:
        recipe = RECIPES.get(name)
        return (recipe.vocab_size if recipe else None), True


def _how_to_prepare(name: str) -> str:
    if name in RECIPES and name != "text":
        return f"run `charlm prepare {name}`"
    subword = re.fullmatch(r"(.+)-(bpe|unigram)(\d+)", name)
    if subword and subword[1] in RECIPES and subword[1] != "text":
        return f"run `charlm prepare {subword[1]} --subword {subword[2]} --vocab-size {subword[3]}`"
    return (
        f"it is not a built-in corpus either (those are {', '.join(n for n in RECIPES if n != 'text')}); "
        f"prepare your own text with `charlm prepare text PATH... --name {name}`"
    )


@dataclass
class CorpusEntry:
    """A row of `charlm corpora`: a known or prepared corpus, and its prepared form if there is one."""

    name: str
    description: str
    unit: str
    corpus: PreparedCorpus | None


def list_corpora(data_dir: str | Path | None = None) -> list[CorpusEntry]:
    """Every recipe, then every other corpus prepared in the data root, with its prepared form if any."""
    root = data_root(data_dir)
    prepared = {}
    for name in prepared_names(root):
        try:
            prepared[name] = open_prepared(root / name)
        except CharlmError:
            continue  # an unreadable or older-format corpus is listed as not prepared
    entries = []
    for name, recipe in RECIPES.items():
        corpus = prepared.pop(name, None)
        if corpus is not None and corpus.meta.get("recipe", name) != name:  # another corpus under its name (--force)
            entries.append(CorpusEntry(name, corpus.meta.get("description", ""), corpus.unit, corpus))
        else:
            entries.append(CorpusEntry(name, recipe.description, recipe.unit, corpus))
    entries += [
        CorpusEntry(name, corpus.meta.get("description", ""), corpus.unit, corpus) for name, corpus in prepared.items()
    ]
    return entries
