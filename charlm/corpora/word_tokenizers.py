"""Tokenizers whose symbols are words or pieces of words: sentencepiece subwords, whitespace words
with ``<eos>`` for a line break, and the Delta-RNN paper's vowel-linked subwords."""

from string import ascii_lowercase

import numpy as np
import sentencepiece
import torch

from charlm.corpora.tokenizer import UNK, Tokenizer, as_id_list, distinct_characters, id_dtype
from charlm.corpora.vowel_subwords import (
    DEFAULT_MIN_COUNT,
    END_OF_SENTENCE,
    END_OF_WORD,
    LETTERS,
    cutoff_for,
    kept_pieces,
    piece_counts,
    sentence_words,
    vowel_pieces,
)
from charlm.errors import OutOfVocabulary

SUBWORD_SEGMENT = 1000  # longest piece of a line handed to sentencepiece at once, in characters


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
        for i in as_id_list(ids):
            if i == self.newline_id:
                lines.append(line)
                line = []
            else:
                line.append(i)
        lines.append(line)
        return "\n".join(self.processor.decode(line) for line in lines)

    def to_state(self):
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
        for i in as_id_list(ids):
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
        return sorted(
            {
                word
                for word in sentence_words(text)
                if (ids := self.word_ids(word)) is None or (unk_id is not None and unk_id in ids and word != self.unk)
            }
        )

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
        for i in as_id_list(ids):
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
