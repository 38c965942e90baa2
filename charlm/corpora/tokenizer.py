"""Tokenizers: text to token ids and back. This module: the interface, and the character and byte
tokenizers (``charlm.corpora.word_tokenizers``: word and subword; ``charlm.corpora.tokenizer_kinds``:
every kind by name, and ``tokenizer_from_state``).

A tokenizer is rebuilt from ``to_state()``, which holds only plain containers (the subword model
travels as a uint8 tensor), so a checkpoint loaded with ``torch.load(..., weights_only=True)``
carries everything that sampling needs.

Corpus-sized texts (100 million characters) are encoded in numpy, a chunk at a time, through a
lookup table: never as a Python list of characters.
"""

import numpy as np

from charlm.errors import OutOfVocabulary

UNK = "<unk>"
CHUNK = 1 << 20  # characters per numpy pass: bounds the working memory of encoding
MAX_CODEPOINT = 0x10FFFF


def id_dtype(vocab_size: int) -> np.dtype:
    """The narrowest unsigned integer type that holds every id of the vocabulary."""
    for dtype in (np.uint8, np.uint16):
        if vocab_size <= np.iinfo(dtype).max + 1:
            return np.dtype(dtype)
    return np.dtype(np.int32)


def codepoints(text: str) -> np.ndarray:
    """The Unicode code points of ``text`` as a numpy array (uint8 when the text is ASCII)."""
    if text.isascii():
        return np.frombuffer(text.encode("ascii"), dtype=np.uint8)
    return np.frombuffer(text.encode("utf-32-le", errors="surrogatepass"), dtype=np.uint32)


def distinct_characters(text: str) -> list[str]:
    """The sorted distinct characters of ``text``."""
    present = np.zeros(MAX_CODEPOINT + 1, dtype=bool)
    for start in range(0, len(text), CHUNK):
        present[codepoints(text[start : start + CHUNK])] = True
    return [chr(code) for code in np.flatnonzero(present)]


def distinct_bytes(data) -> list[int]:
    """The sorted distinct byte values of ``data`` (bytes or memoryview)."""
    array = np.frombuffer(data, dtype=np.uint8)
    present = np.zeros(256, dtype=bool)
    for start in range(0, len(array), CHUNK):
        present[array[start : start + CHUNK]] = True
    return np.flatnonzero(present).tolist()


class Tokenizer:
    """Maps text to token ids and back. ``charlm.corpora.tokenizer_kinds.tokenizer_from_state`` rebuilds any kind."""

    kind = ""
    model: bytes | None = None  # the serialized sentencepiece model of a subword tokenizer

    def __init__(self, vocab: list[str], unk: str | None = None):
        self.vocab = list(vocab)
        self.unk = unk  # the entry unknown symbols map to; None: unknown symbols are an error

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``; raises OutOfVocabulary naming the symbols the vocabulary lacks."""
        return self.encode_array(text).tolist()

    def encode_array(self, text) -> np.ndarray:
        """Token ids of ``text`` as a numpy array of the vocabulary's id type."""
        raise NotImplementedError

    def decode(self, ids) -> str:
        raise NotImplementedError

    def plain_state(self) -> dict:
        """The state in JSON-able form: everything except a subword model's bytes."""
        return {"kind": self.kind, "vocab": list(self.vocab), "unk": self.unk}

    def to_state(self) -> dict:
        """Everything needed to rebuild the tokenizer, as plain containers and tensors."""
        return self.plain_state()

    def __repr__(self):
        return f"{type(self).__name__}(vocab_size={self.vocab_size}, unk={self.unk!r})"


def as_id_list(ids) -> list[int]:
    """Plain ints from a list, numpy array or torch tensor of ids."""
    return ids.tolist() if hasattr(ids, "tolist") else [int(i) for i in ids]


class _TableTokenizer(Tokenizer):
    """A tokenizer whose symbols are numbers (code points or bytes) looked up in a dense table."""

    table_size = 0

    def __init__(self, vocab, unk=None):
        super().__init__(vocab, unk)
        self._table = None

    def symbol_code(self, symbol: str) -> int:
        """The table index of a vocabulary entry (other than ``unk``)."""
        return ord(symbol)

    def symbol_name(self, code: int) -> str:
        raise NotImplementedError

    def lookup_table(self) -> np.ndarray:
        if self._table is None:
            table = np.full(self.table_size, -1, dtype=np.int32)
            for i, symbol in enumerate(self.vocab):
                if symbol != self.unk:
                    table[self.symbol_code(symbol)] = i
            self._table = table
        return self._table

    def encode_codes(self, codes_in_chunks, length: int) -> np.ndarray:
        """Look up an iterable of code arrays into one id array of ``length`` entries."""
        table = self.lookup_table()
        unk_id = self.vocab.index(self.unk) if self.unk is not None else None
        out = np.empty(length, dtype=id_dtype(self.vocab_size))
        unknown, position = set(), 0
        for codes in codes_in_chunks:
            ids = table[codes]
            missing = ids < 0
            if missing.any():
                if unk_id is None:
                    unknown.update(np.unique(codes[missing]).tolist())
                ids[missing] = unk_id if unk_id is not None else 0
            out[position : position + len(ids)] = ids
            position += len(ids)
        if unknown:
            raise OutOfVocabulary([self.symbol_name(code) for code in unknown])
        return out


class CharTokenizer(_TableTokenizer):
    """One token per character. ``space_symbol`` (PTB's ``_``) stands for a space in the vocabulary."""

    kind = "char"
    table_size = MAX_CODEPOINT + 1

    def __init__(self, vocab, unk=None, space_symbol=None):
        super().__init__(vocab, unk)
        self.space_symbol = space_symbol

    @classmethod
    def build(cls, text: str, unk=None, space_symbol=None):
        """The vocabulary of ``text``: its sorted distinct characters, then ``unk`` if given."""
        return cls(distinct_characters(text) + ([unk] if unk else []), unk, space_symbol)

    def symbol_name(self, code):
        return chr(code)

    def encode_array(self, text: str) -> np.ndarray:
        if self.space_symbol:
            text = text.replace(" ", self.space_symbol)
        chunks = (codepoints(text[start : start + CHUNK]) for start in range(0, len(text), CHUNK))
        return self.encode_codes(chunks, len(text))

    def decode(self, ids) -> str:
        text = "".join(self.vocab[i] for i in as_id_list(ids))
        return text.replace(self.space_symbol, " ") if self.space_symbol else text

    def plain_state(self):
        return {**super().plain_state(), "space_symbol": self.space_symbol}

    @classmethod
    def from_own_state(cls, state):
        return cls(state["vocab"], state.get("unk"), state.get("space_symbol"))


class ByteTokenizer(_TableTokenizer):
    """One token per UTF-8 byte; vocabulary entries are ``chr(byte)`` (the latin-1 mapping)."""

    kind = "byte"
    table_size = 256

    @classmethod
    def build(cls, data, unk=None):
        """The vocabulary of ``data`` (bytes): its sorted distinct byte values, then ``unk`` if given."""
        return cls([chr(byte) for byte in distinct_bytes(data)] + ([unk] if unk else []), unk)

    def symbol_name(self, code):
        return chr(code) if code < 128 else f"byte 0x{code:02x}"

    def encode_array(self, text) -> np.ndarray:
        data = np.frombuffer(text.encode("utf-8") if isinstance(text, str) else text, dtype=np.uint8)
        chunks = (data[start : start + CHUNK] for start in range(0, len(data), CHUNK))
        return self.encode_codes(chunks, len(data))

    def decode(self, ids) -> str:
        pieces = (self.vocab[i] for i in as_id_list(ids))
        return "".join(pieces).encode("latin-1").decode("utf-8", errors="replace")

    @classmethod
    def from_own_state(cls, state):
        return cls(state["vocab"], state.get("unk"))
