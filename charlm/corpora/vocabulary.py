"""What a tokenizer state's vocabulary must be, judged in one place for every file that holds one
(a checkpoint, a prepared corpus's meta.json): a non-empty list of distinct, non-empty strings;
one character each (the unknown-symbol entry aside) in a character or byte vocabulary; the entries
its kind cannot work without (``<eos>`` for words; ``</w>`` and the 26 letters for vowel-linked
subwords)."""

from __future__ import annotations

import torch

from charlm.corpora.tokenizer_kinds import TOKENIZER_KINDS
from charlm.corpora.vowel_subwords import END_OF_WORD, LETTERS
from charlm.errors import kind_of, shown

SINGLE_SYMBOL_KINDS = ("char", "byte")
REQUIRED_SYMBOLS = {"word": ("<eos>",), "vowel-linked": (END_OF_WORD, *LETTERS)}


def vocabulary_problem(state: dict) -> str | None:
    """Why the vocabulary of tokenizer ``state`` cannot be used, as words that follow "its" or
    "whose" (``vocabulary holds 'a' twice``), or None when it can."""
    kind = state.get("kind")
    if not isinstance(kind, str) or kind not in TOKENIZER_KINDS:  # a list is no key of the table
        return f"vocabulary is of unknown kind {shown(kind, 40)}"
    vocab, unk = state.get("vocab"), state.get("unk")
    if not isinstance(vocab, list):
        return f"vocabulary is {kind_of(vocab)}, not a list of symbols"
    if not vocab:
        return "vocabulary is empty"
    if unk is not None and (not isinstance(unk, str) or unk not in vocab):
        return f"vocabulary lacks its own unknown-symbol entry {shown(unk, 40)}"
    seen = set()
    for entry in vocab:
        if not isinstance(entry, str):
            return f"vocabulary holds {kind_of(entry)} ({shown(entry, 40)}), not a symbol"
        if not entry:
            return "vocabulary holds an empty entry, not a symbol"
        if entry in seen:
            return f"vocabulary holds {shown(entry, 40)} twice"
        if not _is_text(entry):  # "\ud800" from a JSON escape or a pickle: no output could print it
            return f"vocabulary holds {shown(entry, 40)}, which is not Unicode text (a lone surrogate)"
        seen.add(entry)
        if kind in SINGLE_SYMBOL_KINDS and entry != unk and (len(entry) != 1 or (kind == "byte" and ord(entry) > 255)):
            return f"{kind} vocabulary holds {shown(entry, 40)}, not one {'byte' if kind == 'byte' else 'character'}"
    space = state.get("space_symbol")
    if space is not None and (not isinstance(space, str) or len(space) != 1 or not _is_text(space)):
        return f"vocabulary's space symbol is {shown(space, 40)}, not one character"
    model = state.get("model")
    if kind == "subword" and model is not None and not _is_model_bytes(model):
        return f"subword model is {kind_of(model)}, not the bytes of a sentencepiece model"
    missing = [symbol for symbol in REQUIRED_SYMBOLS.get(kind, ()) if symbol not in seen]
    if missing:
        return f"{kind} vocabulary lacks {', '.join(map(repr, missing[:5]))}{' …' if len(missing) > 5 else ''}"
    min_count = state.get("min_count")
    if kind == "vowel-linked" and min_count is not None and (type(min_count) is not int or min_count < 0):
        return f"vowel-linked vocabulary's minimum count is {shown(min_count, 40)}, not a count"
    return None


def _is_text(symbol: str) -> bool:
    """Whether ``symbol`` can be written out (UTF-8): no lone surrogate."""
    try:
        symbol.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _is_model_bytes(model) -> bool:
    """Bytes, as a checkpoint keeps a sentencepiece model: a one-dimensional tensor of bytes (uint8),
    ``bytes``, or a list of numbers from 0 to 255."""
    if torch.is_tensor(model):
        return (
            model.dtype == torch.uint8
            and model.dim() == 1
            and model.layout == torch.strided
            and model.device.type != "meta"
        )
    if isinstance(model, (bytes, bytearray)):
        return True
    return isinstance(model, list) and all(type(byte) is int and 0 <= byte <= 255 for byte in model)
