"""Reading a corpus's files as text: one parser per corpus, from the files gathered for it
(``{name: bytes}``, popped as they are read to free memory) and the split fractions to
``{"train": ..., "valid": ..., "test": ...}``; and the text helpers they share (UTF-8 with the
offending byte named, newlines, Penn Treebank's symbols)."""

from pathlib import PurePosixPath

from charlm.corpora.sources import shown_name
from charlm.corpora.splits import SPLITS, split_contiguous
from charlm.errors import CharlmError


def decode_utf8(data: bytes, name: str) -> str:
    """``data`` as text; a clear error naming the file and the first bad byte when it is not UTF-8."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise CharlmError(
            f"{name} is not UTF-8 text: byte 0x{data[error.start]:02x} at offset {error.start:,} ({error.reason})"
        ) from None


def _member_text(files, member: str) -> str:
    """The text of the one file a corpus is made of, taken out of ``files``; named as the user gave it."""
    return decode_utf8(files.pop(member), shown_name(files, member))


def normalize_newlines(text: str) -> str:
    """Strip a byte-order mark and turn CRLF (and lone CR) line endings into LF."""
    return text.removeprefix("\ufeff").replace("\r\n", "\n").replace("\r", "\n")


def lines_of(text: str) -> list[str]:
    """The lines of ``text``, without a whitespace-only remainder after the last newline."""
    lines = text.split("\n")
    if not lines[-1].strip():
        lines.pop()
    return lines


def ptb_symbols(text: str, name: str) -> str:
    """A Penn Treebank char file as one character per token: each line's symbols, then ``\\n``."""
    out = []
    for number, line in enumerate(lines_of(text), start=1):
        symbols = line.split()
        joined = "".join(symbols)
        if len(joined) != len(symbols):
            raise CharlmError(f"{name} line {number} has a symbol longer than one character")
        out.append(joined + "\n")
    return "".join(out)


def sentences(text: str) -> str:
    """One sentence per line, words separated by single spaces (a word-level PTB file as plain text)."""
    return "".join(" ".join(line.split()) + "\n" for line in lines_of(text))


# --- parsers, one per corpus --------------------------------------------------------------------


def parse_ptb_chars(files, fractions):
    return {
        s: ptb_symbols(decode_utf8(files.pop(f"ptb.char.{s}.txt"), f"ptb.char.{s}.txt"), f"ptb.char.{s}.txt")
        for s in SPLITS
    }


def parse_ptb_chars_contiguous(files, fractions):
    """The three char files as one text (train, valid, test in that order), cut 90/5/5 as the LRU paper does."""
    parts = parse_ptb_chars(files, None)
    return split_contiguous("".join(parts[s] for s in SPLITS), fractions)


def parse_ptb_words(files, fractions):
    return {s: sentences(decode_utf8(files.pop(f"ptb.{s}.txt"), f"ptb.{s}.txt")) for s in SPLITS}


def parse_war_and_peace(files, fractions):
    text = normalize_newlines(_member_text(files, "warpeace_input.txt"))
    return split_contiguous(text, fractions)


def parse_shakespeare(files, fractions):
    text = normalize_newlines(_member_text(files, "input.txt"))
    return split_contiguous(text, fractions)


def parse_shakespeare_nanogpt(files, fractions):
    """nanoGPT's split (``data/shakespeare_char/prepare.py``): the first ``int(n * 0.9)`` characters for
    training, the rest for validation. nanoGPT has no test split: test is the validation text again."""
    text = normalize_newlines(_member_text(files, "input.txt"))
    cut = int(len(text) * 0.9)
    return {"train": text[:cut], "valid": text[cut:], "test": text[cut:]}


def parse_text8(files, fractions):
    return split_contiguous(_member_text(files, "text8"), fractions)


def parse_enwik8(files, fractions):
    return split_contiguous(memoryview(files.pop("enwik8")), fractions)


def parse_imdb(files, fractions):
    """Training reviews one per line (``<br />`` as a space); test reviews by path, halved into valid/test."""

    def review(path):
        text = decode_utf8(files.pop(path), path).replace("<br />", " ")
        return " ".join(text.splitlines()) + "\n"

    def part(path):
        return PurePosixPath(path).parts[-3]  # aclImdb/<part>/<label>/<id>_<rating>.txt

    paths = sorted(files)
    test = [path for path in paths if part(path) == "test"]
    if len(test) < 2:
        raise CharlmError(f"the archive has {len(test)} test reviews: at least 2 are needed for valid and test")
    half = len(test) // 2
    return {
        "train": "".join(review(path) for path in paths if part(path) == "train"),
        "valid": "".join(review(path) for path in test[:half]),
        "test": "".join(review(path) for path in test[half:]),
    }


def parse_text_files(files, fractions):
    """The files in the order given, each ending with a newline, split contiguously."""
    texts = []
    for name in list(files):
        text = normalize_newlines(decode_utf8(files.pop(name), name))
        texts.append(text if text.endswith("\n") or not text else text + "\n")
    return split_contiguous("".join(texts), fractions)


def parse_pydoc(files, fractions):
    return split_contiguous(files.pop("pydoc_data.topics").decode("utf-8"), fractions)
