"""The Delta-RNN paper's subword scheme (issue 22): the rules on words split by hand, the vocabulary
on the real PTB, and `ptb-subword` prepared with it."""

from __future__ import annotations

import json

import pytest

from charlm.corpora.tokenizer_kinds import tokenizer_from_state
from charlm.corpora.word_tokenizers import VowelSubwordTokenizer
from charlm.corpora.vowel_subwords import (
    END_OF_WORD,
    LETTERS,
    cutoff_for,
    piece_counts,
    review_words,
    vocabulary_size,
    vowel_pieces,
)
from charlm.errors import OutOfVocabulary
from helpers import cli

# Derived by hand from the rules: split at vowels, link each vowel to the consonant after it, merge
# single characters right unless the left piece is shorter (or there is no right piece).
# fmt: off
SPLITS = {
    "banknote": ["ban", "kn", "ote"],     # b·an·kn·ot·e: b joins an; e, last, joins ot
    "year": ["ye", "ar"],                 # y·e·ar: e has no consonant after it
    "company": ["com", "pany"],           # c·om·p·an·y: p joins an (com is not shorter); y joins pan
    "strength": ["str", "en", "gth"],     # consonant runs stay whole
    "queue": ["qu", "eue"],               # q·u·e·u·e: one character at a time
    "idea": ["id", "ea"],                 # id·e·a: e joins a (id is not shorter)
    "shares": ["sh", "ar", "es"],
    "a": ["a"],                           # a one-letter word stays one letter
    "rhythm": ["rhythm"],                 # no vowel (y is not one)
    "<unk>": ["<unk>"],                   # not all letters: one piece
    "'s": ["'s"],
}
# fmt: on


@pytest.mark.parametrize("word", SPLITS)
def test_words_split_as_the_rules_say(word):
    assert vowel_pieces(word) == SPLITS[word]
    assert "".join(vowel_pieces(word)) == word


def test_the_tokenizer_keeps_frequent_pieces_and_spells_the_rest():
    text = "the banknote\nthe bank\n" * 15 + "a rhythm 's <unk>\n"
    tokenizer = VowelSubwordTokenizer.build(text, min_count=15)
    kept = tokenizer.vocab[: -len(LETTERS) - 1]  # <unk> and <eos> are kept whatever their count
    assert kept == sorted(["<eos>", "<unk>", "ban", "bank", "kn", "ote", "the"]) and tokenizer.vocab[-1] == END_OF_WORD
    ids = tokenizer.encode("the rhythm\n")
    assert [tokenizer.vocab[i] for i in ids] == ["the", END_OF_WORD, *"rhythm", END_OF_WORD, "<eos>", END_OF_WORD]
    assert tokenizer.decode(ids) == "the rhythm\n"
    assert tokenizer.decode(tokenizer.encode("the 's\n")) == "the <unk>\n"  # rare, and not letters: <unk>
    without_unk = VowelSubwordTokenizer.build(text.replace("<unk>", "a"), min_count=15)
    with pytest.raises(OutOfVocabulary, match='"\'s"'):  # and without <unk> in the text, no way to write it
        without_unk.encode("the 's\n")
    rebuilt = tokenizer_from_state(tokenizer.to_state())
    assert isinstance(rebuilt, VowelSubwordTokenizer) and rebuilt.vocab == tokenizer.vocab


# about 18 s: prepares real PTB at several cutoffs; the paper's cutoff itself is checked in the default run
@pytest.mark.slow
def test_on_ptb_the_cutoff_closest_to_the_papers_vocabulary_is_15(shared_corpora):
    train = (shared_corpora / "ptb" / "ptb.train.txt").read_text()
    counts = piece_counts(train)

    def subwords(cutoff):
        return sum(1 for piece, count in counts.items() if count >= cutoff and piece not in LETTERS)

    assert {cutoff: subwords(cutoff) for cutoff in (14, 15, 16)} == {14: 2417, 15: 2366, 16: 2305}
    assert min(range(1, 60), key=lambda cutoff: abs(subwords(cutoff) - 2378)) == 15
    assert cutoff_for(counts, 2405) == 15 and vocabulary_size(counts, 15) == 2393
    tokenizer = VowelSubwordTokenizer.build(train)
    assert VowelSubwordTokenizer.build(train, symbols=2405).vocab == tokenizer.vocab
    assert tokenizer.vocab_size == 2366 + 26 + 1 == 2393  # the paper: 2378 + 26 + 1 = 2405
    valid = (shared_corpora / "ptb" / "ptb.valid.txt").read_text()
    normalised = "".join(" ".join(line.split()) + "\n" for line in valid.splitlines())
    unknown = set(tokenizer.unknown_words(normalised))  # rare words with a non-letter ("neb."): <unk>
    assert 0 < len(unknown) < 200  # of 6,022 distinct words
    expected = "".join(
        " ".join("<unk>" if word in unknown else word for word in line.split()) + "\n"
        for line in normalised.splitlines()
    )
    assert tokenizer.decode(tokenizer.encode(normalised)) == expected


def test_ptb_subword_is_prepared_with_the_papers_scheme(shared_corpora, tmp_path):
    result = cli("prepare", "ptb-subword", "--data-dir", str(tmp_path), "--source", str(shared_corpora / "ptb"))
    assert result.returncode == 0, result.stderr
    assert "2,571,576 / 202,596 / 225,795 tokens" in result.stdout and "subword vocabulary 2,393" in result.stdout
    meta = json.loads((tmp_path / "ptb-subword" / "meta.json").read_text())
    assert meta["subword"] == {"kind": "vowel-linked", "vocab_size": 2405, "min_count": 15}


def test_the_cutoff_is_the_one_whose_vocabulary_comes_closest():
    counts = piece_counts("ban ban ban ban kn kn kn ote ote the\n")  # ban 4, kn 3, ote 2, the 1, <eos> 1
    sizes = {cutoff: vocabulary_size(counts, cutoff) for cutoff in (1, 2, 3, 4, 5)}
    assert sizes == {1: 32, 2: 31, 3: 30, 4: 29, 5: 28}  # the 26 letters, </w> and <eos> come with every cutoff
    assert [cutoff_for(counts, n) for n in (27, 28, 29, 30, 31, 32, 100)] == [5, 5, 4, 3, 2, 1, 1]
    two = piece_counts("ban ban ban ban kn kn kn kn\n")  # ban 4, kn 4, <eos> 1: 30 symbols at 4, 28 at 5
    assert cutoff_for(two, 29) == 5  # a tie: the smaller vocabulary
    with pytest.raises(ValueError, match="at least 27 symbols"):
        cutoff_for(counts, 26)


# Derived by hand from charlm's reading of "emoticons and non-word symbols by special tokens".
REVIEWS = {
    "I didn't like it :) but it's 9/10!!!": "i did n't like it <emoticon> but it 's <num> <sym> <num> <sym>",
    "Can't wait... (really :-D) <3": "ca n't wait <sym> <sym> really <emoticon> <sym> <emoticon>",
    "$1,000.50 for rock'n'roll?": "<sym> <num> for rock <sym> n <sym> roll <sym>",
    "great:) 'quoted' ;P": "great <sym> <sym> quoted <sym> <emoticon>",
}


@pytest.mark.parametrize("review", REVIEWS)
def test_imdb_reviews_become_words_and_special_tokens(review):
    assert review_words(review) == REVIEWS[review]
    assert review_words(review + "\n" + review) == REVIEWS[review] + "\n" + REVIEWS[review]
