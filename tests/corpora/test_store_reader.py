"""The validating reader of prepared corpora and archives: a table of damaged files per format, each
one line naming the file, exit code 2, nothing allocated or written; checksums that `prepare` and
`train` verify; corpora prepared before checksums still load.

The corpus is 300 lines of "The quick brown fox jumps over the lazy dog.\\n" (13,500 characters): a
90/5/5 split gives 12,150 / 675 / 675 tokens, and the vocabulary is the 26 lowercase letters, "T",
" ", "." and "\\n": 30 symbols, ids stored as uint8.
"""

import gzip
import hashlib
import io
import json
import random
import shutil
import struct
import tarfile
import zipfile

import numpy as np
import pytest
from helpers import cli

from charlm.corpora import load_corpus, prepare_corpus
from charlm.corpora.store_reader import prepare_command
from charlm.errors import CharlmError

PROSE = "The quick brown fox jumps over the lazy dog.\n" * 300
ADVICE = "; run `charlm prepare text PATH... --name fox` to prepare it again"
TRAIN_TOKENS, VOCAB = 12_150, 30


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """A data root holding the prepared corpus `fox` (never modified: tests damage a copy)."""
    folder = tmp_path_factory.mktemp("pristine")
    (folder / "prose.txt").write_text(PROSE, encoding="utf-8")
    corpus = prepare_corpus(
        "text", paths=[folder / "prose.txt"], output_name="fox", data_dir=folder / "data", progress=False
    )
    assert (corpus.tokens("train"), corpus.vocab_size, corpus.split("train").dtype) == (TRAIN_TOKENS, VOCAB, np.uint8)
    return folder


@pytest.fixture
def data(pristine, tmp_path):
    """A copy of the pristine data root, to damage."""
    shutil.copytree(pristine / "data", tmp_path / "data")
    shutil.copy(pristine / "prose.txt", tmp_path / "prose.txt")
    return tmp_path / "data"


def edit_meta(data, change):
    path = data / "fox" / "meta.json"
    meta = json.loads(path.read_text(encoding="utf-8"))
    change(meta)
    path.write_text(json.dumps(meta), encoding="utf-8")


def without(key):
    return lambda meta: meta.pop(key)


def duplicated_vocab(meta):
    for vocab in (meta["vocab"], meta["tokenizer"]["vocab"]):
        vocab[1] = vocab[0]  # "\n" twice, " " gone


def save_split(data, which, array, **options):
    np.save(data / "fox" / f"{which}.npy", array, **options)


def train_ids(data):
    return np.load(data / "fox" / "train.npy")


def with_id(data, which, position, value):
    ids = np.load(data / "fox" / f"{which}.npy").copy()
    ids[position] = value
    save_split(data, which, ids)


FILE = {"meta": "fox/meta.json", "train": "fox/train.npy", "valid": "fox/valid.npy"}
DAMAGED_CORPORA = {  # what is done to the corpus → the file named, and what is said of it
    "meta.json a list": (lambda d: (d / "fox/meta.json").write_text("[1, 2]"), "meta", "holds a list, not an object"),
    "meta.json a link to nowhere": (
        lambda d: ((d / "fox/meta.json").unlink(), (d / "fox/meta.json").symlink_to(d / "gone")),
        "meta",
        "is missing",
    ),
    "meta.json a link to itself": (
        lambda d: ((d / "fox/meta.json").unlink(), (d / "fox/meta.json").symlink_to("meta.json")),
        "meta",
        "cannot be read (Too many levels of symbolic links)",
    ),
    "meta.json not JSON": (lambda d: (d / "fox/meta.json").write_text('{"name": '), "meta", "is not JSON (Expecting"),
    "meta.json without its tokenizer": (lambda d: edit_meta(d, without("tokenizer")), "meta", "has no 'tokenizer'"),
    "meta.json of another format": (
        lambda d: edit_meta(d, lambda m: m.update(format_version=99)),
        "meta",
        "was written in format 99, this charlm reads format 1",
    ),
    "vocab_size one too many": (
        lambda d: edit_meta(d, lambda m: m.update(vocab_size=31)),
        "meta",
        "has a vocab of 30 entries, but vocab_size 31",
    ),
    "vocab_size 10^9": (
        lambda d: edit_meta(d, lambda m: m.update(vocab_size=10**9)),
        "meta",
        "has a vocab of 30 entries, but vocab_size 1,000,000,000",
    ),
    "vocab_size a string": (
        lambda d: edit_meta(d, lambda m: m.update(vocab_size="30")),
        "meta",
        "is damaged: 'vocab_size' is text ('30')",
    ),
    "vocab with duplicates": (
        lambda d: edit_meta(d, duplicated_vocab),
        "meta",
        "has a tokenizer whose vocabulary holds '\\n' twice",
    ),
    "tokenizer of an unknown kind": (
        lambda d: edit_meta(d, lambda m: m["tokenizer"].update(kind="morse")),
        "meta",
        "has a tokenizer whose vocabulary is of unknown kind 'morse'",
    ),
    "tokenizer kind a list": (
        lambda d: edit_meta(d, lambda m: m["tokenizer"].update(kind=["char"])),
        "meta",
        "has a tokenizer whose vocabulary is of unknown kind ['char']",
    ),
    "a symbol no output can print": (
        lambda d: edit_meta(d, lambda m: [v.__setitem__(0, "\ud800") for v in (m["vocab"], m["tokenizer"]["vocab"])]),
        "meta",
        "has a tokenizer whose vocabulary holds '\\ud800', which is not Unicode text (a lone surrogate)",
    ),
    "meta.json nested too deeply": (
        lambda d: (d / "fox/meta.json").write_text("[" * 100_000 + "]" * 100_000),
        "meta",
        "is not JSON (maximum recursion depth exceeded",
    ),
    "multi-character entry in a character vocab": (
        lambda d: edit_meta(d, lambda m: [v.__setitem__(0, "\n\n") for v in (m["vocab"], m["tokenizer"]["vocab"])]),
        "meta",
        "has a tokenizer whose char vocabulary holds '\\n\\n', not one character",
    ),
    "split tokens a float": (
        lambda d: edit_meta(d, lambda m: m["splits"]["valid"].update(tokens=675.0)),
        "meta",
        "has valid tokens 675.0, not a count",
    ),
    ".npy truncated": (
        lambda d: (d / "fox/train.npy").write_bytes((d / "fox/train.npy").read_bytes()[:-150]),
        "train",
        "is truncated: its header promises 12,150 token ids in 12,278 bytes, the file has 12,128",
    ),
    ".npy of object dtype": (
        lambda d: save_split(d, "train", np.array([1] * TRAIN_TOKENS, dtype=object)),
        "train",
        "holds object values, not integer token ids",
    ),
    ".npy of float dtype": (
        lambda d: save_split(d, "train", train_ids(d).astype(np.float32)),
        "train",
        "holds float32 values, not integer token ids",
    ),
    ".npy of two dimensions": (
        lambda d: save_split(d, "train", train_ids(d).reshape(2, -1)),
        "train",
        "holds an array of shape (2, 6075), not one dimension of token ids",
    ),
    ".npy shorter than meta.json says": (
        lambda d: save_split(d, "train", train_ids(d)[:100]),
        "train",
        "holds 100 token ids, but meta.json records 12,150 for the train split",
    ),
    ".npy missing": (lambda d: (d / "fox/train.npy").unlink(), "train", "is missing"),
    ".npy not an array": (
        lambda d: (d / "fox/train.npy").write_bytes(b"not numpy at all" * 10),
        "train",
        "is not a readable .npy array (the magic string is not correct",
    ),
    ".npy whose header is cut short": (
        lambda d: (d / "fox/train.npy").write_bytes(
            b"\x93NUMPY\x01\x00\x40\x00" + b"{'descr': '|u1', 'shape': (12150,".ljust(63) + b"\n" + bytes(12150)
        ),
        "train",
        "is not a readable .npy array",
    ),
    # a split's ids and checksum are checked when it is first used: the valid split before any model is built
    "id equal to the vocabulary size": (
        lambda d: with_id(d, "valid", 7, 30),
        "valid",
        "holds the token id 30 at position 7, outside the vocabulary of 30",
    ),
    "id far above it": (
        lambda d: with_id(d, "valid", 674, 255),
        "valid",
        "holds the token id 255 at position 674, outside the vocabulary of 30",
    ),
    "zeroed array": (
        lambda d: save_split(d, "valid", np.zeros(675, dtype=np.uint8)),
        "valid",
        "differs from the checksum meta.json records for it (its contents are damaged)",
    ),
}


def snapshot(root):
    return {str(path): path.read_bytes() for path in sorted(root.rglob("*")) if path.is_file()}


@pytest.mark.parametrize("damage, file, problem", DAMAGED_CORPORA.values(), ids=DAMAGED_CORPORA)
def test_a_damaged_corpus_is_one_line_naming_the_file_and_nothing_is_written(damage, file, problem, data, tmp_path):
    damage(data)
    before = {name: content for name, content in snapshot(data).items()}
    result = cli(
        "train",
        "--corpus",
        "fox",
        "--data-dir",
        data,
        "--run-dir",
        tmp_path / "run",
        "--hidden",
        "8",
        "--epochs",
        "1",
        "--batch-size",
        "4",
        "--eval-batch-size",
        "2",
    )
    assert result.returncode == 2 and result.stdout == "" and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.startswith(f"charlm: error: {data / FILE[file]}: {problem}")
    assert result.stderr.endswith(f"{ADVICE}\n") and result.stderr.count("\n") == 1, result.stderr
    assert not (tmp_path / "run").exists() and snapshot(data) == before


def test_damage_is_found_before_anything_is_allocated(data, monkeypatch):
    monkeypatch.setattr(np, "load", lambda *a, **k: pytest.fail("an array was loaded"))
    edit_meta(data, lambda meta: meta.update(vocab_size=10**9))
    with pytest.raises(CharlmError, match="vocab_size 1,000,000,000"):
        load_corpus("fox", data)
    edit_meta(data, lambda meta: (meta.update(vocab_size=30), meta["splits"]["train"].update(tokens=10**12)))
    path = data / "fox/train.npy"
    shape, huge = b"(12150,), }", b"(1000000000000,), }"  # the header keeps its length: padding gives way
    path.write_bytes(path.read_bytes().replace(shape + b" " * (len(huge) - len(shape)), huge))
    with pytest.raises(
        CharlmError,
        match="train.npy: is truncated: its header promises 1,000,000,000,000 token ids "
        "in 1,000,000,000,128 bytes, the file has 12,278",
    ):
        load_corpus("fox", data)


def test_ids_are_checked_when_a_split_is_first_used(data):
    with_id(data, "train", 3, 200)
    corpus = load_corpus("fox", data)  # meta.json and the headers are fine
    assert len(corpus.split("valid")) == 675
    with pytest.raises(CharlmError, match="train.npy: holds the token id 200 at position 3, outside the vocabulary"):
        corpus.split("train")


def test_meta_records_size_and_sha256_of_each_array(pristine):
    meta = json.loads((pristine / "data/fox/meta.json").read_text(encoding="utf-8"))
    for which in ("train", "valid", "test"):
        content = (pristine / "data/fox" / f"{which}.npy").read_bytes()
        assert meta["files"][f"{which}.npy"] == {"bytes": len(content), "sha256": hashlib.sha256(content).hexdigest()}
    assert (
        meta["files"]["train.npy"]["bytes"] == 128 + TRAIN_TOKENS
    )  # a version 1.0 header of 128 bytes, one byte an id


def test_prepare_prepares_a_damaged_array_again_instead_of_nothing_to_do(data):
    good = train_ids(data).copy()
    save_split(data, "train", np.zeros(TRAIN_TOKENS, dtype=np.uint8))
    messages = []
    corpus = prepare_corpus(
        "text", paths=[data.parent / "prose.txt"], output_name="fox", data_dir=data, log=messages.append
    )
    assert messages[0] == (
        f"{data / 'fox/train.npy'}: differs from the checksum meta.json records for it (its "
        "contents are damaged): preparing fox again"
    )
    assert not any("nothing to do" in message for message in messages)
    assert np.array_equal(corpus.split("train"), good)
    messages.clear()
    prepare_corpus("text", paths=[data.parent / "prose.txt"], output_name="fox", data_dir=data, log=messages.append)
    assert messages == [f"fox is already prepared in {data / 'fox'} from the same inputs: nothing to do"]


def test_prepare_through_the_command_line_says_it_prepares_again(data):
    edit_meta(data, lambda meta: meta.update(tokenizer=[]))
    result = cli("prepare", "text", data.parent / "prose.txt", "--name", "fox", "--quiet", "--data-dir", data)
    assert result.returncode == 0, result.stderr
    assert result.stderr == (f"{data / 'fox/meta.json'}: is damaged: 'tokenizer' is a list ([]): preparing fox again\n")
    assert load_corpus("fox", data).tokens("train") == TRAIN_TOKENS


def test_a_corpus_prepared_before_checksums_loads_with_size_checks_only(data):
    edit_meta(data, without("files"))
    save_split(data, "train", np.zeros(TRAIN_TOKENS, dtype=np.uint8))  # undetectable without a checksum
    assert load_corpus("fox", data).split("train").sum() == 0
    (data / "fox/valid.npy").write_bytes((data / "fox/valid.npy").read_bytes()[:-1])
    with pytest.raises(
        CharlmError,
        match=r"valid.npy: is truncated: its header promises 675 token ids in 803 bytes, "
        "the file has 802",
    ):
        load_corpus("fox", data)


@pytest.mark.parametrize(
    "name, meta, command",
    [
        ("wp", {"request": {"recipe": "wp", "subword_kind": None}}, "charlm prepare wp"),
        (
            "ptb-bpe500",
            {"request": {"recipe": "ptb", "subword_kind": "bpe", "vocab_size": 500}},
            "charlm prepare ptb --subword bpe --vocab-size 500",
        ),
        (
            "mine-unigram80",
            {"request": {"recipe": "text", "subword_kind": "unigram", "vocab_size": 80}},
            "charlm prepare text PATH... --name mine --subword unigram --vocab-size 80",
        ),
        (
            "ptb-vowel-linked",
            {"request": {"recipe": "ptb", "subword_kind": "vowel-linked", "vocab_size": None}},
            "charlm prepare ptb --subword vowel-linked",
        ),
        ("mine-unigram80", None, "charlm prepare text PATH... --name mine-unigram80"),  # by the name: not built in
        ("ptb-bpe500", [1, 2], "charlm prepare ptb --subword bpe --vocab-size 500"),  # meta.json a list: by the name
        ("text8", None, "charlm prepare text8"),
    ],
)
def test_the_advice_names_the_prepare_command_that_made_it(name, meta, command, tmp_path):
    assert prepare_command(tmp_path / name, meta) == command


# --- archives ------------------------------------------------------------------------------------

PTB = {
    f"simple-examples/data/ptb.char.{split}.txt": b"a b _ c \n b _ a \n " * 50 for split in ("train", "valid", "test")
}
NOISE = {
    f"simple-examples/data/ptb.char.{split}.txt": random.Random(split).randbytes(100_000)
    for split in ("train", "valid", "test")
}  # incompressible: damage in the middle falls in a member's data


def tar_of(mode: str, members=PTB) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode=mode) as archive:
        for name, content in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(content)
            archive.addfile(info, io.BytesIO(content))
    return buffer.getvalue()


def zip_of(**central_changes) -> bytes:
    """A zip of the PTB members, each member's headers (local and central) changed: ``flags`` or'ed
    into the flag bits, ``method`` the compression method."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, content in PTB.items():
            archive.writestr(name, content)
    raw, start = bytearray(buffer.getvalue()), 0
    for signature, flags_at in ((b"PK\x03\x04", 6), (b"PK\x01\x02", 8)):
        start = 0
        while (start := raw.find(signature, start)) >= 0:
            if "flags" in central_changes:
                raw[start + flags_at] |= central_changes["flags"]
            if "method" in central_changes:
                raw[start + flags_at + 2 : start + flags_at + 4] = struct.pack("<H", central_changes["method"])
            start += 4
    return bytes(raw)


def damaged_body(data: bytes) -> bytes:
    """``data`` with 64 bytes in the middle zeroed: its header intact."""
    middle = len(data) // 2
    return data[:middle] + bytes(64) + data[middle + 64 :]


DAMAGED_ARCHIVES = {  # file name, contents → what is said of it
    "corrupt .tar.xz": (
        "simple-examples.tar.xz",
        lambda: damaged_body(tar_of("w:xz", NOISE)),
        "is a corrupt or truncated archive (Corrupt input data)",
    ),
    "corrupt .tar.xz header": (
        "simple-examples.tar.xz",
        lambda: damaged_body(tar_of("w:xz")),
        "is a corrupt or truncated archive (damaged xz data: not an lzma file)",
    ),
    "xz that is not xz": (
        "simple-examples.tar.xz",
        lambda: b"\xfd7zXZ\x00" + bytes(100),
        "is a corrupt or truncated archive (damaged xz data: not an lzma file)",
    ),
    "truncated .tar.gz": (
        "simple-examples.tgz",
        lambda: tar_of("w:gz", NOISE)[:150_000],
        "is a corrupt or truncated archive (Compressed file ended before the end-of-stream marker",
    ),
    ".tar.gz whose checksum fails": (
        "simple-examples.tgz",
        lambda: damaged_body(tar_of("w:gz", NOISE)),
        "is a corrupt or truncated archive (CRC check failed 0x",
    ),
    "corrupt .tar.bz2": (
        "simple-examples.tar.bz2",
        lambda: damaged_body(tar_of("w:bz2")),
        "is a corrupt or truncated archive (damaged bz2 data: not a bzip2 file)",
    ),
    "two megabytes of zeros after the end": (
        "simple-examples.tgz",
        lambda: gzip.compress(tar_of("w") + bytes(1 << 21)),
        "more than 1,048,576 bytes follow the archive's end; refused",
    ),
    "zip with an encrypted member": (
        "simple-examples.zip",
        lambda: zip_of(flags=1),
        "member 'simple-examples/data/ptb.char.train.txt' is encrypted; charlm reads only unencrypted archives",
    ),
    "zip member of an unknown method": (
        "simple-examples.zip",
        lambda: zip_of(method=99),
        "member 'simple-examples/data/ptb.char.train.txt' is compressed with method 99, "
        "which charlm cannot read (it reads stored, deflate, bzip2, LZMA)",
    ),
    "truncated zip": (
        "simple-examples.zip",
        lambda: zip_of()[:-40],
        "is a corrupt or truncated archive (File is not a zip file)",
    ),
    "zip with an LZMA stream that is not one": (
        "simple-examples.zip",
        lambda: zip_of(method=zipfile.ZIP_LZMA),
        "is a corrupt or truncated archive (",
    ),
}


@pytest.mark.parametrize("filename, contents, problem", DAMAGED_ARCHIVES.values(), ids=DAMAGED_ARCHIVES)
def test_a_damaged_archive_is_one_line_naming_it(filename, contents, problem, tmp_path):
    archive = tmp_path / filename
    archive.write_bytes(contents())
    result = cli("prepare", "ptb", "--source", archive, "--quiet", "--data-dir", tmp_path / "data")
    assert result.returncode == 2 and result.stdout == "" and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.startswith(f"charlm: error: {archive}") and problem in result.stderr, result.stderr
    assert result.stderr.count("\n") == 1
    assert sorted(path.name for path in tmp_path.iterdir()) == [filename]  # nothing prepared, nothing extracted


def test_a_damaged_download_is_named_and_moved_aside(corpus_server, tmp_path, monkeypatch):
    monkeypatch.setenv("CHARLM_DOWNLOAD_ATTEMPTS", "1")
    corpus_server.files["simple-examples.tgz"] = damaged_body(tar_of("w:gz", NOISE))
    result = cli("prepare", "ptb", "--url", corpus_server.url("simple-examples.tgz"), "--quiet", "--data-dir", tmp_path)
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith(
        f"charlm: error: {tmp_path / 'downloads/simple-examples.tgz'} is a corrupt or "
        "truncated archive (CRC check failed 0x"
    )
    assert "moved aside" in result.stderr and sorted(path.name for path in tmp_path.iterdir()) == ["downloads"]


def test_a_genuine_archive_of_each_kind_still_reads(tmp_path):
    for filename, contents in (
        ("a.tar.xz", tar_of("w:xz")),
        ("b.tar.bz2", tar_of("w:bz2")),
        ("c.tgz", tar_of("w:gz")),
        ("d.zip", zip_of()),
    ):
        (tmp_path / filename).write_bytes(contents)
        corpus = prepare_corpus(
            "ptb",
            source=tmp_path / filename,
            verify=False,
            data_dir=tmp_path / "data",
            progress=False,
            log=lambda message: None,
        )
        assert corpus.tokens("train") == 50 * len("ab_c\nb_a\n")
