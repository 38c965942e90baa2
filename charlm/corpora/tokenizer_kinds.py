"""Every kind of tokenizer by the name its state carries, and rebuilding one from that state."""

from charlm.corpora.tokenizer import ByteTokenizer, CharTokenizer, Tokenizer
from charlm.corpora.word_tokenizers import SubwordTokenizer, VowelSubwordTokenizer, WordTokenizer

TOKENIZER_KINDS = {
    kind.kind: kind for kind in (CharTokenizer, ByteTokenizer, WordTokenizer, SubwordTokenizer, VowelSubwordTokenizer)
}


def tokenizer_from_state(state: dict) -> Tokenizer:
    """The tokenizer ``Tokenizer.to_state()`` described (its ``kind`` picks the class)."""
    kind = state.get("kind")
    if kind not in TOKENIZER_KINDS:
        raise ValueError(f"unknown tokenizer kind {kind!r}")
    return TOKENIZER_KINDS[kind].from_own_state(state)
