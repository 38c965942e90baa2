"""`charlm train --text FILE` (and a file given as --corpus): the text prepared as a corpus in the
same step, reused while its sha256 is unchanged, and an evaluation batch that a short split holds."""

import json
import shutil

import pytest

import charlm
from charlm.config import TrainConfig
from charlm.errors import CharlmError
from helpers import SHARED_CORPORA, assert_one_line_error, cli

SMALL = ("--hidden", "8", "--epochs", "1", "--batch-size", "4", "--bptt", "16", "--max-tokens", "640")


@pytest.fixture
def shakespeare_text():
    """The first characters of the real Tiny Shakespeare file, as a user's own text would be."""
    path = SHARED_CORPORA / "shakespeare" / "input.txt"
    if not path.is_file():
        pytest.skip(f"Tiny Shakespeare is not at {path}")
    return path.read_text(encoding="utf-8")


def train(tmp_path, *args, run="run", check_code=0):
    return cli(
        "train", *args, "--data-dir", tmp_path / "data", "--run-dir", tmp_path / run, *SMALL, check_code=check_code
    )


def test_text_is_prepared_then_trained_on_and_reused_while_unchanged(tmp_path, shakespeare_text):
    source = tmp_path / "my.txt"
    source.write_text(shakespeare_text[:20_000], encoding="utf-8")
    first = train(tmp_path, "--text", source)
    line = next(line for line in first.stderr.splitlines() if line.startswith("prepared"))
    assert line == (
        f"prepared {source} as corpus 'my' in {tmp_path / 'data' / 'my'} (17,999 / 1,001 / 1,001 tokens, "
        f"train / valid / test, char vocabulary 58)"
    )  # a final newline added
    assert "on my [cpu]" in first.stderr
    recorded = json.loads((tmp_path / "run" / "config.json").read_text())["train"]
    assert recorded["corpus"] == "my" and recorded["text"] == [str(source)] and recorded["eval_batch_size"] == 16
    meta = tmp_path / "data" / "my" / "meta.json"
    before = meta.stat().st_mtime_ns

    again = train(tmp_path, "--corpus", source, run="again")  # a file as --corpus: the same as --text
    assert (
        f"reusing corpus 'my' in {tmp_path / 'data' / 'my'}: prepared from {source}, unchanged (the same sha256)"
        in again.stderr
    )
    assert "prepared " + str(source) not in again.stderr and meta.stat().st_mtime_ns == before

    source.write_text(shakespeare_text[:30_000], encoding="utf-8")  # the user edits the file
    changed = train(tmp_path, "--text", source, run="changed")
    assert f"{source} changed: prepared it again as corpus 'my'" in changed.stderr
    assert "(26,999 / 1,501 / 1,501 tokens" in changed.stderr


def test_a_tiny_file_gets_an_evaluation_batch_that_fits_unless_one_is_given(tmp_path, shakespeare_text):
    source = tmp_path / "tiny.txt"
    source.write_text(shakespeare_text[:300], encoding="utf-8")
    result = train(tmp_path, "--text", source)
    assert "--eval-batch-size 15, not 16: the valid split of 'tiny' has only 15 predictions" in result.stderr
    assert "<unk> for the symbols of valid/test absent from train" in result.stderr  # its last lines have new letters
    assert json.loads((tmp_path / "run" / "config.json").read_text())["train"]["eval_batch_size"] == 15
    assert "test bpc" in result.stdout
    given = train(tmp_path, "--text", source, "--eval-batch-size", "16", run="given", check_code=2)
    assert_one_line_error(
        given, "--eval-batch-size is 16, more streams than the 15 predictions of the valid split of 'tiny'"
    )
    assert not (tmp_path / "given").exists()


def test_names_are_never_taken_from_a_built_in_corpus_or_other_text(tmp_path, shakespeare_text):
    wp = tmp_path / "wp.txt"
    wp.write_text(shakespeare_text[:5_000], encoding="utf-8")
    assert_one_line_error(
        train(tmp_path, "--text", wp, check_code=2),
        "'wp' is a built-in corpus",
        f"name the corpus of {wp} with --corpus NAME",
    )
    assert "prepared" in train(tmp_path, "--text", wp, "--corpus", "mine").stderr
    other = tmp_path / "elsewhere" / "mine.txt"  # another file that would be named 'mine'
    other.parent.mkdir()
    other.write_text(shakespeare_text[5_000:10_000], encoding="utf-8")
    assert_one_line_error(
        train(tmp_path, "--text", other, run="other", check_code=2),
        "corpus 'mine' in",
        f"was prepared from other text ({wp})",
    )
    (tmp_path / "data" / "downloads").mkdir()
    downloads = tmp_path / "downloads.txt"
    downloads.write_text(shakespeare_text[:5_000], encoding="utf-8")
    assert_one_line_error(
        train(tmp_path, "--text", downloads, run="d", check_code=2), "is already there, and is not a prepared corpus"
    )


def test_a_corpus_path_that_is_no_file_is_said_plainly(tmp_path):
    assert_one_line_error(
        train(tmp_path, "--corpus", tmp_path / "nope" / "input.txt", check_code=2),
        "is not a corpus name, and as a file it does not exist",
    )
    (tmp_path / "texts").mkdir()
    assert_one_line_error(
        train(tmp_path, "--corpus", tmp_path / "texts", check_code=2),
        "is a directory: to train on the text files in it, give --text",
    )


def test_python_and_config_files_take_text_too(tmp_path, shakespeare_text):
    source = tmp_path / "play.txt"
    source.write_text(shakespeare_text[:8_000], encoding="utf-8")
    summary = charlm.train(
        text=source,
        data_dir=tmp_path / "data",
        run_dir=tmp_path / "api",
        hidden_size=8,
        epochs=1,
        batch_size=4,
        bptt=16,
        max_tokens=320,
    )
    assert summary["run_dir"] == str(tmp_path / "api")
    config = tmp_path / "exp.json"
    config.write_text(json.dumps({"text": [str(source)], "hidden": 8, "epochs": 1, "batch_size": 4, "max_tokens": 320}))
    result = cli(
        "train", "--config", config, "--data-dir", tmp_path / "data", "--run-dir", tmp_path / "file", check_code=0
    )
    assert "reusing corpus 'play'" in result.stderr


def test_a_trainer_given_text_it_cannot_prepare_refuses_it(tmp_path):
    with pytest.raises(CharlmError, match="text names files, but corpus 'pydoc' was not prepared from text"):
        charlm.Trainer(TrainConfig(text=["play.txt"], data_dir=str(tmp_path / "data"), run_dir=str(tmp_path / "run")))
    with pytest.raises(CharlmError, match="text must be a list"):
        TrainConfig(text="play.txt").validate()


def test_resuming_on_a_corpus_prepared_again_goes_on_with_the_version_it_began_on(tmp_path, shakespeare_text):
    source = tmp_path / "my.txt"
    source.write_text(shakespeare_text[:2_000], encoding="utf-8")
    train(tmp_path, "--text", source)
    source.write_text("Zebra quay!\n" + shakespeare_text[:2_000], encoding="utf-8")  # new letters: a new vocabulary
    train(tmp_path, "--text", source, run="second")
    resumed = cli("train", "--resume", tmp_path / "run", "--max-tokens", "1280", check_code=0)
    assert "corpus 'my' was prepared again since" in resumed.stderr and "the version it trained on" in resumed.stderr
    kept = tmp_path / "data" / ".versions" / "my"
    shutil.rmtree(kept)  # the earlier version removed by hand: refused, never trained on other text
    result = cli("train", "--resume", tmp_path / "run", "--max-tokens", "1920")
    assert_one_line_error(result, "corpus 'my' in", "is not the version the run trained on", str(kept.parent))


def test_a_damaged_prepared_copy_is_prepared_again_not_reused(tmp_path, shakespeare_text):
    source = tmp_path / "my.txt"
    source.write_text(shakespeare_text[:4_000], encoding="utf-8")
    train(tmp_path, "--text", source)
    train_ids = tmp_path / "data" / "my" / "train.npy"
    train_ids.write_bytes(train_ids.read_bytes()[:-8] + bytes(8))  # the last ids zeroed: the checksum differs
    again = train(tmp_path, "--text", source, run="again")
    assert (
        "differs from the checksum meta.json records" in again.stderr
        and f"prepared {source} as corpus 'my'" in again.stderr
    )
    (tmp_path / "data" / "my" / "meta.json").write_text("{not json")
    third = train(tmp_path, "--text", source, run="third")
    assert "meta.json: is not JSON" in third.stderr and f"prepared {source} as corpus 'my'" in third.stderr


def test_the_corpus_is_named_after_the_file():
    from charlm.training.run_inputs import corpus_name_for

    assert [corpus_name_for(name) for name in ("input.txt", "my notes (1).md", ".hidden.txt", "ü.txt")] == [
        "input",
        "my-notes-1",
        "hidden",
        "text",
    ]
