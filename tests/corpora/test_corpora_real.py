"""The built-in corpora from the real files in ../shared/corpora: the published counts, exactly."""

import hashlib
import io
import tarfile

import numpy as np
import pytest

from charlm.corpora import RECIPES, DownloadPolicy, load_corpus, prepare_corpus
from charlm.errors import CharlmError
from conftest import SHARED_CORPORA_DIR

FAST = DownloadPolicy(attempts=2, backoff=0.0, timeout=5.0)

PTB_CHAR_FILES = [f"ptb.char.{split}.txt" for split in ("train", "valid", "test")]


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """ptb and wp prepared once from ../shared/corpora, into one data root."""
    if not SHARED_CORPORA_DIR.is_dir():
        pytest.skip(f"the reference corpora are not at {SHARED_CORPORA_DIR}")
    root = tmp_path_factory.mktemp("data")
    for name in ("ptb", "wp"):
        prepare_corpus(name, source=SHARED_CORPORA_DIR / name, data_dir=root, progress=False)
    return root


def test_ptb_reproduces_the_published_counts(prepared):
    ptb = load_corpus("ptb", prepared)
    assert [ptb.tokens(s) for s in ("train", "valid", "test")] == [5_017_482, 393_042, 442_423]
    assert [len(ptb.split(s)) for s in ("train", "valid", "test")] == [5_017_482, 393_042, 442_423]
    assert ptb.vocab_size == 50 == RECIPES["ptb"].vocab_size and ptb.unit == "char"
    assert ptb.characters("valid") == 393_042
    assert ptb.split("train").dtype == np.uint8 and isinstance(ptb.split("train"), np.memmap)
    assert (
        ptb.meta["sources"]["ptb.char.train.txt"] == "e313d91425e06c4f0a8fb6e881dcce0c291f2a0e9f4dda54833069b122f91da9"
    )


def test_ptb_contiguous_is_the_three_files_as_one_text_split_90_5_5(prepared):
    """The LRU paper's PTB: first 90% / next 5% / last 5% of train+valid+test, not Mikolov's files."""
    prepare_corpus("ptb-contiguous", source=SHARED_CORPORA_DIR / "ptb", data_dir=prepared, progress=False)
    contiguous, files = load_corpus("ptb-contiguous", prepared), load_corpus("ptb", prepared)
    assert [contiguous.tokens(s) for s in ("train", "valid", "test")] == [5_267_651, 292_648, 292_648]
    assert sum(contiguous.tokens(s) for s in ("train", "valid", "test")) == 5_017_482 + 393_042 + 442_423
    assert contiguous.vocab_size == 50 and contiguous.meta["split_rule"] == "contiguous 90/5/5 by characters"
    whole = np.concatenate([files.split(s) for s in ("train", "valid", "test")])
    assert contiguous.tokenizer.vocab == files.tokenizer.vocab
    assert np.array_equal(np.concatenate([contiguous.split(s) for s in ("train", "valid", "test")]), whole)


def test_ptb_tokens_are_symbols_with_underscore_for_space_and_newline_per_line(prepared):
    ptb = load_corpus("ptb", prepared)
    train = ptb.split("train")
    newline = ptb.tokenizer.vocab.index("\n")
    assert int((train == newline).sum()) == 42_068
    assert int((train == ptb.tokenizer.vocab.index("_")).sum()) == 845_453
    assert ptb.tokenizer.decode(train[:20]) == "aer banknote berlitz"
    assert ptb.tokenizer.encode("the cat") == ptb.tokenizer.encode("the_cat")
    assert ptb.tokenizer.decode(ptb.tokenizer.encode("the cat\n")) == "the cat\n"


def test_war_and_peace_reproduces_the_published_counts(prepared):
    wp = load_corpus("wp", prepared)
    assert [wp.tokens(s) for s in ("train", "valid", "test")] == [2_876_590, 159_811, 159_811]
    assert (
        wp.vocab_size == 82 == RECIPES["wp"].vocab_size
        and "\r" not in wp.tokenizer.vocab
        and "\ufeff" not in wp.tokenizer.vocab
    )
    assert wp.tokenizer.decode(wp.split("train")[:30]) == '"Well, Prince, so Genoa and Luc'[:30]
    assert wp.meta["split_rule"] == "contiguous 90/5/5 by characters"


def test_same_inputs_again_do_nothing(prepared, capsys):
    before = (prepared / "wp" / "meta.json").stat().st_mtime_ns
    prepare_corpus("wp", source=SHARED_CORPORA_DIR / "wp", data_dir=prepared, progress=False)
    prepare_corpus("wp", data_dir=prepared, progress=False)  # no --source: the prepared corpus stands
    assert (prepared / "wp" / "meta.json").stat().st_mtime_ns == before
    assert capsys.readouterr().err.count("nothing to do") == 2


def test_ptb_from_the_archive_layout(shared_corpora, tmp_path):
    """A .tgz with ./simple-examples/data/ members, as --source and as a download from a server."""
    archive = tmp_path / "simple-examples.tgz"
    with tarfile.open(archive, "w:gz", compresslevel=1) as tar:
        for name in PTB_CHAR_FILES:
            tar.add(shared_corpora / "ptb" / name, arcname=f"./simple-examples/data/{name}")
    ptb = prepare_corpus("ptb", source=archive, data_dir=tmp_path / "data", progress=False)
    assert [ptb.tokens(s) for s in ("train", "valid", "test")] == [5_017_482, 393_042, 442_423]


def test_ptb_download_with_a_modified_member_is_refused_and_moved_aside(corpus_server, shared_corpora, tmp_path):
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", compresslevel=1) as tar:
        for name in PTB_CHAR_FILES:
            data = (shared_corpora / "ptb" / name).read_bytes()
            if name == "ptb.char.test.txt":
                data = data.replace(b"a", b"b", 1)
            info = tarfile.TarInfo(f"./simple-examples/data/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    corpus_server.files["simple-examples.tgz"] = buffer.getvalue()
    with pytest.raises(CharlmError) as error:
        prepare_corpus(
            "ptb", url=corpus_server.url("simple-examples.tgz"), data_dir=tmp_path, download_policy=FAST, progress=False
        )
    assert "ptb.char.test.txt sha256: expected 1ef5607a" in str(error.value)
    assert len(list((tmp_path / "downloads").glob("simple-examples.tgz.bad-*"))) == 1
    assert not (tmp_path / "ptb").exists()


def test_modified_local_copy_needs_no_verify(shared_corpora, tmp_path):
    copy = tmp_path / "ptb"
    copy.mkdir()
    for name in PTB_CHAR_FILES:
        (copy / name).write_bytes((shared_corpora / "ptb" / name).read_bytes())
    (copy / "ptb.char.valid.txt").write_bytes((copy / "ptb.char.valid.txt").read_bytes() + b"a \n ")
    with pytest.raises(CharlmError, match="differs from the published corpus.*--no-verify"):
        prepare_corpus("ptb", source=copy, data_dir=tmp_path / "data", progress=False)
    messages = []
    ptb = prepare_corpus(
        "ptb", source=copy, data_dir=tmp_path / "data", verify=False, progress=False, log=messages.append
    )
    assert ptb.tokens("valid") == 393_042 + 2
    assert any("modified local copy" in message for message in messages)
    assert ptb.meta["verified"] is False


def test_ptb_subword_on_the_word_files(shared_corpora, tmp_path):
    corpus = prepare_corpus(
        "ptb-subword", source=shared_corpora / "ptb", subword="bpe", vocab_size=500, data_dir=tmp_path, progress=False
    )  # sentencepiece, as a user may still ask
    assert corpus.unit == "subword" and corpus.vocab_size == 500
    # words joined by single spaces, one newline per sentence: as many characters as the char files have tokens
    assert [corpus.characters(s) for s in ("train", "valid", "test")] == [5_017_482, 393_042, 442_423]
    assert corpus.tokens("train") < corpus.characters("train") / 2
    sentence = corpus.tokenizer.decode(corpus.split("valid")[:40]).split("\n")[0]
    assert sentence == " ".join((shared_corpora / "ptb" / "ptb.valid.txt").read_text().split("\n")[0].split())


def test_wp_checksum_of_the_download(corpus_server, tmp_path):
    """The real wp recipe, its canonical address replaced by the local server (--url)."""
    path = SHARED_CORPORA_DIR / "wp" / "warpeace_input.txt"
    if not path.exists():
        pytest.skip("no War and Peace copy")
    data = path.read_bytes()
    corpus_server.files["warpeace_input.txt"] = data
    wp = prepare_corpus(
        "wp", url=corpus_server.url("warpeace_input.txt"), data_dir=tmp_path, download_policy=FAST, progress=False
    )
    assert wp.tokens("test") == 159_811
    assert wp.meta["sources"]["warpeace_input.txt"] == hashlib.sha256(data).hexdigest()
    assert wp.meta["origin"] == corpus_server.url("warpeace_input.txt")
