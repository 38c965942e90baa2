"""The corpus recipes: where each corpus comes from, how its text is read (``charlm.corpora.parsers``),
and how it is split.

One ``Recipe`` per corpus, registered explicitly in ``RECIPES`` (read-only). The figures quoted in
the descriptions are those of the corpus specification, which the tests reproduce.
"""

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType

from charlm.corpora.download import RemoteFile
from charlm.corpora.parsers import (
    parse_enwik8,
    parse_imdb,
    parse_ptb_chars,
    parse_ptb_chars_contiguous,
    parse_ptb_words,
    parse_pydoc,
    parse_shakespeare,
    parse_shakespeare_nanogpt,
    parse_text8,
    parse_text_files,
    parse_war_and_peace,
)
from charlm.corpora.inputs import LocalTextFiles, PythonDocumentation, RemoteInputs
from charlm.corpora.sources import SizeLimits
from charlm.corpora.splits import DEFAULT_FRACTIONS, SPLITS, describe_fractions
from charlm.corpora.vowel_subwords import review_words


@dataclass(frozen=True)
class Recipe:
    """How to make one corpus.

    ``parse`` turns the gathered files (``{name: bytes}``; it may pop them to free memory) and the
    split fractions into ``{"train": ..., "valid": ..., "test": ...}``: text, or bytes for a byte
    corpus.
    """

    name: str
    description: str
    unit: str  # "char", "byte", "word" or "subword": what one token is
    inputs: RemoteInputs | LocalTextFiles | PythonDocumentation
    parse: Callable[[dict[str, bytes], tuple | None], dict]
    fractions: tuple[float, float, float] | None = None  # contiguous split of one text; None: given files
    user_split: bool = False  # whether --split applies
    space_symbol: str | None = None  # the vocabulary symbol that stands for a space (PTB's "_")
    subword_kind: str = "bpe"  # the default model of a subword recipe
    unknown: str = "error"  # default policy for valid/test symbols absent from training
    vocab_size: int | None = None  # what its default preparation gives (corpora.md); None: it depends on the text
    vowel_symbols: int | None = None  # the vocabulary size its vowel-linked subwords aim at (the paper's)
    word_text: Callable[[str], str] | None = None  # its raw text as words, before vowel-linked subwords
    split_text: str | None = None  # its split in words, where ``parse`` splits by a rule of its own (not fractions)

    def split_rule(self, fractions=None) -> str:
        """How the splits are made, in words, for meta.json and messages."""
        fractions = fractions or self.fractions
        if fractions is None:
            return self.split_text or "the source's own train/valid/test files"
        return f"contiguous {describe_fractions(fractions)} by {'bytes' if self.unit == 'byte' else 'characters'}"


PTB_ARCHIVE = RemoteFile(
    url="http://www.fit.vutbr.cz/~imikolov/rnnlm/simple-examples.tgz",
    filename="simple-examples.tgz",
    note="no trusted checksum for the archive (a mirror's MD5 30177ea32e27c525793142b6bf2c8e2d is "
    "unverified); its members are checked instead",
)

PTB_SHA256 = {
    "ptb.char.train.txt": "e313d91425e06c4f0a8fb6e881dcce0c291f2a0e9f4dda54833069b122f91da9",
    "ptb.char.valid.txt": "21661f63ec355085879458b6524644d4add5573541b4be14fb52ab2e2e995eb8",
    "ptb.char.test.txt": "1ef5607ac3c463b16e38bfe7900dd3bfc91de5a96e0f21e7eab5188b465b8ebe",
    "ptb.train.txt": "fcea919f6cf83f35d4d00c6cbf08040d13d4155226340912e2fef9c9c4102cbf",
    "ptb.valid.txt": "c9fe6985fe0d4ccb578183407d7668fc6066c20700cb4cf87d8ff1cc34df1bf2",
    "ptb.test.txt": "dd65dff31e70846b2a6030a87482edcd5d199130cdcfa1f3dccbb033728deee0",
}


# Twice the largest member (ptb.char.train.txt, 10,034,964 bytes), and twice the three char files together.
PTB_LIMITS = SizeLimits(member=2 * 10_034_964, total=2 * 11_705_894)


def _ptb_inputs(members):
    return RemoteInputs(PTB_ARCHIVE, members, PTB_LIMITS, member_sha256={name: PTB_SHA256[name] for name in members})


def _single_member(file: RemoteFile, member: str, member_size: int, **checks) -> RemoteInputs:
    """The inputs of a corpus that is one file of ``member_size`` bytes (or an archive of it);
    anything over twice that size is refused."""
    return RemoteInputs(file, (member,), SizeLimits(member=2 * member_size, total=2 * member_size), **checks)


PTB = Recipe(
    name="ptb",
    description="Penn Treebank, characters (Mikolov's files)",
    unit="char",
    inputs=_ptb_inputs(tuple(f"ptb.char.{s}.txt" for s in SPLITS)),
    parse=parse_ptb_chars,
    space_symbol="_",
    vocab_size=50,
)

PTB_CONTIGUOUS = replace(
    PTB,
    name="ptb-contiguous",
    description="Penn Treebank, characters, the three files as one text split 90/5/5 (the LRU paper's split)",
    parse=parse_ptb_chars_contiguous,
    fractions=DEFAULT_FRACTIONS,
)

PTB_WORD = Recipe(
    name="ptb-word",
    description="Penn Treebank, words (Mikolov's 10,000-word files: <unk> for rare words, <eos> ends each sentence)",
    unit="word",
    inputs=_ptb_inputs(tuple(f"ptb.{s}.txt" for s in SPLITS)),
    parse=parse_ptb_words,
    vocab_size=10_000,
)

PTB_SUBWORD = Recipe(
    name="ptb-subword",
    description="Penn Treebank, subwords of the word-level files (the Delta-RNN paper's vowel-linked pieces)",
    unit="subword",
    inputs=_ptb_inputs(tuple(f"ptb.{s}.txt" for s in SPLITS)),
    parse=parse_ptb_words,
    subword_kind="vowel-linked",
    vowel_symbols=2_405,  # the paper's Table 2; the closest cutoff (15) gives 2,393
    vocab_size=2_393,
)

WP = Recipe(
    name="wp",
    description="War and Peace (char-rnn), split 90/5/5",
    unit="char",
    inputs=_single_member(
        RemoteFile(
            url="https://cs.stanford.edu/people/karpathy/char-rnn/warpeace_input.txt",
            filename="warpeace_input.txt",
            size=3_258_246,
            sha256="fb66ba999dafe24017cdd59e04c56d385a9c8466993d374fd4c6f08b2142985e",
        ),
        "warpeace_input.txt",
        3_258_246,
        member_sha256={"warpeace_input.txt": "fb66ba999dafe24017cdd59e04c56d385a9c8466993d374fd4c6f08b2142985e"},
    ),
    parse=parse_war_and_peace,
    fractions=DEFAULT_FRACTIONS,
    vocab_size=82,
)

SHAKESPEARE_SHA256 = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"

SHAKESPEARE = Recipe(
    name="shakespeare",
    description="Tiny Shakespeare (char-rnn's and nanoGPT's input.txt): nanoGPT's 90% train, its last 10% "
    "halved into valid and test",
    unit="char",
    inputs=_single_member(
        RemoteFile(
            url="https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt",
            filename="tinyshakespeare-input.txt",
            size=1_115_394,
            sha256=SHAKESPEARE_SHA256,
        ),
        "input.txt",
        1_115_394,
        member_sha256={"input.txt": SHAKESPEARE_SHA256},
    ),
    parse=parse_shakespeare,
    fractions=DEFAULT_FRACTIONS,  # on its 1,115,394 characters: 1,003,854 / 55,770 / 55,770, nanoGPT's training split
    vocab_size=65,
)

SHAKESPEARE_NANOGPT = replace(
    SHAKESPEARE,
    name="shakespeare-nanogpt",
    description=(
        "Tiny Shakespeare, nanoGPT's exact split (its train.bin, val.bin): 90% train, 10% valid; test repeats valid"
    ),
    parse=parse_shakespeare_nanogpt,
    fractions=None,
    split_text="nanoGPT's: the first int(0.9 n) characters train, the rest valid; test is valid again",
)

TEXT8 = Recipe(
    name="text8",
    description="text8: cleaned Wikipedia, 27 symbols",
    unit="char",
    inputs=_single_member(
        RemoteFile(
            url="http://mattmahoney.net/dc/text8.zip",
            filename="text8.zip",
            size=31_344_016,
            note="no published sha256: the member text8 is checked by its CRC-32 (0x7d6be66f)",
        ),
        "text8",
        100_000_000,
        member_crc32={"text8": 0x7D6BE66F},
    ),
    parse=parse_text8,
    fractions=DEFAULT_FRACTIONS,
    vocab_size=27,
)

ENWIK8 = Recipe(
    name="enwik8",
    description="enwik8: Wikipedia XML, bytes",
    unit="byte",
    inputs=_single_member(
        RemoteFile(
            url="http://mattmahoney.net/dc/enwik8.zip",
            filename="enwik8.zip",
            size=36_445_475,
            sha256="547994d9980ebed1288380d652999f38a14fe291a6247c157c3d33d4932534bc",
        ),
        "enwik8",
        100_000_000,
    ),
    parse=parse_enwik8,
    fractions=DEFAULT_FRACTIONS,
    vocab_size=205,  # not in corpora.md: the distinct bytes of the whole file, as published; train may have fewer
)

IMDB_SUBWORD = Recipe(
    name="imdb-subword",
    description="IMDB movie reviews, subwords (the Delta-RNN paper's vowel-linked pieces)",
    unit="subword",
    subword_kind="vowel-linked",
    vowel_symbols=1_926,  # the paper's Table 2
    word_text=review_words,
    vocab_size=1_926,  # the paper's count: charlm's on the real archive is not measured (no copy here)
    inputs=RemoteInputs(
        RemoteFile(
            url="https://ai.stanford.edu/~amaas/data/sentiment/aclImdb_v1.tar.gz",
            filename="aclImdb_v1.tar.gz",
            size=84_125_825,
            sha256="c40f74a18d3b61f90feba1e17730e0d38e8b97c05fde7008942e91923d1658fe",
            md5="7c2ac02c03563afcf9b574c7e56c153a",
            note="size and sha256 as published in the Hugging Face imdb metadata, md5 as in torchtext",
        ),
        members=tuple(
            f"*{part}/{label}/*.txt"
            for part, label in (
                ("train", "pos"),
                ("train", "neg"),
                ("train", "unsup"),
                ("test", "pos"),
                ("test", "neg"),
            )
        ),
        # a review is at most a few tens of kilobytes; the 100,000 read hold about 133 MB
        limits=SizeLimits(member=1_000_000, total=300_000_000),
    ),
    parse=parse_imdb,
)

TEXT = Recipe(
    name="text",
    description="your text: prepare text PATH... --name NAME, or train --text FILE in one step",
    unit="char",
    inputs=LocalTextFiles(),
    parse=parse_text_files,
    fractions=DEFAULT_FRACTIONS,
    user_split=True,
)

PYDOC = Recipe(
    name="pydoc",
    description="Python's own documentation, offline",
    unit="char",
    inputs=PythonDocumentation(),
    parse=parse_pydoc,
    fractions=DEFAULT_FRACTIONS,
    unknown="unk",  # the text differs between Python versions, so valid/test may hold a symbol train lacks
    vocab_size=104,  # Python 3.11's documentation, the <unk> entry included; other versions differ slightly
)

RECIPES: Mapping[str, Recipe] = MappingProxyType(
    {
        recipe.name: recipe
        for recipe in (
            PTB,
            PTB_CONTIGUOUS,
            PTB_WORD,
            PTB_SUBWORD,
            WP,
            SHAKESPEARE,
            SHAKESPEARE_NANOGPT,
            TEXT8,
            ENWIK8,
            IMDB_SUBWORD,
            TEXT,
            PYDOC,
        )
    }
)
