"""Recipes on archives built here (text8, enwik8, imdb), local text, pydoc; atomic and idempotent output."""

import hashlib
import io
import tarfile
import zipfile
import zlib
from dataclasses import replace

import numpy as np
import pytest

import charlm.corpora.store

from charlm.corpora.vowel_subwords import cutoff_for, piece_counts, review_words, vocabulary_size
from charlm.corpora import RECIPES, DownloadPolicy, data_root, list_corpora, load_corpus, prepare_corpus
from charlm.errors import CharlmError

FAST = DownloadPolicy(attempts=2, backoff=0.0, timeout=5.0)


def zip_bytes(member: str, data: bytes) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr(member, data)
    return buffer.getvalue()


def served_recipe(server, name: str, filename: str, archive: bytes, *, publish_members: bool = True):
    """The real recipe ``name``, downloading ``archive`` from the local server with its size and sha256
    (and, with ``publish_members``, the CRC-32 of its members, as if this archive were the published one)."""
    server.files[filename] = archive
    recipe = RECIPES[name]
    file = replace(
        recipe.inputs.file,
        url=server.url(filename),
        size=len(archive),
        sha256=hashlib.sha256(archive).hexdigest(),
        md5=None,
    )
    inputs = replace(recipe.inputs, file=file)
    if publish_members and recipe.inputs.member_crc32:
        with zipfile.ZipFile(io.BytesIO(archive)) as members:
            inputs = replace(
                inputs, member_crc32={member: zlib.crc32(members.read(member)) for member in inputs.member_crc32}
            )
    return replace(recipe, inputs=inputs)


@pytest.fixture
def text8_prefix(shared_corpora) -> bytes:
    with open(shared_corpora / "text8" / "text8.prefix-10M.txt", "rb") as file:
        return file.read(200_000)


# --- text8, enwik8, imdb ------------------------------------------------------------------------


def test_text8_from_a_served_zip(corpus_server, text8_prefix, tmp_path):
    recipe = served_recipe(corpus_server, "text8", "text8.zip", zip_bytes("text8", text8_prefix))
    corpus = prepare_corpus(recipe, data_dir=tmp_path, download_policy=FAST, progress=False)
    assert [corpus.tokens(s) for s in ("train", "valid", "test")] == [180_000, 10_000, 10_000]
    assert corpus.vocab_size == 27 and corpus.split("train").dtype == np.uint8
    assert corpus.tokenizer.decode(corpus.split("train")[:30]) == text8_prefix[:30].decode()
    assert corpus.tokenizer.decode(corpus.split("test")) == text8_prefix[-10_000:].decode()
    assert (tmp_path / "downloads" / "text8.zip").exists()


def test_text8_url_override_with_the_recipe_checksums(corpus_server, text8_prefix, tmp_path):
    archive = zip_bytes("text8", text8_prefix)
    recipe = served_recipe(corpus_server, "text8", "elsewhere.zip", archive)
    recipe = replace(
        recipe, inputs=replace(recipe.inputs, file=replace(recipe.inputs.file, url="http://127.0.0.1:9/x"))
    )
    corpus_server.files["mirror/text8.zip"] = archive
    corpus = prepare_corpus(
        recipe, url=corpus_server.url("mirror/text8.zip"), data_dir=tmp_path, download_policy=FAST, progress=False
    )
    assert corpus.meta["origin"].endswith("/mirror/text8.zip") and corpus.tokens("valid") == 10_000


def test_text8_zip_with_a_bad_crc_is_a_corrupt_archive(text8_prefix, tmp_path):
    archive = bytearray(zip_bytes("text8", text8_prefix))
    archive[40 + len("text8") : 40 + len("text8") + 50] = bytes(50)  # damage the deflate stream
    path = tmp_path / "text8.zip"
    path.write_bytes(bytes(archive))
    with pytest.raises(CharlmError, match="differs from the published corpus: size: expected 31344016"):
        prepare_corpus("text8", source=path, data_dir=tmp_path / "data", progress=False)
    with pytest.raises(CharlmError, match="text8.zip is a corrupt or truncated archive"):
        prepare_corpus(
            "text8", source=path, data_dir=tmp_path / "data", verify=False, progress=False, log=lambda message: None
        )
    assert not (tmp_path / "data" / "text8").exists()


def test_text8_zip_holding_another_text_is_rejected_by_the_member_crc(corpus_server, text8_prefix, tmp_path):
    recipe = served_recipe(corpus_server, "text8", "text8.zip", zip_bytes("text8", text8_prefix), publish_members=False)
    expected = f"text8 CRC-32: expected 0x7d6be66f, got {zlib.crc32(text8_prefix):#010x}"
    with pytest.raises(
        CharlmError, match=f"text8.zip holds files that differ from the published corpus: {expected}; moved aside"
    ):
        prepare_corpus(recipe, data_dir=tmp_path, download_policy=FAST, progress=False)
    assert not (tmp_path / "downloads" / "text8.zip").exists()
    assert not (tmp_path / "text8").exists()


def test_text8_from_an_unzipped_local_file(text8_prefix, tmp_path):
    (tmp_path / "text8").write_bytes(text8_prefix)
    with pytest.raises(
        CharlmError, match="text8 differs from the published corpus: its CRC-32: expected 0x7d6be66f.*--no-verify"
    ):
        prepare_corpus("text8", source=tmp_path / "text8", data_dir=tmp_path / "data", progress=False)
    assert not (tmp_path / "data" / "text8").exists()
    warnings = []
    corpus = prepare_corpus(
        "text8",
        source=tmp_path / "text8",
        data_dir=tmp_path / "data",
        verify=False,
        progress=False,
        log=warnings.append,
    )
    assert corpus.tokens("train") == 180_000
    assert any("warning: using a modified local copy" in message and "CRC-32" in message for message in warnings)


def test_enwik8_is_bytes(corpus_server, tmp_path):
    data = ("<page><title>Zürich</title> naïve café — ok</page>\n" * 400).encode("utf-8")
    recipe = served_recipe(corpus_server, "enwik8", "enwik8.zip", zip_bytes("enwik8", data))
    corpus = prepare_corpus(recipe, data_dir=tmp_path, download_policy=FAST, progress=False)
    assert corpus.unit == "byte"
    assert sum(corpus.tokens(s) for s in ("train", "valid", "test")) == len(data)
    assert corpus.characters("valid") == corpus.tokens("valid") == -(-len(data) * 5 // 100)
    assert corpus.vocab_size == len(set(data)) and all(len(symbol) == 1 for symbol in corpus.tokenizer.vocab)
    assert corpus.tokenizer.decode(corpus.split("train")[:60]) == data[:60].decode("utf-8", errors="replace")
    assert corpus.tokenizer.encode("café") == [corpus.tokenizer.vocab.index(chr(b)) for b in "café".encode()]


def test_enwik8_byte_missing_from_training_follows_the_unknown_policy(tmp_path):
    data = b"abc " * 10_000 + b"\xff" * 10
    (tmp_path / "enwik8").write_bytes(data)
    with pytest.raises(CharlmError, match="the test split has symbols that the training split lacks: 'byte 0xff'"):
        prepare_corpus("enwik8", source=tmp_path / "enwik8", data_dir=tmp_path / "data", progress=False)
    corpus = prepare_corpus(
        "enwik8", source=tmp_path / "enwik8", data_dir=tmp_path / "data", unknown="unk", progress=False
    )
    unk = corpus.tokenizer.vocab.index("<unk>")
    assert int((np.asarray(corpus.split("test")) == unk).sum()) == 10


def imdb_archive(reviews: dict[str, str]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for path, text in {**reviews, "aclImdb/README": "not a review", "aclImdb/train/urls_pos.txt": "x"}.items():
            data = text.encode("utf-8")
            info = tarfile.TarInfo(path)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def imdb_reviews() -> dict[str, str]:
    words = "the movie was good bad great awful plot actor scene story ending music funny boring".split()

    def review(seed):
        return " ".join(words[(seed * 7 + i * 3) % len(words)] for i in range(40)) + ".<br /><br />The end :) 10/10"

    return {
        f"aclImdb/{part}/{label}/{i}_{i % 10}.txt": review(i + len(label) + len(part))
        for part, labels in (("train", ("pos", "neg", "unsup")), ("test", ("pos", "neg")))
        for label in labels
        for i in range(30)
    }


def imdb_lines(reviews, part):
    """The reviews of ``part`` in the recipe's order, one per line, ``<br />`` as a space."""
    return "".join(reviews[p].replace("<br />", " ") + "\n" for p in sorted(reviews) if f"/{part}/" in p)


def test_imdb_subword_is_the_papers_scheme_on_words_and_special_tokens(corpus_server, tmp_path):
    reviews = imdb_reviews()
    recipe = served_recipe(corpus_server, "imdb-subword", "aclImdb_v1.tar.gz", imdb_archive(reviews))
    recipe = replace(recipe, vowel_symbols=40)  # the paper's 1,926 would keep every piece of this small archive
    corpus = prepare_corpus(recipe, data_dir=tmp_path, download_policy=FAST, progress=False)
    train_words = review_words(imdb_lines(reviews, "train"))
    assert "<emoticon> <num> <sym> <num>\n" in train_words and "<br" not in train_words
    counts = piece_counts(train_words)
    cutoff = cutoff_for(counts, 40)
    assert corpus.meta["subword"] == {"kind": "vowel-linked", "vocab_size": 40, "min_count": cutoff}
    assert corpus.vocab_size == vocabulary_size(counts, cutoff)
    assert all(abs(corpus.vocab_size - 40) <= abs(vocabulary_size(counts, c) - 40) for c in range(1, 200))
    test = review_words(imdb_lines(reviews, "test"))
    halves = test.splitlines(keepends=True)
    assert corpus.tokenizer.decode(corpus.split("valid")) == "".join(halves[:30])
    assert corpus.tokenizer.decode(corpus.split("test")) == "".join(halves[30:])


def test_imdb_subword_with_sentencepiece_keeps_the_raw_text(corpus_server, tmp_path):
    reviews = imdb_reviews()
    recipe = served_recipe(corpus_server, "imdb-subword", "aclImdb_v1.tar.gz", imdb_archive(reviews))
    corpus = prepare_corpus(
        recipe, subword="bpe", vocab_size=120, data_dir=tmp_path, download_policy=FAST, progress=False
    )
    assert corpus.name == "imdb-subword" and corpus.unit == "subword" and corpus.vocab_size == 120
    test = imdb_lines(reviews, "test").splitlines(keepends=True)
    assert corpus.tokenizer.decode(corpus.split("valid")) == "".join(test[:30])
    assert corpus.tokenizer.decode(corpus.split("test")) == "".join(test[30:])
    assert corpus.characters("train") == len(imdb_lines(reviews, "train"))
    assert corpus.tokens("train") < corpus.characters("train") / 2
    assert corpus.meta["subword"] == {"kind": "bpe", "vocab_size": 120}


# --- text and pydoc -----------------------------------------------------------------------------


@pytest.fixture
def prose(tmp_path):
    path = tmp_path / "prose.txt"
    path.write_text("The quick brown fox jumps over the lazy dog.\r\n" * 300, encoding="utf-8")
    return path


def test_text_corpus_splits_contiguously(prose, tmp_path):
    corpus = prepare_corpus("text", paths=[prose], output_name="fox", data_dir=tmp_path / "data", progress=False)
    n = 45 * 300  # CRLF turned into LF
    assert [corpus.tokens(s) for s in ("train", "valid", "test")] == [n - 2 * 675, 675, 675]
    assert "\r" not in corpus.tokenizer.vocab and corpus.meta["unknown"] == "error"
    corpus = prepare_corpus(
        "text", paths=[prose], output_name="fox", split=(0.8, 0.1, 0.1), data_dir=tmp_path / "data", progress=False
    )
    assert corpus.tokens("valid") == n // 10 and corpus.meta["split_rule"] == "contiguous 80/10/10 by characters"


def test_text_unknown_symbols_error_or_unk(tmp_path):
    path = tmp_path / "book.txt"
    path.write_text("abc " * 1000 + "xyz é!", encoding="utf-8")  # the test split ends in symbols train lacks
    with pytest.raises(CharlmError) as error:
        prepare_corpus("text", paths=[path], output_name="book", data_dir=tmp_path / "data", progress=False)
    assert "split has symbols that the training split lacks" in str(error.value) and "--unknown unk" in str(error.value)
    corpus = prepare_corpus(
        "text", paths=[path], output_name="book", unknown="unk", data_dir=tmp_path / "data", progress=False
    )
    tokenizer = corpus.tokenizer
    assert tokenizer.vocab[-1] == "<unk>" and tokenizer.unk == "<unk>"
    assert tokenizer.vocab == [" ", "a", "b", "c", "<unk>"]
    assert tokenizer.encode("aé") == [1, 4]
    assert int((np.asarray(corpus.split("test")) == 4).sum()) == len("xyzé!\n")  # the file gets a final newline


def test_text_that_is_not_utf8_is_a_clear_error(tmp_path):
    path = tmp_path / "latin1.txt"
    path.write_bytes("naïve text\n".encode("latin-1") * 100)
    with pytest.raises(CharlmError, match=r"latin1.txt is not UTF-8 text: byte 0xef at offset 2"):
        prepare_corpus("text", paths=[path], output_name="bad", data_dir=tmp_path / "data", progress=False)
    assert list((tmp_path / "data").glob("*")) == []


def test_text_reads_directories_in_name_order(tmp_path):
    folder = tmp_path / "books"
    folder.mkdir()
    (folder / "b.txt").write_text("second " * 200, encoding="utf-8")
    (folder / "a.txt").write_text("first " * 200 + "\n", encoding="utf-8")
    (folder / ".hidden").write_text("ignored", encoding="utf-8")
    corpus = prepare_corpus("text", paths=[folder], output_name="books", data_dir=tmp_path / "data", progress=False)
    assert corpus.tokenizer.decode(corpus.split("train")[:12]) == "first first "
    assert set(corpus.meta["sources"]) == {str(folder / "a.txt"), str(folder / "b.txt")}


def test_text_with_subword_option(prose, tmp_path):
    corpus = prepare_corpus(
        "text",
        paths=[prose],
        output_name="fox",
        subword="bpe",
        vocab_size=40,
        data_dir=tmp_path / "data",
        progress=False,
    )
    assert corpus.name == "fox-bpe40" and corpus.unit == "subword" and corpus.vocab_size == 40
    assert (
        load_corpus("fox-bpe40", tmp_path / "data").tokenizer.decode(corpus.split("valid"))
        == ("The quick brown fox jumps over the lazy dog.\n" * 300)[-1350:-675]
    )


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(paths=None), "needs at least one PATH"),
        (dict(output_name=None), "needs --name NAME"),
        (dict(output_name="../escape"), "must be letters, digits"),
        (dict(split=(0.5, 0.5, 0.5)), "three positive fractions that sum to 1"),
        (dict(unknown="ignore"), "--unknown must be one of error, unk"),
        (dict(subword="wordpiece"), "--subword must be one of bpe, unigram"),
        (dict(source="x.zip"), "downloads nothing"),
    ],
)
def test_text_option_errors(prose, tmp_path, options, message):
    arguments = {**dict(paths=[prose], output_name="fox", data_dir=tmp_path / "data", progress=False), **options}
    with pytest.raises(CharlmError, match=message):
        prepare_corpus("text", **arguments)


def test_pydoc_is_python_documentation_split_90_5_5(tmp_path):
    from pydoc_data import topics

    text = "".join(topics.topics[key] for key in sorted(topics.topics))
    corpus = prepare_corpus("pydoc", data_dir=tmp_path, progress=False)
    sizes = [corpus.tokens(s) for s in ("train", "valid", "test")]
    assert sum(sizes) == len(text) and sizes[1] == sizes[2] == -(-len(text) // 20)
    assert corpus.tokenizer.decode(corpus.split("test")) == text[-sizes[2] :]


# --- errors, atomic output, idempotence, catalog ------------------------------------------------


def test_unknown_corpus_and_missing_corpus_errors(tmp_path):
    # "data" is relative: the directory of this test's own (conftest), never the repository's ./data
    with pytest.raises(CharlmError, match="unknown corpus 'nope': known corpora are ptb, "):
        prepare_corpus("nope", data_dir=tmp_path)
    with pytest.raises(CharlmError) as error:
        load_corpus("wp", "data")
    assert str(error.value) == (
        "corpus 'wp' is not prepared in data/: run `charlm prepare wp` (or `charlm prepare wp --source PATH` with a "
        "local copy)"
    )
    with pytest.raises(CharlmError, match=r"run `charlm prepare ptb --subword bpe --vocab-size 500`"):
        load_corpus("ptb-bpe500", tmp_path)
    with pytest.raises(CharlmError, match=r"charlm prepare text PATH\.\.\. --name mine"):
        load_corpus("mine", tmp_path)
    with pytest.raises(CharlmError, match="fixed split"):
        prepare_corpus("pydoc", split=(0.8, 0.1, 0.1), data_dir=tmp_path)
    with pytest.raises(CharlmError, match="only `charlm prepare text` takes PATHS"):
        prepare_corpus("ptb", paths=["x"], data_dir=tmp_path)


def test_failed_write_leaves_no_partial_directory(prose, tmp_path, monkeypatch):
    root = tmp_path / "data"
    prepare_corpus("text", paths=[prose], output_name="fox", data_dir=root, progress=False)
    before = (root / "fox" / "train.npy").read_bytes()
    calls = []

    def failing_write(path, array):
        calls.append(path)
        if len(calls) == 2:
            raise OSError("disk full")
        np.save(path, array)

    monkeypatch.setattr(charlm.corpora.store, "write_array", failing_write)
    prose.write_text("Different text now, so the inputs change.\n" * 300, encoding="utf-8")
    with pytest.raises(OSError, match="disk full"):
        prepare_corpus("text", paths=[prose], output_name="fox", data_dir=root, progress=False)
    assert sorted(p.name for p in root.iterdir()) == ["fox"]
    assert (root / "fox" / "train.npy").read_bytes() == before


def test_changed_inputs_prepare_again_same_inputs_do_not(prose, tmp_path):
    messages = []
    root = tmp_path / "data"
    first = prepare_corpus("text", paths=[prose], output_name="fox", data_dir=root, log=messages.append)
    assert any("wrote" in message for message in messages)
    messages.clear()
    prepare_corpus("text", paths=[prose], output_name="fox", data_dir=root, log=messages.append)
    assert messages == [f"fox is already prepared in {root / 'fox'} from the same inputs: nothing to do"]
    prose.write_text(prose.read_text() + "The lazy dog.\n", encoding="utf-8")
    second = prepare_corpus("text", paths=[prose], output_name="fox", data_dir=root, progress=False)
    assert second.meta["fingerprint"] != first.meta["fingerprint"]
    assert sorted(p.name for p in root.iterdir()) == [".versions", "fox"]  # the first kept for its runs
    assert [p.name for p in (root / ".versions" / "fox").iterdir()] == [first.meta["fingerprint"]]


def test_list_corpora_shows_recipes_and_prepared_text(prose, tmp_path):
    prepare_corpus("text", paths=[prose], output_name="fox", data_dir=tmp_path, progress=False)
    entries = {entry.name: entry for entry in list_corpora(tmp_path)}
    assert set(RECIPES) <= set(entries) and entries["ptb"].corpus is None
    assert entries["fox"].corpus.tokens("valid") == 675


def test_data_root_precedence(monkeypatch, tmp_path):
    monkeypatch.delenv("CHARLM_DATA", raising=False)
    assert str(data_root()) == "data"
    monkeypatch.setenv("CHARLM_DATA", str(tmp_path))
    assert data_root() == tmp_path and data_root("elsewhere").name == "elsewhere"


def test_vocabulary_size_prefers_the_prepared_corpus_and_falls_back_to_the_documented_one(tiny_corpus, tmp_path):
    from charlm.corpora.catalog import vocabulary_size

    assert vocabulary_size("tiny", tiny_corpus) == (load_corpus("tiny", tiny_corpus).vocab_size, False)
    empty = tmp_path / "nothing-prepared"
    # corpora.md: PTB 49 symbols + end-of-line, War and Peace 82 distinct, text8 27 symbols
    assert [vocabulary_size(name, empty) for name in ("ptb", "ptb-contiguous", "wp", "text8")] == [
        (50, True),
        (50, True),
        (82, True),
        (27, True),
    ]
    assert vocabulary_size("text", empty) == (None, True) and vocabulary_size("mine", empty) == (None, True)
