"""The validating reader of a prepared corpus: ``meta.json``, the split arrays and their checksums.

Everything read from a prepared corpus is checked here before it is used or allocated: the types,
ranges and consistency of ``meta.json`` (its tokenizer included), then each ``.npy`` array's header
(an integer dtype, one dimension, the length ``meta.json`` records, as many bytes as the header
promises), and, when a split is first used, its token ids (all below the vocabulary size) and its
checksum (the sha256 of the whole ``.npy`` file, recorded in ``meta.json`` under ``files`` by this
charlm; a corpus prepared before has none and gets the other checks only). Every failure is a
``DamagedCorpus``: one line naming the file, with the ``charlm prepare`` command that makes it again.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import tokenize
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from charlm.corpora.root import META
from charlm.corpora.splits import SPLITS
from charlm.corpora.tokenizer import Tokenizer
from charlm.corpora.tokenizer_kinds import TOKENIZER_KINDS, tokenizer_from_state
from charlm.corpora.vocabulary import vocabulary_problem
from charlm.errors import CharlmError
from charlm.files import file_kind

SUBWORD_MODEL = "tokenizer.model"
CHUNK = 1 << 24  # bytes per pass when a split's ids are checked and hashed: bounds what one pass touches
HEADER_LIMIT = 1 << 16  # the most bytes of a .npy header read (numpy itself refuses longer ones)
UNITS = {"char": ("char",), "byte": ("byte",), "word": ("word",), "subword": ("subword", "vowel-linked")}
REQUIRED = {"name": str, "unit": str, "vocab_size": int, "vocab": list, "splits": dict, "tokenizer": dict}
OPTIONAL = {
    "description": str,
    "recipe": str,
    "dtype": str,
    "verified": bool,
    "request": dict,
    "fingerprint": str,
    "files": dict,
}
TYPE_NAMES = {str: "a string", int: "an integer", list: "a list", dict: "an object", bool: "true or false"}


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
    from charlm.corpora.recipes import RECIPES

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
    """``directory``'s ``meta.json``, every key the corpus needs present and checked."""
    path = Path(directory) / META
    raw = _read_file(path, directory, None)
    try:
        meta = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as error:
        _fail(path, directory, None, f"is not JSON ({str(error).splitlines()[0][:120]})")
    if not isinstance(meta, dict):
        _fail(path, directory, None, f"holds {_json_kind(meta)}, not an object")
    if meta.get("format_version") != format_version:
        _fail(
            path,
            directory,
            meta,
            "has no 'format_version'"
            if "format_version" not in meta
            else f"was written in format {_shown(meta['format_version'])}, this charlm reads format {format_version}",
        )
    check_meta(meta, path, directory)
    return meta


def check_meta(meta: dict, path: Path, directory: Path) -> None:
    """Refuse metadata whose keys, types or values are wrong or disagree with each other."""

    def fail(problem):
        _fail(path, directory, meta, problem)

    for key, kind in {**REQUIRED, **OPTIONAL}.items():
        if key not in meta:
            if key in REQUIRED:
                fail(f"has no {key!r}")
        elif not _is(meta[key], kind) and not (key in ("recipe", "dtype") and meta[key] is None):
            fail(f"has {key!r} {_shown(meta[key])}, not {TYPE_NAMES[kind]}")
    if meta["unit"] not in UNITS:
        fail(f"has unit {_shown(meta['unit'])}, not one of {', '.join(UNITS)}")
    size, vocab = meta["vocab_size"], meta["vocab"]
    if size < 1:
        fail(f"has vocab_size {size}")
    if len(vocab) != size:
        fail(f"has a vocab of {len(vocab):,} entries, but vocab_size {size:,}")
    _check_splits(meta, fail)
    _check_tokenizer(meta, fail)
    if "files" in meta:
        for name, record in meta["files"].items():
            if not (
                isinstance(record, dict)
                and _is(record.get("bytes"), int)
                and record["bytes"] >= 0
                and isinstance(record.get("sha256"), str)
                and re.fullmatch(r"[0-9a-f]{64}", record["sha256"])
            ):
                fail(f"has a damaged checksum record for {name!r}")


def _check_splits(meta: dict, fail) -> None:
    splits = meta["splits"]
    for which in SPLITS:
        record = splits.get(which)
        if not isinstance(record, dict):
            fail(f"has no record of the {which} split")
        for count in ("tokens", "characters"):
            if not _is(record.get(count), int) or record[count] < 0:
                fail(f"has {which} {count} {_shown(record.get(count))}, not a count")
        if record["tokens"] > 0 and record["characters"] == 0:
            fail(f"says the {which} split's {record['tokens']:,} tokens hold no characters")


def _check_tokenizer(meta: dict, fail) -> None:
    state, vocab = meta["tokenizer"], meta["vocab"]
    kind = state.get("kind")
    if not isinstance(kind, str) or kind not in TOKENIZER_KINDS:  # a list is no key of the table
        fail(f"names the tokenizer kind {_shown(kind)}, not one of {', '.join(TOKENIZER_KINDS)}")
    if kind not in UNITS[meta["unit"]]:
        fail(f"has a {kind} tokenizer for a {meta['unit']} corpus")
    if state.get("vocab") != vocab:
        fail("has a tokenizer whose vocab differs from meta.json's 'vocab'")
    problem = vocabulary_problem(state)
    if problem is not None:
        fail(f"has a tokenizer whose {problem}")


def build_tokenizer(meta: dict, directory: Path) -> Tokenizer:
    """The tokenizer ``meta`` describes (a subword corpus's model read from its file and checked)."""
    state, subword = dict(meta["tokenizer"]), meta["tokenizer"]["kind"] == "subword"
    path = Path(directory) / (SUBWORD_MODEL if subword else META)
    if subword:
        state["model"] = _read_file(path, directory, meta)
        record = meta.get("files", {}).get(SUBWORD_MODEL)
        if record and (
            len(state["model"]) != record["bytes"] or hashlib.sha256(state["model"]).hexdigest() != record["sha256"]
        ):
            _fail(path, directory, meta, "differs from the checksum meta.json records for it")
    try:
        tokenizer = tokenizer_from_state(state)
    except (RuntimeError, OSError, ValueError, TypeError, KeyError, IndexError) as error:
        what = "is not a sentencepiece model" if subword else "does not describe a tokenizer"
        _fail(
            path,
            directory,
            meta,
            f"{what} ({str(error).splitlines()[0][:120] if str(error) else type(error).__name__})",
        )
    if tokenizer.vocab != meta["vocab"]:
        _fail(path, directory, meta, "holds another vocabulary than meta.json")
    return tokenizer


# --- the split arrays ----------------------------------------------------------------------------


def array_layout(path: Path, which: str, meta: dict, directory: Path) -> ArrayLayout:
    """Check the header and size of split ``which``'s array at ``path`` against ``meta`` (nothing of its ids is
    read)."""

    def fail(problem):
        _fail(path, directory, meta, problem)

    with _open_regular(path, directory, meta) as file:
        status = os.fstat(file.fileno())
        try:
            version = np.lib.format.read_magic(file)
            if version not in ((1, 0), (2, 0)):
                fail(f"is a .npy file of version {version}, which charlm does not write")
            read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            shape, _, dtype = read(file, max_header_size=HEADER_LIMIT)
            offset = file.tell()
        except (ValueError, TypeError, SyntaxError, OverflowError, OSError, tokenize.TokenError) as error:
            fail(f"is not a readable .npy array ({str(error).splitlines()[0][:120]})")  # TokenError: a header cut short
    if dtype.kind not in "iu":
        fail(f"holds {dtype} values, not integer token ids")
    if len(shape) != 1 or shape[0] < 0:
        fail(f"holds an array of shape {shape}, not one dimension of token ids")
    length, tokens = shape[0], meta["splits"][which]["tokens"]
    expected = offset + length * dtype.itemsize
    if status.st_size < expected:
        fail(
            f"is truncated: its header promises {length:,} token ids in {expected:,} bytes, the file has "
            f"{status.st_size:,}"
        )
    if status.st_size > expected:
        fail(f"has {status.st_size - expected:,} bytes more than its header's {length:,} token ids")
    if length != tokens:
        fail(f"holds {length:,} token ids, but meta.json records {tokens:,} for the {which} split")
    record = meta.get("files", {}).get(path.name)
    if record and record["bytes"] != status.st_size:
        fail(f"has {status.st_size:,} bytes, but meta.json records {record['bytes']:,}")
    return ArrayLayout(dtype, length, offset)


def check_ids(path: Path, array: np.ndarray, layout: ArrayLayout, meta: dict, directory: Path) -> None:
    """Check that every id of ``array`` (the memory-mapped split at ``path``) is below the vocabulary
    size, and the file's checksum where ``meta.json`` records one; one pass, a chunk at a time."""
    record = meta.get("files", {}).get(path.name)
    digest = None
    if record:  # the header's bytes first: the checksum is that of the whole file (``sha256sum train.npy``)
        with open(path, "rb") as file:
            digest = hashlib.sha256(file.read(layout.offset))
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
            _fail(
                path,
                directory,
                meta,
                f"holds the token id {bad:,} at position {where:,}, outside the vocabulary of {size:,}",
            )
    if digest is not None and digest.hexdigest() != record["sha256"]:
        _fail(path, directory, meta, "differs from the checksum meta.json records for it (its contents are damaged)")


def _open_regular(path: Path, directory: Path, meta):
    """``path`` opened for reading when it is a regular file; anything else (a FIFO, a directory) is
    refused at once, without waiting on it."""
    try:
        descriptor = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    except FileNotFoundError:
        _fail(
            path,
            directory,
            meta,
            f"is a link to {os.readlink(path)}, which does not exist" if os.path.islink(path) else "is missing",
        )
    except OSError as error:  # a directory (EISDIR), no permission, a loop of links
        _fail(path, directory, meta, f"cannot be read ({error.strerror or error})")
    mode = os.fstat(descriptor).st_mode
    if not stat.S_ISREG(mode):
        os.close(descriptor)
        _fail(path, directory, meta, f"is {file_kind(mode)}, not a regular file")
    return open(descriptor, "rb")


def _read_file(path: Path, directory: Path, meta) -> bytes:
    with _open_regular(path, directory, meta) as file:
        try:
            return file.read()
        except OSError as error:
            _fail(path, directory, meta, f"cannot be read ({error.strerror or error})")


def file_record(path: Path) -> dict:
    """What ``meta.json``'s ``files`` records of a file just written: its size and sha256."""
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        while block := file.read(CHUNK):
            digest.update(block)
    return {"bytes": path.stat().st_size, "sha256": digest.hexdigest()}


def _is(value, kind: type) -> bool:
    return isinstance(value, kind) and not (kind is int and isinstance(value, bool))


def _json_kind(value) -> str:
    return {list: "a list", str: "a string", bool: "true or false", type(None): "null"}.get(type(value), "a number")


def _shown(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
