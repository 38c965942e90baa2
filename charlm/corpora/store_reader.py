"""The validating reader of a prepared corpus: ``meta.json``, the split arrays and their checksums.

Checked before anything is used or allocated: ``meta.json`` (its format version, the kind of each field,
their agreement, the tokenizer), each ``.npy`` header (integer ids in one dimension, as many as recorded,
in as many bytes as promised); when a split is first used, its ids (all in the vocabulary) and its sha256
(recorded under ``files``; corpora prepared before checksums have none). Every failure is a
``DamagedCorpus``: one line naming the file, with the ``charlm prepare`` command that makes it again.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import tokenize
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from charlm.corpora.root import META
from charlm.corpora.splits import SPLITS
from charlm.corpora.tokenizer import Tokenizer
from charlm.corpora.tokenizer_kinds import tokenizer_from_state
from charlm.corpora.vocabulary import vocabulary_problem
from charlm.errors import CharlmError, kind_of, shown
from charlm.corpora.recipes import RECIPES

SUBWORD_MODEL = "tokenizer.model"
CHUNK = 1 << 24  # bytes per pass when a split's ids are checked and hashed: bounds what one pass touches
UNITS = {"char": ("char",), "byte": ("byte",), "word": ("word",), "subword": ("subword", "vowel-linked")}
REQUIRED = {"name": str, "unit": str, "vocab_size": int, "vocab": list, "splits": dict, "tokenizer": dict}
FIELDS = {**REQUIRED, "description": str, "verified": bool, "files": dict}  # what charlm reads, of the kind it reads


class DamagedCorpus(CharlmError):
    """A prepared corpus's file is damaged: ``file`` and ``problem`` say how; the message adds what to run."""

    def __init__(self, file: Path, problem: str, advice: str):
        self.file, self.problem = Path(file), problem
        super().__init__(f"{file}: {problem}; {advice}")


@dataclass(frozen=True)
class ArrayLayout:
    """Where a split's token ids lie in its ``.npy`` file."""

    dtype: np.dtype
    length: int
    offset: int  # bytes of header before the ids


def _fail(file: Path, directory: Path, meta, problem: str):
    raise DamagedCorpus(file, problem, f"run `{prepare_command(directory, meta)}` to prepare it again")


def prepare_command(directory: Path, meta=None) -> str:
    """The ``charlm prepare`` command that made the corpus in ``directory`` (from its metadata when readable)."""
    name = Path(directory).name
    request = meta.get("request") if isinstance(meta, dict) else None
    request = request if isinstance(request, dict) else {}
    recipe, kind, size = request.get("recipe"), request.get("subword_kind"), request.get("vocab_size")
    if not isinstance(recipe, str) or recipe not in RECIPES:  # no usable record: judged by the name
        subword = re.fullmatch(r"(.+)-(bpe|unigram)(\d+)", name)
        recipe, kind, size = (
            (subword[1], subword[2], subword[3])
            if subword and subword[1] in RECIPES
            else (name if name in RECIPES else "text", None, None)
        )
    words = ["charlm prepare", recipe]
    if recipe == "text":
        words += ["PATH...", "--name", re.sub(r"-(bpe|unigram)\d+$|-vowel-linked$", "", name) if kind else name]
    if kind and (RECIPES[recipe].unit != "subword" or kind != RECIPES[recipe].subword_kind):
        words += ["--subword", str(kind)] + (
            [] if kind == "vowel-linked" or size is None else ["--vocab-size", str(size)]
        )
    return " ".join(words)


# --- meta.json -----------------------------------------------------------------------------------


def read_checked_meta(directory: Path, format_version: int) -> dict:
    """``directory``'s ``meta.json``, every key the corpus needs present, of its kind, and agreeing with the others."""
    path, meta = Path(directory) / META, None

    def fail(problem):
        _fail(path, directory, meta, problem)  # the advice from what meta.json records, when it can be read

    try:
        with _opened(path, directory, None) as file:
            meta = json.loads(file.read().decode("utf-8"))
    except (ValueError, RecursionError) as error:  # not UTF-8, not JSON, nested too deeply
        fail(f"is not JSON ({str(error).splitlines()[0][:120]})")
    if not isinstance(meta, dict):
        fail(f"holds {kind_of(meta)}, not an object")
    if meta.get("format_version") != format_version:
        version = shown(meta["format_version"]) if "format_version" in meta else "unknown"
        fail(f"was written in format {version}, this charlm reads format {format_version}")
    for key, kind in FIELDS.items():  # JSON makes no subclasses: ``type(...) is int`` also refuses true
        if key not in meta and key in REQUIRED:
            fail(f"has no {key!r}")
        if key in meta and type(meta[key]) is not kind:
            fail(f"is damaged: {key!r} is {kind_of(meta[key])} ({shown(meta[key], 40)})")
    state, vocab = meta["tokenizer"], meta["vocab"]
    if len(vocab) != meta["vocab_size"]:
        fail(f"has a vocab of {len(vocab):,} entries, but vocab_size {meta['vocab_size']:,}")
    if state.get("vocab") != vocab:
        fail("has a tokenizer whose vocab differs from meta.json's 'vocab'")
    problem = vocabulary_problem(state)  # the tokenizer's kind among them
    if problem is not None:
        fail(f"has a tokenizer whose {problem}")
    if state["kind"] not in UNITS.get(meta["unit"], ()):
        fail(f"has a {state['kind']} tokenizer for a corpus of unit {shown(meta['unit'], 40)}")
    for which in SPLITS:
        record = meta["splits"].get(which)
        if not isinstance(record, dict):
            fail(f"has no record of the {which} split")
        for count in ("tokens", "characters"):
            if type(record.get(count)) is not int or record[count] < 0:
                fail(f"has {which} {count} {shown(record.get(count), 40)}, not a count")
        if record["tokens"] > 0 and record["characters"] == 0:  # characters divide the loss: bits per character
            fail(f"says the {which} split's {record['tokens']:,} tokens hold no characters")
    for name, record in meta.get("files", {}).items():  # what the files' sizes and checksums are compared with
        record = record if isinstance(record, dict) else {}
        if type(record.get("bytes")) is not int or not re.fullmatch(r"[0-9a-f]{64}", str(record.get("sha256"))):
            fail(f"has a damaged checksum record for {name!r}")
    return meta


def build_tokenizer(meta: dict, directory: Path) -> Tokenizer:
    """The tokenizer ``meta`` describes (a subword corpus's model read from its file and checked)."""
    state, subword = dict(meta["tokenizer"]), meta["tokenizer"]["kind"] == "subword"
    path = Path(directory) / (SUBWORD_MODEL if subword else META)
    if subword:
        with _opened(path, directory, meta) as file:
            model = state["model"] = file.read()
        record = meta.get("files", {}).get(SUBWORD_MODEL)
        if record and (len(model), hashlib.sha256(model).hexdigest()) != (record["bytes"], record["sha256"]):
            _fail(path, directory, meta, "differs from the checksum meta.json records for it")
    try:
        tokenizer = tokenizer_from_state(state)
    except (RuntimeError, OSError, ValueError, TypeError, KeyError, IndexError) as error:
        what = "is not a sentencepiece model" if subword else "does not describe a tokenizer"
        _fail(path, directory, meta, f"{what} ({(str(error).splitlines() or [type(error).__name__])[0][:120]})")
    if tokenizer.vocab != meta["vocab"]:
        _fail(path, directory, meta, "holds another vocabulary than meta.json")
    return tokenizer


# --- the split arrays ----------------------------------------------------------------------------


def array_layout(path: Path, which: str, meta: dict, directory: Path) -> ArrayLayout:
    """Check the header and size of split ``which``'s array at ``path`` against ``meta`` (none of its ids is read)."""

    def fail(problem):
        _fail(path, directory, meta, problem)

    with _opened(path, directory, meta) as file:
        size = os.fstat(file.fileno()).st_size
        try:  # numpy refuses what is not a .npy array, and headers too long to parse safely
            version = np.lib.format.read_magic(file)
            if version not in ((1, 0), (2, 0)):
                fail(f"is a .npy file of version {version}, which charlm does not write")
            read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            shape, _, dtype = read(file)
            offset = file.tell()
        except (ValueError, tokenize.TokenError) as error:  # TokenError: a header cut short
            fail(f"is not a readable .npy array ({str(error).splitlines()[0][:120]})")
    if dtype.kind not in "iu":
        fail(f"holds {dtype} values, not integer token ids")
    if len(shape) != 1 or shape[0] < 0:
        fail(f"holds an array of shape {shape}, not one dimension of token ids")
    length, tokens = shape[0], meta["splits"][which]["tokens"]
    expected = offset + length * dtype.itemsize
    if size < expected:
        fail(f"is truncated: its header promises {length:,} token ids in {expected:,} bytes, the file has {size:,}")
    if length != tokens:
        fail(f"holds {length:,} token ids, but meta.json records {tokens:,} for the {which} split")
    return ArrayLayout(dtype, length, offset)


def check_ids(path: Path, array: np.ndarray, layout: ArrayLayout, meta: dict, directory: Path) -> None:
    """Check that every id of ``array`` (the memory-mapped split at ``path``) is below the vocabulary
    size, and the file's checksum where ``meta.json`` records one; one pass, a chunk at a time."""
    record = meta.get("files", {}).get(path.name)
    with open(path, "rb") as file:  # the header's bytes first: the checksum is the whole file's (``sha256sum``)
        digest = hashlib.sha256(file.read(layout.offset)) if record else None
    size, dtype = meta["vocab_size"], layout.dtype
    needs_range = dtype.kind == "i" or np.iinfo(dtype).max >= size
    step = max(1, CHUNK // dtype.itemsize)
    for start in range(0, layout.length, step):
        chunk = np.ascontiguousarray(array[start : start + step])
        if digest is not None:
            digest.update(chunk.view(np.uint8))
        if not needs_range:
            continue
        high, low = int(chunk.max()), int(chunk.min()) if dtype.kind == "i" else 0
        if high >= size or low < 0:
            bad = high if high >= size else low
            where = start + int(np.flatnonzero(chunk == bad)[0])
            problem = f"holds the token id {bad:,} at position {where:,}, outside the vocabulary of {size:,}"
            _fail(path, directory, meta, problem)
    if digest is not None and digest.hexdigest() != record["sha256"]:
        _fail(path, directory, meta, "differs from the checksum meta.json records for it (its contents are damaged)")


@contextlib.contextmanager
def _opened(path: Path, directory: Path, meta):
    """``path`` open for reading; a file missing or unreadable is a damaged corpus, to prepare again."""
    try:
        with open(path, "rb") as file:
            yield file
    except FileNotFoundError:  # a link to nowhere too
        _fail(path, directory, meta, "is missing")
    except OSError as error:  # a directory, no permission, a loop of links
        _fail(path, directory, meta, f"cannot be read ({error.strerror or error})")


def file_record(path: Path) -> dict:
    """What ``meta.json``'s ``files`` records of a file just written: its size and sha256."""
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        while block := file.read(CHUNK):
            digest.update(block)
    return {"bytes": path.stat().st_size, "sha256": digest.hexdigest()}
