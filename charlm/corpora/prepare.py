"""``prepare_corpus``: gather a recipe's inputs, split them, build the vocabulary, encode, write atomically.

Preparing again with the same inputs and options does nothing (and says so): the prepared
corpus's ``meta.json`` keeps a fingerprint of both.
"""

import datetime
import hashlib
import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from charlm import __version__
from charlm.config_tools import PrepareConfig
from charlm.corpora.catalog import get_recipe
from charlm.corpora.download import DownloadPolicy
from charlm.corpora.inputs import GatherRequest
from charlm.corpora.recipes import RECIPES, Recipe
from charlm.corpora.root import data_root
from charlm.corpora.splits import DEFAULT_FRACTIONS, SPLITS, check_fractions
from charlm.corpora.store import (
    FORMAT_VERSION,
    PreparedCorpus,
    open_prepared,
    read_meta,
    remove_abandoned_staging,
    write_prepared,
)
from charlm.corpora.store_reader import DamagedCorpus
from charlm.corpora.subword import SUBWORD_KINDS, train_subword_tokenizer
from charlm.corpora.tokenizer import UNK, ByteTokenizer, CharTokenizer, Tokenizer
from charlm.corpora.word_tokenizers import WordTokenizer
from charlm.logs import info as log_info
from charlm.errors import CharlmError, OutOfVocabulary
from charlm.files import path_value

UNKNOWN_POLICIES = ("error", "unk")
CORPUS_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


@dataclass(frozen=True)
class PrepareOptions:
    """Everything besides the input files that decides what a preparation produces."""

    recipe: str
    name: str  # the prepared corpus's directory name
    unit: str  # "char", "byte" or "subword"
    subword_kind: str | None
    vocab_size: int | None  # of a subword model; a character vocabulary is what the text has
    fractions: tuple[float, float, float] | None
    unknown: str

    @classmethod
    def resolve(
        cls, recipe: Recipe, *, subword, vocab_size, split, unknown, output_name, force: bool = False
    ) -> "PrepareOptions":
        if unknown not in UNKNOWN_POLICIES:
            raise CharlmError(f"--unknown must be one of {', '.join(UNKNOWN_POLICIES)}, not {unknown!r}")
        if (
            split is not None
            and not recipe.user_split
            and tuple(map(float, split)) not in (recipe.fractions, DEFAULT_FRACTIONS)
        ):
            raise CharlmError(
                f"{recipe.name} has a fixed split ({recipe.split_rule()}): --split applies to "
                "`charlm prepare text` only"
            )
        if recipe.user_split and not output_name:
            raise CharlmError(f"`charlm prepare {recipe.name}` needs --name NAME for the prepared corpus")
        if subword is not None and subword not in SUBWORD_KINDS:
            raise CharlmError(f"--subword must be one of {', '.join(SUBWORD_KINDS)}, not {subword!r}")
        name, unit, kind = output_name or recipe.name, recipe.unit, None
        if recipe.unit == "subword":
            kind = subword or recipe.subword_kind
        elif subword is not None:
            suffix = subword if subword == "vowel-linked" else f"{subword}{vocab_size}"
            name, unit, kind = f"{name}-{suffix}", "subword", subword
        if not CORPUS_NAME.fullmatch(name):
            raise CharlmError(f"corpus name {name!r} must be letters, digits, '.', '_' or '-' (not starting with one)")
        if name != recipe.name and name in RECIPES and not force:  # it would replace the built-in corpus of that name
            raise CharlmError(
                f"{name!r} is a built-in corpus ({RECIPES[name].description}): choose another --name, "
                f"or pass --force to prepare {recipe.name} under that name instead"
            )
        fractions = check_fractions(split) if split is not None else recipe.fractions
        if kind == "vowel-linked":
            vocab_size = recipe.vowel_symbols  # the size its paper gives, or None: the cutoff 15
        return cls(recipe.name, name, unit, kind, vocab_size if kind else None, fractions, unknown)

    def request(self) -> dict:
        """The options as stored in meta.json (JSON types, so a stored copy compares equal)."""
        return json.loads(json.dumps({"format_version": FORMAT_VERSION, **asdict(self)}))


def prepare_corpus(
    name: str | Recipe,
    *,
    data_dir=None,
    source=None,
    url=None,
    verify: bool = True,
    subword: str | None = None,
    vocab_size: int = PrepareConfig.vocab_size,
    paths=None,
    output_name: str | None = None,
    split=None,
    unknown: str | None = None,
    progress: bool = True,
    force: bool = False,
    download_policy: DownloadPolicy | None = None,
    log=None,
) -> PreparedCorpus:
    """Prepare corpus ``name`` (a recipe name, or a ``Recipe``) in the data root, and return it.

    ``source``: a local copy (archive, directory or file) instead of downloading; ``url``: a mirror;
    ``verify=False`` uses files whose checksums differ, with a warning. ``subword``/``vocab_size``:
    a sentencepiece model ("bpe" or "unigram"); a character corpus becomes ``<name>-<kind><N>``.
    ``paths``, ``output_name`` and ``split`` (train, valid, test fractions; default 0.9, 0.05, 0.05)
    are for ``text``; ``force`` lets ``output_name`` be a built-in corpus's name. ``unknown="unk"`` maps
    valid/test symbols absent from training to an unknown entry instead of failing; None takes the recipe's
    default ("error" except for ``pydoc``). Messages go to ``log`` (default: stderr); ``progress=False`` keeps only
    warnings and the "nothing to do" notice, and no progress bars.
    """
    log = log or log_info
    say = log if progress else _silent  # progress messages; warnings and "nothing to do" always go to log
    source = None if source is None else path_value(source, "--source")
    paths = tuple(path_value(path, "a path to prepare") for path in paths or ())
    recipe = name if isinstance(name, Recipe) else get_recipe(name)
    options = PrepareOptions.resolve(
        recipe,
        subword=subword,
        vocab_size=vocab_size,
        split=split,
        unknown=unknown or recipe.unknown,
        output_name=output_name,
        force=force,
    )
    root = data_root(data_dir)
    for done in remove_abandoned_staging(root):
        say(f"{done}, left in {root} by a preparation that was killed")
    target = root / options.name
    request = options.request()
    existing = read_meta(target)
    if target.exists() and (damage := damage_of(target)) is not None:  # never "nothing to do" over a damaged corpus
        log(f"{damage.file}: {damage.problem}: preparing {options.name} again")
        existing = None

    if (
        existing
        and recipe.inputs.downloads
        and source is None
        and url is None
        and existing.get("request") == request
        and (existing.get("verified") or not verify)
    ):
        return _nothing_to_do(target, log)
    gathered = recipe.inputs.gather(
        GatherRequest(
            data_root=root,
            source=source,
            url=url,
            paths=paths,
            verify=verify,
            policy=download_policy,
            progress=progress,
            log=log,
        )
    )
    sources = {member: hashlib.sha256(data).hexdigest() for member, data in sorted(gathered.files.items())}
    fingerprint = sha256_of_json({"request": request, "sources": sources})
    if existing and existing.get("fingerprint") == fingerprint:
        return _nothing_to_do(target, log)

    say(f"{options.name}: reading {gathered.origin}")
    origin, verified = gathered.origin, gathered.verified
    splits = recipe.parse(gathered.files, options.fractions)
    del gathered
    if options.unit in ("subword", "word"):
        splits = {which: as_text(part) for which, part in splits.items()}
    if options.subword_kind == "vowel-linked" and recipe.word_text is not None:
        splits = {which: recipe.word_text(part) for which, part in splits.items()}
    say(f"{options.name}: building the {options.unit} vocabulary from the training split")
    tokenizer = build_tokenizer(recipe, options, splits["train"])
    arrays = encode_splits(tokenizer, splits)
    meta = {
        "format_version": FORMAT_VERSION,
        "name": options.name,
        "recipe": recipe.name,
        "description": describe(recipe, options),
        "unit": options.unit,
        "vocab_size": tokenizer.vocab_size,
        "vocab": tokenizer.vocab,
        "dtype": str(arrays["train"].dtype),
        "splits": {which: {"tokens": len(arrays[which]), "characters": len(splits[which])} for which in SPLITS},
        "split_rule": recipe.split_rule(options.fractions),
        "unknown": options.unknown,
        "subword": subword_meta(options, tokenizer),
        "sources": sources,
        "origin": origin,
        "verified": verified,
        "request": request,
        "fingerprint": fingerprint,
        "charlm_version": __version__,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    write_prepared(root, options.name, arrays, meta, tokenizer)
    corpus = open_prepared(target)
    say(f"{options.name}: wrote {target}")
    return corpus


def subword_meta(options: PrepareOptions, tokenizer: Tokenizer) -> dict | None:
    """meta.json's ``subword``: the kind, the size asked for, and a vowel-linked vocabulary's cutoff."""
    if not options.subword_kind:
        return None
    meta = {"kind": options.subword_kind, "vocab_size": options.vocab_size}
    if options.subword_kind == "vowel-linked":
        meta["min_count"] = tokenizer.min_count
    return meta


def describe(recipe: Recipe, options: PrepareOptions) -> str:
    if options.unit == recipe.unit:
        return recipe.description
    if options.subword_kind == "vowel-linked":
        return f"{recipe.description}; as vowel-linked subwords (the Delta-RNN paper's scheme)"
    return f"{recipe.description}; as {options.subword_kind} subwords, {options.vocab_size} pieces"


def build_tokenizer(recipe: Recipe, options: PrepareOptions, train) -> Tokenizer:
    """The tokenizer of ``options.unit``, its vocabulary taken from the training split only."""
    unk = UNK if options.unknown == "unk" else None
    builders = {
        "char": lambda: CharTokenizer.build(as_text(train), unk=unk, space_symbol=recipe.space_symbol),
        "byte": lambda: ByteTokenizer.build(train, unk=unk),
        "word": lambda: WordTokenizer.build(as_text(train), unk=unk),
        "subword": lambda: train_subword_tokenizer(
            train, options.subword_kind, options.vocab_size, allow_unknown=unk is not None
        ),
    }
    return builders[options.unit]()


def encode_splits(tokenizer: Tokenizer, splits: dict) -> dict[str, np.ndarray]:
    """Token ids of every split; symbols outside the training vocabulary are an error unless it has ``unk``."""
    arrays = {}
    for which in SPLITS:
        try:
            arrays[which] = tokenizer.encode_array(splits[which])
        except OutOfVocabulary as error:
            shown = ", ".join(map(repr, error.symbols[:10])) + (" …" if len(error.symbols) > 10 else "")
            raise CharlmError(
                f"the {which} split has symbols that the training split lacks: {shown}; "
                "pass --unknown unk to map them to an unknown-symbol entry"
            ) from None
    return arrays


def sha256_of_json(value) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode("utf-8")).hexdigest()


def as_text(part) -> str:
    """A split as text: bytes of a byte corpus are decoded as UTF-8 (undecodable bytes become U+FFFD)."""
    return part if isinstance(part, str) else bytes(part).decode("utf-8", errors="replace")


def damage_of(target: Path) -> DamagedCorpus | None:
    """What is wrong with the prepared corpus at ``target`` (every split's ids and checksum
    checked), or None when nothing is."""
    try:
        open_prepared(target).verify()
    except DamagedCorpus as damage:
        return damage
    return None


def _nothing_to_do(target: Path, log) -> PreparedCorpus:
    log(f"{target.name} is already prepared in {target} from the same inputs: nothing to do")
    return open_prepared(target)


def _silent(message: str) -> None:
    pass
