"""The one judgement of a tokenizer state's vocabulary that checkpoints and prepared corpora share."""

from __future__ import annotations

import pytest
import torch

from charlm.corpora.vocabulary import vocabulary_problem
from charlm.corpora.vowel_subwords import END_OF_WORD, LETTERS

CHAR = {"kind": "char", "vocab": ["a", "b", " "], "unk": None}
WORD = {"kind": "word", "vocab": ["<unk>", "<eos>", "the"], "unk": "<unk>"}
VOWEL = {"kind": "vowel-linked", "vocab": [END_OF_WORD, *LETTERS, "ea"], "unk": None, "min_count": 2}

BAD_STATES = [  # what is wrong → the words that follow "its" (checkpoint) or "a tokenizer whose" (meta.json)
    ("unknown kind", {**CHAR, "kind": "morse"}, "vocabulary is of unknown kind 'morse'"),
    ("a tensor for a list", {**CHAR, "vocab": torch.arange(3)}, "vocabulary is a tensor, not a list of symbols"),
    ("a mapping for a list", {**CHAR, "vocab": {"a": 0}}, "vocabulary is a mapping, not a list of symbols"),
    ("empty", {**CHAR, "vocab": []}, "vocabulary is empty"),
    ("its unknown entry absent", {**WORD, "unk": "<oov>"}, "vocabulary lacks its own unknown-symbol entry '<oov>'"),
    ("a number entry", {**CHAR, "vocab": ["a", 7]}, "vocabulary holds a number (7), not a symbol"),
    ("an empty entry", {**CHAR, "vocab": ["a", ""]}, "vocabulary holds an empty entry, not a symbol"),
    ("a list entry", {**CHAR, "vocab": ["a", ["b"]]}, "vocabulary holds a list (['b']), not a symbol"),
    ("an entry twice", {**CHAR, "vocab": ["a", "b", "a"]}, "vocabulary holds 'a' twice"),
    (
        "two characters in a character vocabulary",
        {**CHAR, "vocab": ["a", "bc"]},
        "char vocabulary holds 'bc', not one character",
    ),
    (
        "a character beyond a byte",
        {"kind": "byte", "vocab": ["a", "é", "ĉ"], "unk": None},
        "byte vocabulary holds 'ĉ', not one byte",
    ),
    (
        "a space symbol of two characters",
        {**CHAR, "space_symbol": "__"},
        "vocabulary's space symbol is '__', not one character",
    ),
    ("a word vocabulary without <eos>", {**WORD, "vocab": ["<unk>", "the"]}, "word vocabulary lacks '<eos>'"),
    (
        "a vowel-linked vocabulary without </w>",
        {**VOWEL, "vocab": [*LETTERS, "ea"]},
        "vowel-linked vocabulary lacks '</w>'",
    ),
    (
        "a vowel-linked vocabulary without a letter",
        {**VOWEL, "vocab": [END_OF_WORD, *LETTERS[1:]]},
        "vowel-linked vocabulary lacks 'a'",
    ),
    (
        "a minimum count that is text",
        {**VOWEL, "min_count": "2"},
        "vowel-linked vocabulary's minimum count is '2', not a count",
    ),
]


@pytest.mark.parametrize("state, problem", [case[1:] for case in BAD_STATES], ids=[case[0] for case in BAD_STATES])
def test_each_damaged_vocabulary_is_named(state, problem):
    assert vocabulary_problem(state) == problem


@pytest.mark.parametrize(
    "state",
    [CHAR, WORD, VOWEL, {"kind": "byte", "vocab": ["a", "\xff", "<unk>"], "unk": "<unk>"}],
    ids=["char", "word", "vowel-linked", "byte with its unknown entry"],
)
def test_sound_vocabularies_pass(state):
    assert vocabulary_problem(state) is None


def test_checkpoints_and_corpora_use_the_same_judgement(tiny_corpus, trained_run, tmp_path):
    """The same damage gives the same words from both readers."""
    import json
    import shutil

    from charlm.checkpoint import Checkpoint
    from charlm.corpora import load_corpus
    from charlm.errors import CharlmError

    payload = torch.load(trained_run / "best.pt", weights_only=True)
    payload["tokenizer"]["vocab"][2] = payload["tokenizer"]["vocab"][1]
    torch.save(payload, tmp_path / "twice.pt")
    with pytest.raises(CharlmError) as from_checkpoint:
        Checkpoint.load(tmp_path / "twice.pt")

    shutil.copytree(tiny_corpus, tmp_path / "data")
    meta_path = tmp_path / "data/tiny/meta.json"
    meta = json.loads(meta_path.read_text(encoding="utf-8"))
    for vocab in (meta["vocab"], meta["tokenizer"]["vocab"]):
        vocab[2] = vocab[1]
    meta_path.write_text(json.dumps(meta), encoding="utf-8")
    with pytest.raises(CharlmError) as from_corpus:
        load_corpus("tiny", tmp_path / "data")

    problem = vocabulary_problem(payload["tokenizer"])
    assert f"its {problem}" in str(from_checkpoint.value)
    assert f"has a tokenizer whose {problem}" in str(from_corpus.value)
