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
letters and the end-of-word token ``</w>``. A kept piece is one symbol (``charlm.corpora.tokenizer.VowelSubwordTokenizer``); a piece that was not kept is
spelled letter by letter; every word ends with ``</w>``.

The rules leave some things open; charlm decides them so:

- the vowels are a, e, i, o, u (not y);
- merging goes left to right, one single character at a time; a tie in length merges right;
- a "word" that is not all lowercase letters (PTB's ``<unk>``, ``N``, ``$``, ``'s``, and the
  end-of-sentence ``<eos>`` a line ends with) is one piece, kept by the same count, else spelled
  where it is letters and ``<unk>`` otherwise.

On PTB's training words the cutoff closest to the paper's 2,378 subwords is 15: 2,366 subwords,
2,393 symbols with the letters and ``</w>`` (the paper: 2,405).
"""

from __future__ import annotations

import collections
import string

VOWELS = frozenset("aeiou")
LETTERS = tuple(string.ascii_lowercase)
END_OF_WORD = "</w>"
END_OF_SENTENCE = "<eos>"
DEFAULT_MIN_COUNT = 15  # on PTB: the cutoff whose vocabulary is closest to the paper's


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
        pieces.append(word[i:i + 2] if linked else character)  # the vowel and the consonant after it
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
            pieces[single - 1:single + 1] = [left + pieces[single]]
        else:
            pieces[single:single + 2] = [pieces[single] + right]
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
