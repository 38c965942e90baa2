"""Static evaluation is exact over the whole split; sampling is reproducible and filtered right."""

from __future__ import annotations

import math
import shutil

import numpy as np
import pytest
import torch

from charlm.corpora.streams import TokenStreams
from charlm.config_inference import SampleConfig
from charlm.inference.scoring import score_tokens
from charlm.model import LanguageModel, ModelConfig
from charlm.inference.sampling import filter_logits, generate
from helpers import assert_one_line_error, assert_replays_the_step, cli, records

# `trained_run` (conftest.py): a small LRU trained for two epochs on the `tiny` corpus.


def test_every_symbol_after_the_first_is_scored_once():
    tokens = np.arange(103) % 7
    for batch in (1, 4, 10):
        streams = TokenStreams(tokens, batch, bptt=6, cover_all=True)
        assert streams.tokens_scored == len(tokens) - 1


def test_streamed_score_equals_one_pass_over_the_split():
    torch.manual_seed(0)
    model = LanguageModel(ModelConfig("gru", vocab_size=9, hidden_size=12)).double()
    tokens = np.random.default_rng(0).integers(0, 9, size=301)
    logits, _ = model(torch.tensor(tokens[None, :-1]), model.initial_state(1))
    log_probs = torch.log_softmax(logits[0], dim=-1)
    expected = -log_probs[torch.arange(300), torch.tensor(tokens[1:])].sum().item()
    score = score_tokens(model, tokens, batch_size=1, bptt=7, device="cpu")
    assert score.tokens == 300
    assert score.nats == pytest.approx(expected, rel=1e-9)
    assert score.bpc == pytest.approx(expected / 300 / math.log(2), rel=1e-9)
    assert score.perplexity == pytest.approx(math.exp(expected / 300), rel=1e-7)


def test_eval_command_reports_bpc_and_records_it(trained_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(trained_run, run)  # the eval record is appended to the run's metrics.jsonl
    result = cli("eval", run, "--split", "valid", "--batch-size", "1", check_code=0)
    bpc = float(next(line.split()[1] for line in result.stdout.splitlines() if line.startswith("bpc")))
    assert 0.5 < bpc < 6
    assert "perplexity" in result.stdout
    assert records(run, "eval")
    assert not records(trained_run, "eval")


def test_sample_same_seed_same_text(trained_run):
    run = trained_run
    first = cli("sample", run, "--prime", "The ", "--length", "80", "--seed", "3", check_code=0).stdout
    second = cli("sample", run, "--prime", "The ", "--length", "80", "--seed", "3", check_code=0).stdout
    other = cli("sample", run, "--prime", "The ", "--length", "80", "--seed", "4", check_code=0).stdout
    assert first == second and first.startswith("The ")
    assert first != other
    assert len(first) == len("The ") + 80 + 1


def test_sample_without_a_seed_says_the_seed_it_drew(trained_run):
    import re

    drawn = cli("sample", trained_run, "--length", "60", "--prime", "The ", "--num-samples", "2", check_code=0)
    seed = re.search(r"seed (\d+) \(pass --seed \1 to draw the same text again\)", drawn.stderr)
    assert seed, drawn.stderr
    again = cli(
        "sample",
        trained_run,
        "--length",
        "60",
        "--prime",
        "The ",
        "--num-samples",
        "2",
        "--seed",
        seed[1],
        check_code=0,
    )
    assert again.stdout == drawn.stdout and "seed" not in again.stderr


def test_sample_num_samples_prime_file_and_filters(trained_run, tmp_path):
    run = trained_run
    prime = tmp_path / "prime.txt"
    prime.write_text("def ", encoding="utf-8")
    result = cli(
        "sample",
        run,
        "--prime-file",
        prime,
        "--length",
        "30",
        "--num-samples",
        "2",
        "--top-k",
        "5",
        "--top-p",
        "0.9",
        "--temperature",
        "0.7",
        "--seed",
        "1",
        check_code=0,
    )
    assert result.stdout.startswith("def ")
    assert "\n\ndef " in result.stdout  # the second sample starts after a blank line


def test_prime_outside_vocabulary_names_the_characters(trained_run):
    result = cli("sample", trained_run, "--prime", "naïve ☃")
    assert_one_line_error(result, "outside the model's vocabulary", "'☃'")


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["--temperature", "-1"], "--temperature must be zero or positive, not -1.0"),
        (["--top-p", "1.5"], "--top-p"),
        (["--prime", "a", "--prime-file", "x"], "not both"),
    ],
)
def test_bad_sampling_options(trained_run, args, fragment):
    result = cli("sample", trained_run, *args)
    assert_one_line_error(result, fragment)
    assert result.stdout == ""  # nothing is written before the settings are checked


def test_not_a_checkpoint_and_wrong_version(tmp_path, trained_run):
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"this is not a checkpoint")
    assert_one_line_error(cli("eval", junk), "not a readable charlm checkpoint")
    assert_one_line_error(cli("sample", tmp_path / "missing.pt"), "no such checkpoint")
    payload = torch.load(trained_run / "best.pt", weights_only=True)
    payload["format_version"] = 99
    other = tmp_path / "other.pt"
    torch.save(payload, other)
    assert_one_line_error(cli("eval", other), "checkpoint format 99")
    foreign = tmp_path / "foreign.pt"
    torch.save({"weights": torch.zeros(2)}, foreign)
    assert_one_line_error(cli("sample", foreign), "is not a charlm checkpoint")


def test_top_k_one_is_greedy():
    torch.manual_seed(0)
    model = LanguageModel(ModelConfig("lstm", vocab_size=6, hidden_size=8)).eval()
    drawn = list(generate(model, [1, 2], SampleConfig(length=10, top_k=1, seed=5)))
    state = model.initial_state(1)
    logits, state = model(torch.tensor([[1, 2]]), state)
    greedy = []
    for _ in range(10):
        token = int(logits[0, -1].argmax())
        greedy.append(token)
        logits, state = model(torch.tensor([[token]]), state)
    assert drawn == greedy


def test_top_p_keeps_the_smallest_set_with_enough_mass():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    kept = torch.isfinite(filter_logits(logits, top_p=0.75))
    assert kept.tolist() == [True, True, False, False]
    kept = torch.isfinite(filter_logits(logits, top_p=0.1))
    assert kept.tolist() == [True, False, False, False]
    kept = torch.isfinite(filter_logits(logits, top_k=3))
    assert kept.tolist() == [True, True, True, False]
    for tiny in (1e-320, 5e-324):  # positive, so allowed, but 0 once compared in float32: the top symbol still stays
        assert torch.isfinite(filter_logits(logits, top_p=tiny)).tolist() == [True, False, False, False]


def test_unknown_entry_is_never_drawn():
    torch.manual_seed(0)
    model = LanguageModel(ModelConfig("lstm", vocab_size=4, hidden_size=8)).eval()
    with torch.no_grad():
        model.head.bias[3] = 50.0  # the model all but insists on id 3
    drawn = list(generate(model, [0], SampleConfig(length=50, seed=0), banned_ids=[3]))
    assert 3 not in drawn
    assert 3 in list(generate(model, [0], SampleConfig(length=5, seed=0)))


@pytest.mark.parametrize("cell, layers", [("lstm", 2), ("lru", 1), ("grid-lstm", 2), ("scrn", 1)])
def test_graphed_step_replays_what_the_step_computes(cell, layers):
    """The CUDA-graph path's buffers (static inputs copied in, static outputs handed back and fed in
    again), with a stand-in that replays by calling: the same logits and state as ``model.step``."""
    from charlm.runtime.cuda_graphs import GraphedStep, ReplayByCalling

    torch.manual_seed(0)
    model = LanguageModel(ModelConfig(cell, vocab_size=13, hidden_size=8, layers=layers)).eval()
    tokens = torch.randint(13, (2, 7))
    with torch.inference_mode():
        _, state = model(tokens[:, :3], model.initial_state(2))
        assert_replays_the_step(model.step, GraphedStep(model, state, graph=ReplayByCalling()), tokens, state, start=3)


def test_sampling_through_the_graph_path_draws_the_same_text(monkeypatch):
    import charlm.inference.sampling
    from charlm.runtime.cuda_graphs import GraphedStep, ReplayByCalling

    torch.manual_seed(0)
    model = LanguageModel(ModelConfig("gru", vocab_size=13, hidden_size=8)).eval()
    config = SampleConfig(length=40, seed=3)
    eager = list(generate(model, [1, 2, 3], config))
    monkeypatch.setattr(
        charlm.inference.sampling, "graphed_step", lambda m, s, enabled=True: GraphedStep(m, s, graph=ReplayByCalling())
    )
    assert list(generate(model, [1, 2, 3], config)) == eager


def test_the_step_is_made_once_per_model_and_weights_and_only_when_a_symbol_follows(monkeypatch):
    """No step (on a GPU: no capture) for a sample of 0 or 1 symbols; then one, kept for every later
    sample until the weights change; the text drawn is the same either way."""
    import charlm.inference.sampling

    torch.manual_seed(0)
    model = LanguageModel(ModelConfig("gru", vocab_size=13, hidden_size=8)).eval()
    made = []

    def counting(sampling_model, state, enabled=True):
        made.append(state[0][0].shape)
        return sampling_model.step

    monkeypatch.setattr(charlm.inference.sampling, "graphed_step", counting)
    for length, made_so_far in ((0, 0), (1, 0), (2, 1), (30, 1), (30, 1)):
        assert len(list(generate(model, [1, 2, 3], SampleConfig(length=length, seed=3)))) == length
        assert len(made) == made_so_far, length
    before = list(generate(model, [1, 2, 3], SampleConfig(length=20, seed=3)))
    with torch.no_grad():
        model.head.weight.mul_(4.0)  # new weights: a new step
    after = list(generate(model, [1, 2, 3], SampleConfig(length=20, seed=3)))
    assert len(made) == 2
    fresh = LanguageModel(ModelConfig("gru", vocab_size=13, hidden_size=8)).eval()
    fresh.load_state_dict(model.state_dict())
    assert list(generate(fresh, [1, 2, 3], SampleConfig(length=20, seed=3))) == after != before


def test_graphed_step_is_only_for_cuda_and_falls_back_with_a_warning(monkeypatch):
    import charlm.runtime.cuda_graphs

    model = LanguageModel(ModelConfig("gru", vocab_size=13, hidden_size=8))
    state = model.initial_state(1)
    assert charlm.runtime.cuda_graphs.graphed_step(model, state) == model.step  # the CPU: no graph

    class FakeCudaTensor:
        device = torch.device("cuda")

    def capture_fails(model, state, graph=None):
        raise RuntimeError("operation not permitted when stream is capturing")

    class Recorder:
        messages = []

        def warning(self, message):
            self.messages.append(message)

    monkeypatch.setattr(charlm.runtime.cuda_graphs, "GraphedStep", capture_fails)
    monkeypatch.setattr(charlm.runtime.cuda_graphs, "get_logger", Recorder)
    assert charlm.runtime.cuda_graphs.graphed_step(model, [(FakeCudaTensor(),)]) == model.step
    assert Recorder.messages == [
        "warning: sampling without a CUDA graph (RuntimeError: operation not permitted when stream is capturing)"
    ]
