"""Training a subword model on a corpus's training split: sentencepiece (BPE or unigram), or the
Delta-RNN paper's vowel-linked pieces (``charlm.corpora.vowel_subwords``).

The model is lossless on the text it is trained for: no normalisation, no dummy prefix, spaces kept
as they are, every training character covered. Lines are its sentences; the newline is the model's
end-of-sentence piece, so decoded text keeps its line structure.
"""

import io
import os

import sentencepiece

from charlm.corpora.word_tokenizers import SUBWORD_SEGMENT, SubwordTokenizer, VowelSubwordTokenizer, line_segments
from charlm.errors import CharlmError

SENTENCEPIECE_KINDS = ("bpe", "unigram")
SUBWORD_KINDS = (*SENTENCEPIECE_KINDS, "vowel-linked")
UNK_PIECE = "\u2047"  # sentencepiece's own rendering of an unknown piece
MAX_TRAINING_CHARACTERS = 20_000_000  # larger training splits are sampled evenly, line by line


def training_sentences(text: str, budget: int = MAX_TRAINING_CHARACTERS) -> list[str]:
    """The sentences sentencepiece learns from: line segments, an even sample when over ``budget``."""
    sentences = [segment for line in text.split("\n") for segment in line_segments(line) if segment]
    if len(text) <= budget or not sentences:
        return sentences
    keep_every = len(text) / budget
    return sentences[:: max(1, round(keep_every))]


def train_subword_tokenizer(text: str, kind: str, vocab_size: int | None, allow_unknown: bool = False):
    """Train a ``kind`` ("bpe" or "unigram") model of ``vocab_size`` pieces on ``text``, or build the
    vowel-linked pieces of its words at the frequency cutoff whose vocabulary comes closest to
    ``vocab_size`` (None: the cutoff 15).

    With ``allow_unknown``, characters the model lacks encode to its unknown piece; without, they are
    an error.
    """
    if kind == "vowel-linked":
        return VowelSubwordTokenizer.build(text, symbols=vocab_size)
    if kind not in SUBWORD_KINDS:
        raise CharlmError(f"unknown subword kind {kind!r}: choose one of {', '.join(SUBWORD_KINDS)}")
    if vocab_size < 3:
        raise CharlmError(f"--vocab-size must be at least 3, not {vocab_size}")
    model = io.BytesIO()
    try:
        sentencepiece.SentencePieceTrainer.train(
            sentence_iterator=iter(training_sentences(text)),
            model_writer=model,
            model_type=kind,
            vocab_size=vocab_size,
            character_coverage=1.0,
            normalization_rule_name="identity",
            add_dummy_prefix=False,
            remove_extra_whitespaces=False,
            unk_id=0,
            unk_piece=UNK_PIECE,  # a piece named "<unk>" would keep "<" and ">" out of the model
            eos_id=1,
            eos_piece="\n",
            bos_id=-1,
            pad_id=-1,
            max_sentence_length=4 * SUBWORD_SEGMENT,  # in bytes: at most four per character
            num_threads=os.cpu_count() or 1,
            minloglevel=2,
        )
    except RuntimeError as error:
        reason = str(error).strip().splitlines()[-1] if str(error).strip() else type(error).__name__
        raise CharlmError(f"sentencepiece could not train a {kind} model of {vocab_size} pieces: {reason}") from None
    return SubwordTokenizer(model.getvalue(), unk=UNK_PIECE if allow_unknown else None)
