"""Tokenizers: conventions of each kind, out-of-vocabulary errors, state that survives weights_only loading."""

import io

import numpy as np
import pytest
import torch

from charlm.corpora import Tokenizer
from charlm.corpora.subword import train_subword_tokenizer
from charlm.corpora.tokenizer import ByteTokenizer, CharTokenizer, id_dtype
from charlm.corpora.tokenizer_kinds import tokenizer_from_state
from charlm.errors import OutOfVocabulary

TEXT = "the cat sat on the mat.\nthe dog sat on the log.\n" * 50


def through_checkpoint(tokenizer) -> Tokenizer:
    buffer = io.BytesIO()
    torch.save({"tokenizer": tokenizer.to_state()}, buffer)
    buffer.seek(0)
    return tokenizer_from_state(torch.load(buffer, weights_only=True)["tokenizer"])


def test_char_tokenizer_vocab_is_sorted_characters():
    tokenizer = CharTokenizer.build(TEXT)
    assert tokenizer.vocab == sorted(set(TEXT)) and tokenizer.kind == "char"
    assert tokenizer.decode(tokenizer.encode("the dog")) == "the dog"
    assert tokenizer.encode("act") == [tokenizer.vocab.index(c) for c in "act"]


def test_out_of_vocabulary_names_the_symbols():
    tokenizer = CharTokenizer.build(TEXT)
    with pytest.raises(OutOfVocabulary) as error:
        tokenizer.encode("the CAT!")
    assert error.value.symbols == ["!", "A", "C", "T"]


def test_space_symbol_maps_spaces_both_ways():
    tokenizer = CharTokenizer.build("a_b\nc", space_symbol="_")
    assert " " not in tokenizer.vocab
    assert tokenizer.encode("a b") == tokenizer.encode("a_b")
    assert tokenizer.decode(tokenizer.encode("a b\nc")) == "a b\nc"


def test_byte_tokenizer_decodes_utf8_and_replaces_broken_bytes():
    data = "naïve café".encode("utf-8")
    tokenizer = ByteTokenizer.build(data)
    assert tokenizer.vocab == [chr(b) for b in sorted(set(data))]
    assert tokenizer.decode(tokenizer.encode("café")) == "café"
    assert tokenizer.decode(tokenizer.encode("café")[:-1]) == "caf\ufffd"


def test_large_text_is_encoded_in_chunks_with_the_narrowest_type():
    text = "ab" * 1_500_000 + "é"
    ids = CharTokenizer.build(text).encode_array(text)
    assert ids.dtype == np.uint8 and len(ids) == len(text) and ids[-1] == 2
    assert id_dtype(256) == np.uint8 and id_dtype(257) == np.uint16 and id_dtype(70_000) == np.int32


@pytest.mark.parametrize(
    "tokenizer",
    [
        CharTokenizer.build(TEXT, unk="<unk>"),
        CharTokenizer.build(TEXT.replace(" ", "_"), space_symbol="_"),
        ByteTokenizer.build(TEXT.encode()),
    ],
    ids=["char-unk", "char-space-symbol", "byte"],
)
def test_state_round_trip_through_a_weights_only_checkpoint(tokenizer):
    rebuilt = through_checkpoint(tokenizer)
    assert type(rebuilt) is type(tokenizer) and rebuilt.vocab == tokenizer.vocab and rebuilt.unk == tokenizer.unk
    assert rebuilt.encode("the cat") == tokenizer.encode("the cat")


@pytest.mark.parametrize("kind, pieces", [("bpe", 40), ("unigram", 18)])  # unigram: at most 18 on this text
def test_subword_tokenizer_is_lossless_and_survives_a_checkpoint(kind, pieces):
    tokenizer = train_subword_tokenizer(TEXT, kind, pieces)
    ids = tokenizer.encode("the cat sat on the log.\nthe dog")
    assert tokenizer.decode(ids) == "the cat sat on the log.\nthe dog"
    assert len(ids) < len("the cat sat on the log.\nthe dog")
    state = tokenizer.to_state()
    assert state["model"].dtype == torch.uint8
    rebuilt = through_checkpoint(tokenizer)
    assert rebuilt.kind == "subword" and rebuilt.vocab == tokenizer.vocab
    assert rebuilt.encode("the mat.\n") == tokenizer.encode("the mat.\n")
    with pytest.raises(OutOfVocabulary) as error:
        rebuilt.encode("the zebra")
    assert error.value.symbols == ["b", "r", "z"]


def test_unknown_state_kind_is_rejected():
    with pytest.raises(ValueError, match="unknown tokenizer kind"):
        tokenizer_from_state({"kind": "morse", "vocab": []})
