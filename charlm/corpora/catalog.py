"""Finding corpora: the recipes by name, and the prepared corpora in a data root."""

import os
import re
from dataclasses import dataclass
from pathlib import Path

from charlm.corpora.recipes import RECIPES, Recipe
from charlm.corpora.root import META, data_root, prepared_names
from charlm.corpora.store import VERSIONS, PreparedCorpus, kept_version_path, open_prepared
from charlm.errors import CharlmError, closest
from charlm.files import is_plain_name
from charlm.logs import get_logger


def get_recipe(name: str) -> Recipe:
    if name not in RECIPES:
        close = closest(name, RECIPES)
        if close:
            raise CharlmError(f"unknown corpus {name!r}: did you mean {close!r}? (`charlm corpora` lists every corpus)")
        raise CharlmError(f"unknown corpus {name!r}: known corpora are {', '.join(RECIPES)}")
    return RECIPES[name]


@dataclass(frozen=True)
class TrainedOn:
    """The version of a corpus a run trained on, as its provenance records it."""

    fingerprint: str | None  # of the inputs and options it was prepared from (their paths among them)
    content: str | None = None  # of what the model saw (``PreparedCorpus.content``): recorded since 0.4

    @classmethod
    def of(cls, provenance: dict) -> "TrainedOn | None":
        """From a run's provenance; None where it records neither."""
        fingerprint, content = provenance.get("corpus_fingerprint"), provenance.get("corpus_content")
        version = cls(*(value if is_plain_name(value) else None for value in (fingerprint, content)))
        return version if version.fingerprint or version.content else None

    def matches(self, corpus: PreparedCorpus) -> bool:
        if self.content is not None and corpus.content is not None:
            return self.content == corpus.content
        return self.fingerprint is None or corpus.fingerprint in (None, self.fingerprint)


class CorpusChanged(CharlmError):
    """The corpus a run trained on was prepared again from other inputs, and its earlier version is not kept."""

    def __init__(self, name: str, root: Path, trained: TrainedOn, now: PreparedCorpus):
        self.name, self.trained, self.now = name, trained, now
        then, here = (trained.content, now.content) if trained.content else (trained.fingerprint, now.fingerprint)
        super().__init__(
            f"corpus {name!r} in {root}/ is not the version the run trained on (its {then[:12]}, here "
            f"{(here or 'none')[:12]}: prepared again since, or another corpus of that name), and that version "
            f"is not kept in {root / VERSIONS}/: its figures would be of other text; use the --data-dir that holds "
            "it, or train a new run on the corpus as it is"
        )


def load_corpus(
    name: str, data_dir: str | Path | None = None, *, trained_on: TrainedOn | None = None
) -> PreparedCorpus:
    """The prepared corpus ``name``; a CharlmError saying which `charlm prepare` to run when it is missing.

    ``trained_on``: the version a run trained on. When the corpus has been prepared again from other
    inputs since, the earlier version kept under ``.versions`` is returned (its ``is_kept_version`` is
    true), or ``CorpusChanged`` raised when it is not kept: a run is never scored on text it was not
    trained on. A run of 0.3 records only the fingerprint, which also changes when the same text is
    prepared from another path: a mismatch there is a warning."""
    if not is_plain_name(name):  # a name from a checkpoint, a config file or a plan: never a path
        raise CharlmError(f"{name!r} is not a corpus name (letters, digits, '.', '_' or '-', not starting with one)")
    root = data_root(data_dir)
    current = root / name
    if trained_on is not None:
        corpus = open_prepared(current) if os.path.lexists(current / META) else None
        if corpus is not None and trained_on.matches(corpus):
            return corpus
        kept = _kept_version(root, name, trained_on)
        if kept is not None:
            return kept
        if corpus is not None and trained_on.content is None:
            get_logger().warning(
                f"warning: corpus {name!r} in {root}/ has another fingerprint than the run records (prepared "
                "again since, or from files at another path; a run of charlm 0.3 records no more): its figures "
                "may be of other text"
            )
        elif corpus is not None:
            raise CorpusChanged(name, root, trained_on, corpus)
    if os.path.lexists(current / META):  # a link to nowhere is a damaged corpus, not a missing one
        return open_prepared(current)
    raise CharlmError(f"corpus {name!r} is not prepared in {root}/: {_how_to_prepare(name, root)}")


def _kept_version(root: Path, name: str, trained_on: TrainedOn) -> PreparedCorpus | None:
    """The earlier version of corpus ``name`` kept under ``.versions`` that the run trained on, if any."""
    kept = [kept_version_path(root, name, trained_on.fingerprint)] if trained_on.fingerprint else []
    folder = root / VERSIONS / name
    kept += sorted(folder.iterdir()) if trained_on.content and folder.is_dir() else []
    for path in kept:
        if os.path.lexists(path / META):
            corpus = open_prepared(path)
            if trained_on.matches(corpus):
                return corpus
    return None


def vocabulary_size(name: str, data_dir: str | Path | None = None) -> tuple[int | None, bool]:
    """The vocabulary size of corpus ``name``: its prepared form's, else the size its recipe
    documents (the second value says it was assumed); None when neither is known."""
    try:
        return load_corpus(name, data_dir).vocab_size, False
    except CharlmError:
        recipe = RECIPES.get(name)
        return (recipe.vocab_size if recipe else None), True


def _how_to_prepare(name: str, root: Path) -> str:
    subword = re.fullmatch(r"(.+)-(bpe|unigram)(\d+)", name)
    if name in RECIPES and name != "text":
        recipe, options = RECIPES[name], ""
    elif subword and subword[1] in RECIPES and subword[1] != "text":
        recipe, options = RECIPES[subword[1]], f" --subword {subword[2]} --vocab-size {subword[3]}"
    else:
        own_text = f"`charlm prepare text PATH... --name {name}`"
        close = closest(name, [*(known for known in RECIPES if known != "text"), *prepared_names(root)])
        if close:
            return f"did you mean {close!r}? (or prepare your own text under this name with {own_text})"
        return (
            f"it is not a built-in corpus either (those are {', '.join(n for n in RECIPES if n != 'text')}); "
            f"prepare your own text with {own_text}"
        )
    command = f"charlm prepare {recipe.name}"
    if not recipe.inputs.downloads:
        return f"run `{command}{options}`"
    return f"run `{command}{options}` (or `{command} --source PATH{options}` with a local copy)"


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
