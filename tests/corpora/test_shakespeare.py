"""Tiny Shakespeare from the real file in ../shared/corpora: nanoGPT's training split, valid/test
halved from its validation split (`shakespeare`) or its exact split (`shakespeare-nanogpt`), checked."""

import hashlib

import numpy as np
import pytest

from charlm.corpora import RECIPES, load_corpus
from helpers import assert_one_line_error, cli

SHA256 = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"


@pytest.fixture
def input_txt(shared_corpora):
    path = shared_corpora / "shakespeare" / "input.txt"
    if not path.is_file():
        pytest.skip(f"Tiny Shakespeare is not at {path}")
    return path


def text_of(corpus, split) -> str:
    return corpus.tokenizer.decode(corpus.split(split))


def test_shakespeare_is_nanogpts_training_split_with_its_validation_split_halved(input_txt, tmp_path):
    result = cli(
        "prepare", "shakespeare", "--source", input_txt, "--data-dir", tmp_path / "data", "--quiet", check_code=0
    )
    assert "shakespeare: 1,003,854 / 55,770 / 55,770 tokens (train / valid / test), char vocabulary 65" in result.stdout
    corpus = load_corpus("shakespeare", tmp_path / "data")
    text = input_txt.read_text(encoding="utf-8")
    assert [corpus.tokens(s) for s in ("train", "valid", "test")] == [1_003_854, 55_770, 55_770]
    assert corpus.vocab_size == 65 == RECIPES["shakespeare"].vocab_size == len(set(text)) and corpus.unit == "char"
    assert text_of(corpus, "train") == text[: int(len(text) * 0.9)]  # nanoGPT's data[:int(n*0.9)]
    assert text_of(corpus, "valid") + text_of(corpus, "test") == text[1_003_854:]  # its val, halved
    assert text_of(corpus, "train").startswith("First Citizen:")
    assert corpus.meta["sources"] == {"input.txt": SHA256} and corpus.verified
    assert corpus.meta["split_rule"] == "contiguous 90/5/5 by characters"


def test_shakespeare_nanogpt_is_nanogpts_exact_split_and_test_repeats_valid(input_txt, tmp_path):
    """From the directory holding input.txt: 1,003,854 / 111,540, nanoGPT's train.bin and val.bin."""
    result = cli(
        "prepare",
        "shakespeare-nanogpt",
        "--source",
        input_txt.parent,
        "--data-dir",
        tmp_path / "data",
        "--quiet",
        check_code=0,
    )
    assert "shakespeare-nanogpt: 1,003,854 / 111,540 / 111,540 tokens" in result.stdout
    corpus = load_corpus("shakespeare-nanogpt", tmp_path / "data")
    text = input_txt.read_text(encoding="utf-8")
    assert text_of(corpus, "train") == text[:1_003_854] and text_of(corpus, "valid") == text[1_003_854:]
    assert np.array_equal(corpus.split("test"), corpus.split("valid")) and corpus.vocab_size == 65
    assert corpus.meta["split_rule"].startswith("nanoGPT's")
    listing = cli("corpora", "--data-dir", tmp_path / "data", check_code=0).stdout
    assert "shakespeare-nanogpt" in listing and "nanoGPT's exact split" in listing


def test_a_modified_copy_fails_its_checksum_unless_no_verify(input_txt, tmp_path):
    data = bytearray(input_txt.read_bytes())
    data[0:5] = b"Final"  # "First Citizen" → "Final Citizen": same size, another sha256
    copy = tmp_path / "input.txt"
    copy.write_bytes(bytes(data))
    actual = hashlib.sha256(data).hexdigest()
    result = cli("prepare", "shakespeare", "--source", copy, "--data-dir", tmp_path / "data")
    assert_one_line_error(
        result, "differs from the published corpus", f"expected {SHA256}, got {actual}", "--no-verify"
    )
    assert not (tmp_path / "data" / "shakespeare").exists()
    cli(
        "prepare",
        "shakespeare",
        "--source",
        copy,
        "--data-dir",
        tmp_path / "data",
        "--no-verify",
        "--quiet",
        check_code=0,
    )
    assert not load_corpus("shakespeare", tmp_path / "data").verified


def test_shakespeare_downloads_from_a_mirror_and_is_verified(input_txt, corpus_server, tmp_path):
    corpus_server.files["tiny/input.txt"] = input_txt.read_bytes()
    cli(
        "prepare",
        "shakespeare",
        "--url",
        corpus_server.url("tiny/input.txt"),
        "--data-dir",
        tmp_path / "data",
        "--quiet",
        check_code=0,
    )
    assert (tmp_path / "data" / "downloads" / "tinyshakespeare-input.txt").stat().st_size == 1_115_394
    assert load_corpus("shakespeare", tmp_path / "data").tokens("valid") == 55_770


def test_train_on_shakespeare_for_a_few_steps(input_txt, tmp_path):
    cli("prepare", "shakespeare", "--source", input_txt, "--data-dir", tmp_path / "data", "--quiet", check_code=0)
    result = cli(
        "train",
        "--corpus",
        "shakespeare",
        "--data-dir",
        tmp_path / "data",
        "--hidden",
        "8",
        "--epochs",
        "1",
        "--max-tokens",
        "3200",
        "--batch-size",
        "8",
        "--bptt",
        "20",
        "--eval-fraction",
        "0.02",
        "--run-dir",
        tmp_path / "run",
        check_code=0,
    )
    assert "on shakespeare" in result.stderr and (tmp_path / "run" / "best.pt").exists()
