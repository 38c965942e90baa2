"""Word level (issue 22): the `word` tokenizer and `ptb-word` from Mikolov's word files, reproducing
the standard counts on the real PTB, and a word model trained, evaluated (perplexity per word),
sampled and scored, dynamically too."""

from __future__ import annotations

import math

import pytest

import charlm
from charlm.corpora import load_corpus
from charlm.corpora.tokenizer_kinds import tokenizer_from_state
from charlm.corpora.word_tokenizers import EOS, WordTokenizer
from charlm.errors import OutOfVocabulary
from helpers import assert_one_line_error, cli


def test_the_word_tokenizer_round_trips_and_names_unknown_words():
    tokenizer = WordTokenizer.build("the cat sat\nthe dog <unk>\n")
    assert tokenizer.vocab == sorted(["<eos>", "<unk>", "cat", "dog", "sat", "the"]) and tokenizer.unk == "<unk>"
    ids = tokenizer.encode("the dog sat\ncat")
    assert [tokenizer.vocab[i] for i in ids] == ["the", "dog", "sat", EOS, "cat"]
    assert tokenizer.decode(ids) == "the dog sat\ncat"
    assert tokenizer.unknown_words("the bird\n") == ["bird"]
    strict = WordTokenizer(["<eos>", "a", "b"])
    with pytest.raises(OutOfVocabulary) as raised:
        strict.encode("a c d\n")
    assert raised.value.symbols == ["c", "d"]
    rebuilt = tokenizer_from_state(tokenizer.to_state())
    assert isinstance(rebuilt, WordTokenizer) and rebuilt.vocab == tokenizer.vocab and rebuilt.unk == "<unk>"


@pytest.fixture(scope="module")
def word_run(tmp_path_factory):
    """ptb-word prepared from ../shared/corpora/ptb, and a small LSTM trained on 1% of it."""
    from conftest import SHARED_CORPORA_DIR

    if not SHARED_CORPORA_DIR.is_dir():
        pytest.skip("the reference corpora are absent")
    root = tmp_path_factory.mktemp("ptb-word")
    data = root / "data"
    result = cli("prepare", "ptb-word", "--data-dir", str(data), "--source", str(SHARED_CORPORA_DIR / "ptb"))
    assert result.returncode == 0, result.stderr
    run = root / "run"
    charlm.train(
        charlm.TrainConfig(
            corpus="ptb-word",
            cell="lstm",
            hidden_size=24,
            embed_size=16,
            batch_size=8,
            bptt=20,
            epochs=1,
            train_fraction=0.01,
            eval_batch_size=16,
            data_dir=str(data),
            run_dir=str(run),
        )
    )
    return data, run


def test_ptb_word_reproduces_the_standard_counts(word_run):
    data, _ = word_run
    corpus = load_corpus("ptb-word", data)
    assert corpus.unit == "word" and corpus.vocab_size == 10_000
    assert {split: corpus.tokens(split) for split in ("train", "valid", "test")} == {
        "train": 929_589,
        "valid": 73_760,
        "test": 82_430,
    }
    assert "<unk>" in corpus.tokenizer.vocab and "<eos>" in corpus.tokenizer.vocab


@pytest.mark.slow  # about 14 s (and the fixture again on another worker); the standard counts stay in the default run
def test_a_word_model_evaluates_per_word_samples_and_scores(word_run):
    data, run = word_run
    result = cli("eval", str(run), "--split", "valid", "--data-dir", str(data))
    assert result.returncode == 0, result.stderr
    assert "73,759 word tokens scored" in result.stdout and "(per word token)" in result.stdout
    assert "nll per token" in result.stdout and "(per word)" in result.stdout
    model = charlm.load(run)
    score = model.evaluate("valid", data_dir=data, record=False)
    corpus = load_corpus("ptb-word", data)
    assert score.perplexity == pytest.approx(math.exp(score.loss))
    assert score.characters == pytest.approx(corpus.characters("valid") * (score.tokens / corpus.tokens("valid")))
    text = model.sample(length=12, seed=1)
    assert len(text.split()) >= 5 and all(word in corpus.tokenizer.vocab for word in text.split())
    known = "the company said it would buy the shares\n"
    assert model.score(known).tokens == len(known.split())  # the words and the <eos>, less the first
    with pytest.raises(OutOfVocabulary, match="'zyzzyva'"):
        model.score("the zyzzyva said\n")
    skipped = model.score("the zyzzyva said it\n", unknown="skip")
    assert skipped.skipped == len("zyzzyva ")  # the word and the space before it
    adapted = model.score(known * 3, dynamic="sgd")
    assert math.isfinite(adapted.bpc)


def test_a_word_model_refuses_an_unknown_prime_word_in_one_line(word_run):
    _, run = word_run
    assert_one_line_error(
        cli("sample", str(run), "--prime", "the zyzzyva", "--length", "3"),
        "the prime has characters outside the model's vocabulary: 'zyzzyva'",
    )
