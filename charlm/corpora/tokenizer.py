"""Tokenizers: text to token ids and back, for character, byte, word and subword corpora.

A tokenizer is rebuilt from ``to_state()``, which holds only plain containers (the subword model
travels as a uint8 tensor), so a checkpoint loaded with ``torch.load(..., weights_only=True)``
carries everything that sampling needs.

Corpus-sized texts (100 million characters) are encoded in numpy, a chunk at a time, through a
lookup table: never as a Python list of characters.
"""

from string import ascii_lowercase

import numpy as np
import sentencepiece

from charlm.corpora.vowel_subwords import (DEFAULT_MIN_COUNT, END_OF_SENTENCE, END_OF_WORD, LETTERS, cutoff_for,
                                           kept_pieces, piece_counts, sentence_words, vowel_pieces)
from charlm.errors import OutOfVocabulary

UNK = "<unk>"
CHUNK = 1 << 20          # characters per numpy pass: bounds the working memory of encoding
MAX_CODEPOINT = 0x10FFFF
SUBWORD_SEGMENT = 1000   # longest piece of a line handed to sentencepiece at once, in characters


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
        present[codepoints(text[start:start + CHUNK])] = True
    return [chr(code) for code in np.flatnonzero(present)]


def distinct_bytes(data) -> list[int]:
    """The sorted distinct byte values of ``data`` (bytes or memoryview)."""
    array = np.frombuffer(data, dtype=np.uint8)
    present = np.zeros(256, dtype=bool)
    for start in range(0, len(array), CHUNK):
        present[array[start:start + CHUNK]] = True
    return np.flatnonzero(present).tolist()


def line_segments(line: str, limit: int = SUBWORD_SEGMENT):
    """Cut a long line into pieces of at most ``limit`` characters, each new piece starting at a space."""
    start = 0
    while len(line) - start > limit:
        cut = line.rfind(" ", start + 1, start + limit)
        if cut <= start:
            cut = start + limit
        yield line[start:cut]
        start = cut
    yield line[start:]


class Tokenizer:
    """Maps text to token ids and back. ``Tokenizer.from_state`` rebuilds any kind."""

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

    @classmethod
    def from_state(cls, state: dict) -> "Tokenizer":
        kind = state.get("kind")
        if kind not in TOKENIZER_KINDS:
            raise ValueError(f"unknown tokenizer kind {kind!r}")
        return TOKENIZER_KINDS[kind].from_own_state(state)

    def __repr__(self):
        return f"{type(self).__name__}(vocab_size={self.vocab_size}, unk={self.unk!r})"


def _ids_list(ids) -> list[int]:
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
            out[position:position + len(ids)] = ids
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
        chunks = (codepoints(text[start:start + CHUNK]) for start in range(0, len(text), CHUNK))
        return self.encode_codes(chunks, len(text))

    def decode(self, ids) -> str:
        text = "".join(self.vocab[i] for i in _ids_list(ids))
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
        chunks = (data[start:start + CHUNK] for start in range(0, len(data), CHUNK))
        return self.encode_codes(chunks, len(data))

    def decode(self, ids) -> str:
        pieces = (self.vocab[i] for i in _ids_list(ids))
        return "".join(pieces).encode("latin-1").decode("utf-8", errors="replace")

    @classmethod
    def from_own_state(cls, state):
        return cls(state["vocab"], state.get("unk"))


class SubwordTokenizer(Tokenizer):
    """A sentencepiece model. Lines are encoded separately; the model's end-of-sentence id is the newline."""

    kind = "subword"

    def __init__(self, model: bytes, unk=None):
        self.model = bytes(model)
        self.processor = sentencepiece.SentencePieceProcessor(model_proto=self.model)
        size = self.processor.get_piece_size()
        super().__init__([self.processor.id_to_piece(i) for i in range(size)], unk)
        self.newline_id = self.processor.eos_id()
        self.unk_id = self.processor.unk_id()

    def encode_array(self, text: str) -> np.ndarray:
        parts, batch, line_ends = [], [], []
        for line in text.split("\n"):
            batch.extend(line_segments(line))
            line_ends.append(len(batch) - 1)
            if len(batch) >= 10_000:
                parts.append(self._encode_batch(batch, line_ends))
                batch, line_ends = [], []
        parts.append(self._encode_batch(batch, line_ends))
        ids = np.concatenate(parts)[:-1]  # text.split("\n") gives one line more than there are newlines
        if self.unk is None and (ids == self.unk_id).any():
            raise OutOfVocabulary(self.unknown_characters(text) or [UNK])
        return ids.astype(id_dtype(self.vocab_size))

    def _encode_batch(self, segments, line_ends) -> np.ndarray:
        encoded = self.processor.encode(segments)
        for end in line_ends:
            encoded[end] = encoded[end] + [self.newline_id]
        counts = sum(len(ids) for ids in encoded)
        return np.fromiter((i for ids in encoded for i in ids), dtype=np.int32, count=counts)

    def unknown_characters(self, text: str) -> list[str]:
        """The characters of ``text`` that the model has no piece for."""
        def known(character):
            return self.processor.piece_to_id(character.replace(" ", "\u2581")) != self.unk_id
        return [c for c in distinct_characters(text) if c != "\n" and not known(c)]

    def decode(self, ids) -> str:
        lines, line = [], []
        for i in _ids_list(ids):
            if i == self.newline_id:
                lines.append(line)
                line = []
            else:
                line.append(i)
        lines.append(line)
        return "\n".join(self.processor.decode(line) for line in lines)

    def to_state(self):
        import torch  # only checkpoints need the tensor form

        model = torch.frombuffer(bytearray(self.model), dtype=torch.uint8)
        return {**self.plain_state(), "model": model}

    @classmethod
    def from_own_state(cls, state):
        model = state["model"]
        if hasattr(model, "numpy"):
            model = model.numpy().tobytes()
        elif isinstance(model, list):
            model = bytes(model)
        return cls(model, state.get("unk"))


EOS = "<eos>"  # a word corpus's end of sentence: a line break in the text


class WordTokenizer(Tokenizer):
    """Words separated by whitespace; every line break is the end-of-sentence token ``<eos>``.

    The vocabulary is the training split's words and ``<eos>`` (Mikolov's PTB files have already
    mapped rare words to ``<unk>``, which is then the entry unknown words map to when asked).
    Decoding joins the words of a line with single spaces.
    """

    kind = "word"

    def __init__(self, vocab, unk=None):
        super().__init__(vocab, unk)
        self.index = {word: i for i, word in enumerate(self.vocab)}
        self.eos_id = self.index[EOS]

    @classmethod
    def build(cls, text: str, unk=None):
        words = {EOS}
        for line in text.splitlines():
            words.update(line.split())
        return cls(sorted(words), UNK if UNK in words else unk)

    def words(self, text: str):
        """The words of ``text`` in order, ``<eos>`` for every line break."""
        for line in text.splitlines(keepends=True):
            yield from line.split()
            if line.endswith(("\n", "\r")):
                yield EOS

    def unknown_words(self, text: str) -> list[str]:
        return sorted({word for word in self.words(text) if word not in self.index})

    def encode_array(self, text: str) -> np.ndarray:
        unk_id = self.index.get(self.unk) if self.unk is not None else None
        ids = []
        for word in self.words(text):
            found = self.index.get(word, unk_id)
            if found is None:
                raise OutOfVocabulary(self.unknown_words(text))
            ids.append(found)
        return np.asarray(ids, dtype=id_dtype(self.vocab_size))

    def decode(self, ids) -> str:
        pieces, line_start = [], True
        for i in _ids_list(ids):
            if i == self.eos_id:
                pieces.append("\n")
                line_start = True
            else:
                pieces.append(("" if line_start else " ") + self.vocab[i])
                line_start = False
        return "".join(pieces)

    @classmethod
    def from_own_state(cls, state):
        return cls(state["vocab"], state.get("unk"))


class VowelSubwordTokenizer(Tokenizer):
    """The Delta-RNN paper's subwords (``charlm.corpora.vowel_subwords``): the pieces of each word
    seen at least ``min_count`` times in the training split, the 26 letters for the others, and
    ``</w>`` after every word; a line ends with the word ``<eos>``."""

    kind = "vowel-linked"

    def __init__(self, vocab, unk=None, min_count=None):
        super().__init__(vocab, unk)
        self.index = {symbol: i for i, symbol in enumerate(self.vocab)}
        self.end_id = self.index[END_OF_WORD]
        self.min_count = min_count  # the frequency cutoff it was built with (None: not recorded)

    @classmethod
    def build(cls, text: str, min_count: int = DEFAULT_MIN_COUNT, symbols: int | None = None):
        """The vocabulary of ``text``'s pieces seen ``min_count`` times, or with ``symbols``, at the
        cutoff whose vocabulary size comes closest to it."""
        counts = piece_counts(text)
        if symbols is not None:
            min_count = cutoff_for(counts, symbols)
        kept = kept_pieces(counts, min_count)
        vocab = [*kept, *LETTERS, END_OF_WORD]
        return cls(vocab, UNK if UNK in kept else None, min_count)

    def plain_state(self) -> dict:
        return {**super().plain_state(), "min_count": self.min_count}

    def word_ids(self, word: str) -> list[int] | None:
        """The ids of one word, ``</w>`` last; None where it cannot be written (and there is no ``<unk>``)."""
        ids = []
        for piece in vowel_pieces(word):
            if piece in self.index:
                ids.append(self.index[piece])
            elif all(c in ascii_lowercase for c in piece):
                ids.extend(self.index[c] for c in piece)
            elif self.unk is not None:
                ids.append(self.index[self.unk])
            else:
                return None
        return [*ids, self.end_id]

    def unknown_words(self, text: str) -> list[str]:
        """The words of ``text`` that map to ``<unk>`` or cannot be written at all."""
        unk_id = self.index.get(self.unk) if self.unk is not None else None
        return sorted({word for word in sentence_words(text)
                       if (ids := self.word_ids(word)) is None or (unk_id is not None and unk_id in ids
                                                                   and word != self.unk)})

    def encode_array(self, text: str) -> np.ndarray:
        ids, unknown = [], set()
        for word in sentence_words(text):
            found = self.word_ids(word)
            if found is None:
                unknown.add(word)
            else:
                ids.extend(found)
        if unknown:
            raise OutOfVocabulary(sorted(unknown))
        return np.asarray(ids, dtype=id_dtype(self.vocab_size))

    def decode(self, ids) -> str:
        text, word, line_start = [], [], True
        for i in _ids_list(ids):
            if i != self.end_id:
                word.append(self.vocab[i])
                continue
            written = "".join(word)
            word = []
            if written == END_OF_SENTENCE:
                text.append("\n")
                line_start = True
            else:
                text.append(("" if line_start else " ") + written)
                line_start = False
        if word:  # a word not yet ended (a sample cut short)
            text.append(("" if line_start else " ") + "".join(word))
        return "".join(text)

    @classmethod
    def from_own_state(cls, state):
        return cls(state["vocab"], state.get("unk"), state.get("min_count"))


TOKENIZER_KINDS = {kind.kind: kind for kind in (CharTokenizer, ByteTokenizer, WordTokenizer, SubwordTokenizer,
                                                VowelSubwordTokenizer)}
