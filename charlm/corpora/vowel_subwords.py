"""The Delta-RNN paper's subword scheme (its Table 2): words cut at their vowels, each vowel linked to
the consonant after it.

For each word of lowercase letters:

1. split it on its vowels (a, e, i, o, u): consonant runs and vowels in turn;
2. link each vowel with the consonant immediately to its right, where there is one
   (``banknote``: b · an · kn · ot · e);
3. merge a piece of one character into the piece on its right, unless the piece on its left is
   shorter (or there is none on the right), until no piece is shorter than two characters
   (b · an · kn · ot · e → ban · kn · ote);

then keep the pieces seen at least ``min_count`` times in the training split, and add the 26 single
letters, the end-of-word token ``</w>`` and the whole-word tokens that cannot be spelled (``<eos>``,
``<unk>``, and IMDB's ``<emoticon>``, ``<num>``, ``<sym>``) whatever their count. A kept piece is one symbol
(``charlm.corpora.word_tokenizers.VowelSubwordTokenizer``); a piece that was not kept is
spelled letter by letter; every word ends with ``</w>``.

The rules leave some things open; charlm decides them so:

- the vowels are a, e, i, o, u (not y);
- merging goes left to right, one single character at a time; a tie in length merges right;
- a "word" that is not all lowercase letters (PTB's ``<unk>``, ``N``, ``$``, ``'s``, and the
  end-of-sentence ``<eos>`` a line ends with) is one piece, kept by the same count, else spelled
  where it is letters and ``<unk>`` otherwise.

The paper gives its vocabulary sizes, not its cutoff, so a recipe that follows it names the size
(``symbols``) and charlm takes the cutoff whose vocabulary comes closest (``cutoff_for``). On PTB's
training words that is 15: 2,366 subwords, 2,393 symbols with the letters and ``</w>`` (the paper:
2,405).

IMDB reviews are raw text; the paper replaces emoticons and non-word symbols by special tokens
first (``review_words``).
"""

from __future__ import annotations

import bisect
import collections
import re
import string

VOWELS = frozenset("aeiou")
LETTERS = tuple(string.ascii_lowercase)
END_OF_WORD = "</w>"
END_OF_SENTENCE = "<eos>"
DEFAULT_MIN_COUNT = 15  # on PTB: the cutoff whose vocabulary is closest to the paper's
EMOTICON, NUMBER, SYMBOL = "<emoticon>", "<num>", "<sym>"
UNKNOWN_WORD = "<unk>"
# Whole-word tokens that cannot be spelled in letters: kept whatever their count, like the letters.
ALWAYS_KEPT = frozenset({END_OF_SENTENCE, UNKNOWN_WORD, EMOTICON, NUMBER, SYMBOL})


def vowel_pieces(word: str) -> list[str]:
    """The pieces of one word by rules 1-3 (a word that is not all lowercase letters is one piece)."""
    if not word or any(c not in string.ascii_lowercase for c in word):
        return [word]
    pieces, consonants, i = [], "", 0
    while i < len(word):
        character = word[i]
        if character not in VOWELS:
            consonants += character
            i += 1
            continue
        if consonants:
            pieces.append(consonants)
            consonants = ""
        linked = i + 1 < len(word) and word[i + 1] not in VOWELS
        pieces.append(word[i : i + 2] if linked else character)  # the vowel and the consonant after it
        i += 2 if linked else 1
    if consonants:
        pieces.append(consonants)
    while len(pieces) > 1:
        single = next((k for k, piece in enumerate(pieces) if len(piece) == 1), None)
        if single is None:
            break
        left = pieces[single - 1] if single > 0 else None
        right = pieces[single + 1] if single + 1 < len(pieces) else None
        if right is None or (left is not None and len(left) < len(right)):
            pieces[single - 1 : single + 1] = [left + pieces[single]]
        else:
            pieces[single : single + 2] = [pieces[single] + right]
    return pieces


def piece_counts(text: str) -> collections.Counter:
    """How often each piece occurs in ``text``'s words (``<eos>`` included)."""
    return collections.Counter(piece for word in sentence_words(text) for piece in vowel_pieces(word))


def sentence_words(text: str):
    """The words of ``text``, ``<eos>`` after every line."""
    for line in text.splitlines(keepends=True):
        yield from line.split()
        if line.endswith(("\n", "\r")):
            yield END_OF_SENTENCE


def kept_pieces(counts: collections.Counter, min_count: int) -> list[str]:
    """The pieces a cutoff of ``min_count`` keeps besides the letters, sorted: those seen ``min_count``
    times, and the whole-word tokens of ``ALWAYS_KEPT`` that occur."""
    return sorted(
        piece
        for piece, count in counts.items()
        if (count >= min_count or piece in ALWAYS_KEPT) and piece not in LETTERS
    )


def vocabulary_size(counts: collections.Counter, min_count: int) -> int:
    """The symbols a cutoff of ``min_count`` gives: the kept pieces, the 26 letters and ``</w>``."""
    return len(kept_pieces(counts, min_count)) + len(LETTERS) + 1


def cutoff_for(counts: collections.Counter, symbols: int) -> int:
    """The frequency cutoff whose vocabulary size comes closest to ``symbols``: the count of the rarest
    piece kept (on a tie, the smaller vocabulary)."""
    if symbols < len(LETTERS) + 1:
        raise ValueError(f"a vowel-linked vocabulary has at least {len(LETTERS) + 1} symbols, not {symbols}")
    ascending = sorted(count for piece, count in counts.items() if piece not in LETTERS and piece not in ALWAYS_KEPT)
    fixed = len(LETTERS) + 1 + sum(1 for piece in counts if piece in ALWAYS_KEPT)
    candidates = sorted(set(ascending)) + [(ascending[-1] if ascending else 0) + 1]  # the last keeps none

    def distance(min_count):
        return abs(len(ascending) - bisect.bisect_left(ascending, min_count) + fixed - symbols)

    return min(reversed(candidates), key=distance)


# --- IMDB reviews as words ---------------------------------------------------------------------
# The Delta-RNN paper replaces emoticons and non-word symbols by special tokens before cutting words,
# without listing them, so charlm chooses: text is lowercased; an emoticon that starts a token (eyes
# : ; =, an optional nose - o ^ ', a mouth, or the mirror image, or a heart <3) is <emoticon>; a
# number (digits, with . or , between them) is <num>; English contractions split off as in PTB's
# tokenisation (do n't, it 's); any other run of characters that are not letters, digits or spaces is
# one <sym>.
_REVIEW_TOKEN = re.compile(
    r"""
    (?P<emoticon>(?<!\S)(?:[:;=][-o^']?[()\[\]dp/\\|*3]|[()\[\]][-']?[:;=]|<3)(?![a-z0-9]))
  | (?P<contraction>n't\b|'(?:s|re|ve|ll|d|m)\b)
  | (?P<word>[a-z]+?(?=n't\b)|[a-z]+)
  | (?P<number>[0-9]+(?:[.,][0-9]+)*)
  | (?P<space>\s+)
  | (?P<symbol>[^a-z0-9\s]+)
""",
    re.VERBOSE,
)
_SPECIAL = {"emoticon": EMOTICON, "number": NUMBER, "symbol": SYMBOL}


def review_words(text: str) -> str:
    """``text`` (one review per line) as lowercase words and special tokens, one space between them."""
    lines = []
    for line in text.lower().split("\n"):
        words = (
            _SPECIAL.get(match.lastgroup, match.group())
            for match in _REVIEW_TOKEN.finditer(line)
            if match.lastgroup != "space"
        )
        lines.append(" ".join(words))
    return "\n".join(lines)
