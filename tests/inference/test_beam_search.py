"""Beam search finds what exhaustive search finds; stop strings, log probabilities, a prime from stdin."""

from __future__ import annotations

import io
import itertools
import math
import re
import sys

import pytest
import torch

from charlm.api import Model
from charlm.checkpoint import Checkpoint
from charlm.config import TrainConfig
from charlm.corpora.tokenizer import CharTokenizer
from charlm.errors import CharlmError
from charlm.inference.beam import beam_search, normalised_score
from charlm.inference.generation import stop_end, until_stop
from charlm.model import LanguageModel, ModelConfig
from helpers import assert_one_line_error, cli

VOCABULARY = list("\n ab")  # a line break (the default prime), a space and two letters


def tiny_network(cell: str = "gru", vocab_size: int = 3, seed: int = 0) -> LanguageModel:
    """Random weights, the softmax layer scaled up so that the symbols' probabilities differ widely."""
    torch.manual_seed(seed)
    network = LanguageModel(ModelConfig(cell, vocab_size=vocab_size, hidden_size=8))
    with torch.no_grad():
        network.head.weight.mul_(4)
    return network.eval()


def stepped_log_probs(network, prime_ids, ids) -> list[float]:
    """Each symbol's log probability, found by stepping the model one symbol at a time from zeros."""
    state = network.initial_state(1)
    with torch.no_grad():
        for token in prime_ids:
            logits, state = network.step(torch.tensor([token]), state)
        found = []
        for token in ids:
            found.append(torch.log_softmax(logits[0].double(), dim=-1)[token].item())
            logits, state = network.step(torch.tensor([token]), state)
    return found


def exhaustive_best(network, prime_ids, length, alpha, vocab_size, banned=(), ended=None):
    """The best continuation by ``log P / len ** alpha`` over every sequence of ``length`` symbols,
    each cut after the first prefix that ``ended`` says completes a stop string (all of them scored
    in one batched pass over the window)."""
    sequences = list(itertools.product([s for s in range(vocab_size) if s not in banned], repeat=length))
    tokens = torch.tensor([list(prime_ids) + list(sequence) for sequence in sequences])
    with torch.no_grad():
        logits, _ = network(tokens[:, :-1], network.initial_state(len(sequences)))
    log_probs = torch.log_softmax(logits.double(), dim=-1)[:, len(prime_ids) - 1 :]
    per_symbol = log_probs.gather(2, tokens[:, len(prime_ids) :, None]).squeeze(2).tolist()
    scored = {}
    for sequence, values in zip(sequences, per_symbol):
        cut = next((n for n in range(1, length + 1) if ended is not None and ended(list(sequence[:n]))), length)
        scored[sequence[:cut]] = normalised_score(sum(values[:cut]), cut, alpha)
    ranked = sorted(((score, ids) for ids, score in scored.items()), reverse=True)
    assert ranked[0][0] - ranked[1][0] > 1e-4  # no near tie: the best is well defined
    return list(ranked[0][1])


@pytest.mark.parametrize("cell", ["gru", "lstm"])
def test_a_beam_as_wide_as_every_sequence_is_exhaustive_search(cell):
    network = tiny_network(cell, vocab_size=3)
    best = beam_search(network, [0, 1], length=4, width=3**4)
    assert best.ids == exhaustive_best(network, [0, 1], 4, 1.0, 3)
    assert best.log_probs == pytest.approx(
        stepped_log_probs(network, [0, 1], best.ids), abs=1e-5
    )  # each beam's own state


def test_a_beam_of_one_is_greedy_decoding():
    network = tiny_network("lstm", vocab_size=5, seed=1)
    state, greedy = network.initial_state(1), []
    with torch.no_grad():
        logits, state = network(torch.tensor([[2, 4, 1]]), state)
        logits = logits[:, -1]
        for _ in range(12):
            greedy.append(int(logits[0].argmax()))
            logits, state = network.step(torch.tensor(greedy[-1:]), state)
    assert beam_search(network, [2, 4, 1], length=12, width=1).ids == greedy


@pytest.mark.parametrize("alpha", [0.0, 0.5, 1.0])
def test_stopped_beams_compete_by_length_normalised_score(alpha):
    network = tiny_network("gru", vocab_size=3, seed=2)
    ended = lambda ids: ids[-2:] == [2, 2] or ids[-1:] == [0]  # noqa: E731  two "stop strings"
    expected = exhaustive_best(network, [1], 4, alpha, 3, ended=ended)
    best = beam_search(network, [1], length=4, width=3**4, length_penalty=alpha, finished=ended)
    assert best.ids == expected


def test_the_unknown_entry_is_never_part_of_a_beam():
    network = tiny_network("gru", vocab_size=3, seed=3)
    expected = exhaustive_best(network, [0], 4, 1.0, 3, banned=(2,))
    assert beam_search(network, [0], length=4, width=2**4, banned_ids=[2]).ids == expected


def test_beam_search_edge_cases():
    network = tiny_network()
    assert beam_search(network, [0], length=0, width=3).ids == []
    with pytest.raises(CharlmError, match="the prime is empty"):
        beam_search(network, [], length=3, width=2)
    with pytest.raises(CharlmError, match="every one is the unknown entry"):
        beam_search(network, [0], length=3, width=2, banned_ids=[0, 1, 2])


# --- stop strings ----------------------------------------------------------------------------------


def test_stop_strings_cut_the_text_after_the_first_one_even_across_pieces():
    assert stop_end("abcXYde", ["XY"]) == 5
    assert stop_end("abcXYde", ["de", "cX"]) == 4  # the one that ends first
    assert stop_end("abc", ["XY"]) is None
    asked = []

    def pieces():
        for piece in ["ab", "cX", "Yd", "e"]:
            asked.append(piece)
            yield piece

    assert list(until_stop(pieces(), ["XY"])) == ["ab", "cX", "Y"]
    assert asked == ["ab", "cX", "Yd"]  # nothing asked for after the stop string
    assert list(until_stop(iter(["ab", "c"]), [])) == ["ab", "c"]


@pytest.fixture(scope="module")
def model() -> Model:
    network = tiny_network("gru", vocab_size=len(VOCABULARY), seed=4)
    return Model(
        Checkpoint(
            network.config,
            TrainConfig(corpus="tiny"),
            CharTokenizer(VOCABULARY).to_state(),
            network.state_dict(),
            kind="export",
        )
    )


@pytest.fixture(scope="module")
def checkpoint_file(model, tmp_path_factory):
    return model.checkpoint.save(tmp_path_factory.mktemp("beam") / "model.pt")


def test_a_sample_ends_with_the_first_stop_string_it_generates(model):
    continuation = model.sample("ab", 40, seed=5)[2:]
    first, second = continuation[6:8], continuation[12:15]
    end = min(continuation.find(first) + 2, continuation.find(second) + 3)
    generation = model.stream("ab", 40, seed=5, stop=[second, first])
    assert "".join(generation) == continuation[:end]
    assert len(generation.ids) == end  # drawing stopped there: one symbol per character
    assert model.sample("ab", 40, seed=5, stop="never") == "ab" + continuation
    unstopped = model.sample("b\n", 40, seed=5)
    assert "b\n" not in unstopped[2:]
    assert model.sample("b\n", 40, seed=5, stop="b\n") == unstopped  # a stop string in the prime does not count


def test_beam_search_from_the_api_is_exhaustive_and_stops(model):
    prime = model.tokenizer.encode("ab")
    expected = exhaustive_best(model.network, prime, 4, 1.0, len(VOCABULARY))
    generation = model.stream("ab", 4, beam=4**4)
    assert "".join(generation) == model.tokenizer.decode(expected)
    assert generation.log_prob == pytest.approx(sum(stepped_log_probs(model.network, prime, expected)), abs=1e-5)
    ended = lambda ids: "\n" in model.tokenizer.decode(ids)  # noqa: E731
    for alpha, stopped in [(0.0, True), (1.0, False)]:  # a short stopped continuation wins only on total probability
        expected = exhaustive_best(model.network, prime, 4, alpha, len(VOCABULARY), ended=ended)
        text = model.sample("ab", 4, beam=4**4, length_penalty=alpha, stop="\n")
        assert text == "ab" + model.tokenizer.decode(expected) and text.endswith("\n") == stopped


def test_the_log_probability_is_the_models_own_given_the_prime(model):
    generation = model.stream("ab", 30, temperature=0.7, top_k=3, seed=8)
    text = "".join(generation)
    assert generation.ids == model.tokenizer.encode(text)
    stepped = stepped_log_probs(model.network, model.tokenizer.encode("ab"), generation.ids)
    assert generation.log_prob == pytest.approx(sum(stepped), abs=1e-4)
    assert generation.log2_prob == pytest.approx(sum(stepped) / math.log(2), abs=1e-4)
    assert generation.bits_per_symbol == pytest.approx(-sum(stepped) / math.log(2) / 30, abs=1e-5)
    scored = model.score("ab" + text).nats - model.score("ab").nats  # the scoring API, the prime's own term removed
    assert generation.log_prob == pytest.approx(-scored, abs=1e-4)


@pytest.mark.parametrize(
    "settings, message",
    [
        (dict(beam=2, temperature=0.5), "temperature does not apply to beam search"),
        (dict(beam=2, top_k=2), "top_k does not apply to beam search"),
        (dict(beam=2, top_p=0.9), "top_p does not apply to beam search"),
        (dict(beam=2, seed=1), "seed does not apply to beam search, which draws nothing at random"),
        (dict(length_penalty=0.5), "length_penalty applies only to beam search"),
        (dict(beam=-1), "beam must be zero or positive"),
        (dict(beam=2, length_penalty=-1.0), "length_penalty must be zero or positive"),
        (dict(stop=["a", ""]), "stop must be a non-empty string, not ''"),
    ],
)
def test_settings_that_make_no_sense_are_refused(model, settings, message):
    with pytest.raises(CharlmError, match=re.escape(message)):
        model.stream("ab", 5, **settings)


def test_a_beam_the_machine_cannot_hold_is_refused_before_the_search(model, monkeypatch):
    """The live beams are counted (at most every continuation: a width beyond them costs nothing),
    and a search that does not fit is refused when it is asked for (``stream`` searches later)."""
    from charlm.runtime import memory
    from charlm.runtime.memory import live_beams

    monkeypatch.setattr(memory, "available_memory", lambda device: 2**30)  # 1 GiB free, whatever the machine
    assert (live_beams(2**63, 4, 3), live_beams(10, 4, 3), live_beams(2**63, 1, 2**62)) == (64, 10, 1)
    with pytest.raises(
        CharlmError,
        match=r"^beam search of width 9,223,372,036,854,775,807 over 100 symbols needs "
        r"about .* \(9,223,372,036,854,775,807 live beams, .* but cpu has 1.0 GiB free: use a smaller "
        r"--beam or --length$",
    ):
        model.stream("ab", 100, beam=2**63 - 1)
    assert len(model.sample("ab", 3, beam=2**63 - 1)) == 5  # 64 continuations: exhaustive, and cheap


# --- the command line --------------------------------------------------------------------------------

LOG_PROB = re.compile(r"log probability (\S+) nats = (\S+) bits over (\d+) symbols \((\S+) bits per symbol\)")


def test_cli_beam_search_prints_the_best_continuation_and_its_log_probability(model, checkpoint_file):
    prime = model.tokenizer.encode("ab")
    expected = exhaustive_best(model.network, prime, 4, 1.0, len(VOCABULARY))
    result = cli(
        "sample", checkpoint_file, "--prime", "ab", "--length", "4", "--beam", "256", "--logprob", check_code=0
    )
    assert result.stdout == "ab" + model.tokenizer.decode(expected) + "\n"
    assert "seed" not in result.stderr  # nothing is drawn, so no seed is said
    nats, bits, symbols, per_symbol = LOG_PROB.search(result.stderr).groups()
    log_prob = sum(stepped_log_probs(model.network, prime, expected))
    assert float(nats) == pytest.approx(log_prob, abs=1e-4)
    assert float(bits) == pytest.approx(log_prob / math.log(2), abs=1e-4)
    assert int(symbols) == 4 and float(per_symbol) == pytest.approx(-log_prob / math.log(2) / 4, abs=1e-4)


def test_cli_stop_strings_and_log_probability_per_sample(model, checkpoint_file):
    continuations = [model.sample("ab", 40, seed=seed)[2:] for seed in (5, 6)]
    stop = "aab"
    expected = [text[: text.find(stop) + 3] if stop in text else text for text in continuations]
    assert expected[0] != continuations[0] and expected[1] == continuations[1]  # stopped in the first only
    result = cli(
        "sample",
        checkpoint_file,
        "--prime",
        "ab",
        "--length",
        "40",
        "--seed",
        "5",
        "--num-samples",
        "2",
        "--stop",
        stop,
        "--stop",
        "never",
        "--logprob",
        check_code=0,
    )
    assert result.stdout == "ab" + expected[0] + "\n\nab" + expected[1] + "\n"
    lines = [line for line in result.stderr.splitlines() if "log probability" in line]
    assert [line.split(":")[0] for line in lines] == ["sample 1", "sample 2"]
    for line, text in zip(lines, expected):
        nats = float(LOG_PROB.search(line).group(1))
        assert nats == pytest.approx(model.score("ab").nats - model.score("ab" + text).nats, abs=1e-4)


def test_cli_prime_file_dash_reads_standard_input(checkpoint_file, monkeypatch):
    given = cli("sample", checkpoint_file, "--prime", "b a", "--length", "10", "--seed", "2", check_code=0).stdout
    piped = cli(
        "sample", checkpoint_file, "--prime-file", "-", "--length", "10", "--seed", "2", stdin="b a", check_code=0
    )
    assert piped.stdout == given and given.startswith("b a")
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"a\xffb"), encoding="utf-8"))
    assert_one_line_error(
        cli("sample", checkpoint_file, "--prime-file", "-"), "the prime on standard input is not UTF-8 text (byte 1)"
    )
    assert_one_line_error(cli("sample", checkpoint_file, "--prime-file", "-", stdin=""), "the prime is empty")


@pytest.mark.parametrize(
    "args, message",
    [
        (["--beam", "2", "--temperature", "0.5"], "--temperature does not apply to beam search"),
        (["--beam", "2", "--top-k", "2"], "--top-k does not apply to beam search"),
        (["--beam", "2", "--seed", "3"], "--seed does not apply to beam search"),
        (["--beam", "2", "--num-samples", "2"], "--num-samples must be 1 with beam search"),
        (["--length-penalty", "0.7"], "--length-penalty applies only to beam search"),
        (["--beam", "-1"], "--beam must be zero or positive"),
        (["--stop", ""], "--stop must be a non-empty string"),
    ],
)
def test_cli_refuses_settings_that_make_no_sense(checkpoint_file, args, message):
    result = cli("sample", checkpoint_file, "--length", "5", *args)
    assert_one_line_error(result, message)
    assert result.stdout == ""  # refused before anything is written
