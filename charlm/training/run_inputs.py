"""What a new run trains on when it is given text: ``--text FILE`` (or a file given as ``--corpus``)
prepared into a corpus of the data root in the same step, and an evaluation batch a short split allows.

    charlm train --text input.txt          # prepares data/input (90/5/5, as `charlm prepare text`), then trains

The corpus is named after the first file (``input.txt`` → ``input``) unless ``--corpus NAME`` is
given. It is reused, not prepared again, when the prepared corpus of that name records the same
sha256 for its files' contents as the files have now (``meta.json``'s ``sources``), and is not
damaged; when the same files have changed, it is prepared again. A name that belongs to a built-in corpus, or
to a corpus prepared
from other files, is refused rather than overwritten.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
from pathlib import Path

from charlm.config import TrainConfig
from charlm.corpora.catalog import load_corpus
from charlm.corpora.inputs import GatherRequest, LocalTextFiles
from charlm.corpora.prepare import CORPUS_NAME, damage_of, prepare_corpus
from charlm.corpora.recipes import RECIPES
from charlm.corpora.root import META, data_root
from charlm.corpora.splits import DEFAULT_FRACTIONS, SPLITS
from charlm.corpora.store import read_meta
from charlm.errors import CharlmError, ConfigError
from charlm.files import is_plain_name
from charlm.logs import info
from charlm.runtime.distributed import environment_rank, launched_by_torchrun


def new_run_inputs(config: TrainConfig, given, log=None) -> TrainConfig:
    """``config`` with its text prepared (``corpus`` then names the prepared corpus) and, when
    ``eval_batch_size`` is not among ``given`` (the settings set explicitly), an evaluation batch
    that the validation and test splits can hold."""
    log = log or _rank_zero_info
    config.validate()  # every setting before any text is read or prepared
    corpus_named = "corpus" in given
    if not config.text and corpus_named:
        if is_text_file(config.corpus, config.data_dir):
            config, corpus_named = dataclasses.replace(config, text=[config.corpus]), False
        elif not is_plain_name(config.corpus):  # a path, not a name: say what it is
            check_corpus_path(config.corpus)
    if config.text:
        config = prepare_text(config, corpus_named=corpus_named, log=log)
    if "eval_batch_size" not in given:
        config = fit_eval_batch(config, log)
    return config


def is_text_file(corpus: str, data_dir=None) -> bool:
    """Whether ``--corpus`` names a file to train on rather than a prepared corpus (which wins)."""
    return os.path.isfile(corpus) and not os.path.lexists(data_root(data_dir) / corpus / META)


def check_corpus_path(corpus: str) -> None:
    """One line for a ``--corpus`` that is a path, but not to a file to train on."""
    if os.path.isdir(corpus):
        raise CharlmError(f"--corpus {corpus} is a directory: to train on the text files in it, give --text {corpus}")
    if not os.path.exists(corpus):
        raise CharlmError(
            f"--corpus {corpus} is not a corpus name, and as a file it does not exist: give a "
            "prepared corpus (see `charlm corpora`) or a text file"
        )


def corpus_name_for(path: str) -> str:
    """The corpus a text file is prepared as: its name without the extension (a directory's name),
    with anything but letters, digits, '.', '_' and '-' turned into '-'."""
    path = Path(os.path.abspath(path))
    stem = path.name if path.is_dir() else path.stem
    return re.sub(r"[^A-Za-z0-9._-]+", "-", stem).strip("._-")[:200] or "text"  # a name, as is_plain_name has it


def prepare_text(config: TrainConfig, *, corpus_named: bool, log) -> TrainConfig:
    """``config`` training on its ``text``, prepared (or reused) as a corpus of the data root."""
    shown = ", ".join(config.text)
    name = config.corpus if corpus_named else corpus_name_for(config.text[0])
    another = f"name the corpus of {shown} with --corpus NAME"
    if name in RECIPES:
        raise CharlmError(f"{name!r} is a built-in corpus (see `charlm corpora`): {another}")
    if not CORPUS_NAME.fullmatch(name):
        raise CharlmError(f"corpus name {name!r} must be letters, digits, '.', '_' or '-' (not starting with one)")
    root = data_root(config.data_dir)
    target = root / name
    paths = tuple(Path(os.path.abspath(path)) for path in config.text)
    gathered = LocalTextFiles().gather(GatherRequest(data_root=root, paths=paths, progress=False, log=log))
    sources = {path: hashlib.sha256(data).hexdigest() for path, data in gathered.files.items()}
    trained = dataclasses.replace(config, corpus=name)
    changed = False
    meta = read_meta(target) if os.path.lexists(target) else None  # None also for an unreadable meta.json
    if os.path.lexists(target) and meta is None and not os.path.lexists(target / META):
        raise CharlmError(f"{target} is already there, and is not a prepared corpus: {another}")
    if meta is not None:  # (a damaged meta.json: prepared again below, as `charlm prepare` does)
        recorded = meta.get("sources") if isinstance(meta.get("sources"), dict) else {}
        if meta.get("recipe") != "text":
            raise CharlmError(f"{target} is already another corpus ({meta.get('recipe')}): {another}")
        if sorted(map(str, recorded.values())) == sorted(sources.values()):
            if damage_of(target) is None:
                log(f"reusing corpus {name!r} in {target}: prepared from {shown}, unchanged (the same sha256)")
                return trained
        elif {os.path.abspath(str(path)) for path in recorded} == set(sources):
            changed = True
        else:
            where = ", ".join(map(str, recorded)) or "other files"
            raise CharlmError(f"corpus {name!r} in {root}/ was prepared from other text ({where}): {another}")
    if launched_by_torchrun() and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise CharlmError(
            f"under torchrun, prepare the text before training: `charlm prepare text {shown} --name {name}`,"
            f" then train with --corpus {name}"
        )
    unknown = "unk" if _needs_unknown(gathered.files) else "error"
    del gathered
    corpus = prepare_corpus(
        "text", data_dir=root, paths=paths, output_name=name, unknown=unknown, progress=False, log=log
    )
    sizes = " / ".join(f"{corpus.tokens(split):,}" for split in SPLITS)
    unk = ", <unk> for the symbols of valid/test absent from train" if unknown == "unk" else ""
    log(
        f"{shown + ' changed: prepared it again' if changed else 'prepared ' + shown} as corpus {name!r} in {target} "
        f"{'(the earlier version kept for the runs that used it) ' if changed else ''}"
        f"({sizes} tokens, train / valid / test, char vocabulary {corpus.vocab_size}{unk})"
    )
    return trained


def _needs_unknown(files: dict[str, bytes]) -> bool:
    """Whether the valid or test split of these files (as `prepare text` splits them) has a symbol
    the training split lacks, so that the corpus needs an <unk> entry."""
    splits = RECIPES["text"].parse(dict(files), DEFAULT_FRACTIONS)
    return bool((set(splits["valid"]) | set(splits["test"])) - set(splits["train"]))


def check_text_corpus(config: TrainConfig) -> None:
    """Refuse ``text`` given straight to a ``Trainer`` (which prepares nothing) beside a corpus that
    was not prepared from text: the run would train on that corpus (pydoc by default) instead."""
    meta = read_meta(data_root(config.data_dir) / config.corpus) if config.text else None
    if config.text and (meta.get("recipe") != "text" if meta else config.corpus in RECIPES):
        raise ConfigError(
            TrainConfig,
            "text",
            f"names files, but corpus {config.corpus!r} was not prepared from text: "
            "charlm.train(text=...) and `charlm train --text` prepare them",
        )


def fit_eval_batch(config: TrainConfig, log) -> TrainConfig:
    """``config`` with ``eval_batch_size`` lowered to the predictions of its shortest evaluation split,
    where that is fewer (said in one line); unchanged when the corpus is not prepared (the trainer
    says so) or a split has nothing to predict."""
    try:
        corpus = load_corpus(config.corpus, config.data_dir)
    except CharlmError:
        return config
    split, predictions = min(((split, corpus.tokens(split) - 1) for split in ("valid", "test")), key=lambda p: p[1])
    if predictions < 1 or config.eval_batch_size <= predictions:
        return config
    log(
        f"--eval-batch-size {predictions:,}, not {config.eval_batch_size:,}: the {split} split of {config.corpus!r} "
        f"has only {predictions:,} predictions"
    )
    return dataclasses.replace(config, eval_batch_size=predictions)


def _rank_zero_info(message: str) -> None:
    if environment_rank() == 0:  # under torchrun every process decides the same; one of them says so
        info(message)
