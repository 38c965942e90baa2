"""Dynamic evaluation: test-then-train scoring is exact, adapts the model, works for every cell
and through `charlm eval`."""

from __future__ import annotations

import dataclasses
import math
import shutil
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from charlm.api import load
from charlm.cells import CELLS
from charlm.checkpoint import Checkpoint
from charlm.config import TrainConfig
from charlm.config_inference import DynamicOptions
from charlm.inference.dynamic import collect_gradient_statistics, dynamic_score, make_update
from charlm.inference.dynamic_protocol import SEARCH_LRS, NoProgress, evaluate_dynamic, grid_search
from charlm.inference.scoring import score_tokens, window_nats
from charlm.model import LanguageModel, ModelConfig, detach_state
from charlm.api import train
from helpers import assert_one_line_error, cli, records

VOCAB = 11


@pytest.fixture(scope="module")
def trained_run(tiny_corpus, tmp_path_factory):
    """An LSTM trained for three epochs on 36k characters of `tiny` (valid and test: 2,000 characters
    each). Not the session's `trained_run`: this one is trained further (dynamic evaluation must
    gain clearly on it), is several times faster to evaluate, and these tests append to its metrics."""
    run = tmp_path_factory.mktemp("dynamic") / "run"
    train(
        TrainConfig(
            corpus="tiny",
            cell="lstm",
            hidden_size=48,
            batch_size=16,
            bptt=25,
            epochs=3,
            lr=1e-2,
            eval_batch_size=4,
            data_dir=str(tiny_corpus),
            run_dir=str(run),
        )
    )
    return run


def random_model(cell="gru", hidden=12, dtype=torch.float32, seed=0):
    torch.manual_seed(seed)
    return LanguageModel(ModelConfig(cell, vocab_size=VOCAB, hidden_size=hidden)).to(dtype)


def random_tokens(length, seed=0):
    return np.random.default_rng(seed).integers(0, VOCAB, size=length)


def rms_statistics(model, seed=1):
    rms, _ = collect_gradient_statistics(model, random_tokens(400, seed), segment=10, batch_size=4)
    return rms


def weights(model):
    return [parameter.detach().clone() for parameter in model.parameters()]


def per_segment_nats(model, tokens, update, segment):
    nats = []
    dynamic_score(model, tokens, update, segment=segment, progress=lambda count, value: nats.append(value))
    return nats


@pytest.mark.parametrize("method", ["sgd", "rms"])
@pytest.mark.parametrize("batch_size", [1, 3])
def test_learning_rate_zero_reproduces_static_evaluation_exactly(method, batch_size):
    model = random_model()
    tokens = random_tokens(301)
    before = weights(model)
    static = score_tokens(model, tokens, batch_size=batch_size, bptt=7, device="cpu")
    options = DynamicOptions(method=method, lr=0.0, decay=0.1, segment=7, batch_size=batch_size)
    rms = rms_statistics(model) if method == "rms" else None
    dynamic = dynamic_score(model, tokens, make_update(model, options, rms), segment=7, batch_size=batch_size)
    assert dynamic.nats == static.nats
    assert dynamic.tokens == static.tokens == 300
    assert all(torch.equal(a, b) for a, b in zip(before, weights(model)))


def test_each_segment_is_scored_by_the_weights_updated_on_the_previous_segments_only():
    """A manual loop: score segment k under no_grad, then take the SGD step on it."""
    model = random_model(dtype=torch.float64)
    reference = random_model(dtype=torch.float64)
    tokens = random_tokens(121)
    segment, lr = 10, 0.5
    nats = per_segment_nats(model, tokens, make_update(model, DynamicOptions("sgd", lr=lr)), segment)

    inputs, targets = torch.tensor(tokens[None, :-1]), torch.tensor(tokens[None, 1:])
    state = reference.initial_state(1)
    expected = []
    for start in range(0, 120, segment):
        window_inputs, window_targets = inputs[:, start : start + segment], targets[:, start : start + segment]
        with torch.no_grad():
            expected.append(window_nats(reference(window_inputs, state)[0], window_targets).item())
        reference.zero_grad()
        logits, next_state = reference(window_inputs, state)
        (window_nats(logits, window_targets) / window_targets.numel()).backward()
        with torch.no_grad():
            for parameter in reference.parameters():
                parameter -= lr * parameter.grad
        state = detach_state(next_state)
    assert nats == pytest.approx(expected, rel=1e-12)
    assert nats[-1] != pytest.approx(nats[0], rel=1e-3)


@pytest.mark.parametrize("method", ["sgd", "rms"])
def test_a_segments_score_does_not_depend_on_its_own_update(method):
    """Wreck the update after segment k: scores up to and including k stay exactly the same."""
    tokens, k = random_tokens(201), 4
    scores = {}
    for wrecked in (False, True):
        model = random_model()
        options = DynamicOptions(method, lr=0.05 if method == "sgd" else 1e-3, segment=10)
        update = make_update(model, options, rms_statistics(model) if method == "rms" else None)
        calls = []

        def perturbed_update():
            update()
            if wrecked and len(calls) == k:
                with torch.no_grad():
                    for parameter in model.parameters():
                        parameter.add_(torch.randn_like(parameter))
            calls.append(1)

        scores[wrecked] = per_segment_nats(model, tokens, perturbed_update, segment=10)
    assert scores[True][: k + 1] == scores[False][: k + 1]
    assert scores[True][k + 1] != scores[False][k + 1]


def test_gradient_statistics_are_the_root_mean_square_of_the_batch_gradients():
    """√MS = √((1/K) Σ_k (∇θ L_k)²), L_k the mean loss of batch k, state carried across batches."""
    model = random_model(dtype=torch.float64)
    tokens = random_tokens(81)
    rms, batches = collect_gradient_statistics(model, tokens, segment=10, batch_size=2, max_batches=3)
    assert batches == 3

    streams = torch.tensor(tokens[:80].reshape(2, 40)), torch.tensor(tokens[1:81].reshape(2, 40))
    state, squares = model.initial_state(2), [torch.zeros_like(p) for p in model.parameters()]
    for start in (0, 10, 20):
        inputs, targets = (stream[:, start : start + 10] for stream in streams)
        model.zero_grad()
        logits, state = model(inputs, state)
        state = detach_state(state)
        torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1)).backward()  # in float64
        squares = [square + p.grad**2 for square, p in zip(squares, model.parameters())]
    for root, square in zip(rms, squares):
        torch.testing.assert_close(root, torch.sqrt(square / 3), rtol=1e-12, atol=0)


@pytest.mark.parametrize("decay", [0.0, 0.01, 0.6])
def test_rms_update_follows_krause_et_al(decay):
    """θ ← θ − η g/(√MS + ε) + λ · min(√MS / mean_tensors(mean(√MS)), 1/λ) ⊙ (θ₀ − θ)."""
    model = random_model(dtype=torch.float64)
    generator = torch.Generator().manual_seed(3)
    rms = [torch.rand(p.shape, generator=generator, dtype=torch.float64) ** 4 for p in model.parameters()]
    lr, eps = 1e-3, 1e-5
    update = make_update(model, DynamicOptions("rms", lr=lr, decay=decay, eps=eps), rms)
    trained = weights(model)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator, dtype=torch.float64))
            parameter.grad = torch.randn(parameter.shape, generator=generator, dtype=torch.float64)
    before, gradients = weights(model), [p.grad.clone() for p in model.parameters()]
    update()

    global_scale = sum(root.mean().item() for root in rms) / len(rms)
    clipped = 0
    for after, theta, theta0, g, root in zip(model.parameters(), before, trained, gradients, rms):
        rate = root / global_scale
        if decay > 0:
            clipped += int((rate > 1 / decay).sum())
            rate = torch.clamp(rate, max=1 / decay)
        expected = theta - lr * g / (root + eps) + decay * rate * (theta0 - theta)
        torch.testing.assert_close(after.detach(), expected, rtol=1e-12, atol=1e-15)
    assert (clipped > 0) == (decay == 0.6)  # the clip at 1/λ binds in the last case only


def fake_corpus(**splits):
    return SimpleNamespace(name="fake", unit="char", split=lambda name: splits[name])


class WeightsAtStage(NoProgress):
    """Records the model's weights when each stage of the protocol starts."""

    def __init__(self, model):
        self.model, self.seen = model, {}

    def stage(self, label, total):
        self.seen[label] = weights(self.model)
        return super().stage(label, total)


@pytest.mark.parametrize("method", ["sgd", "rms"])
def test_adapt_on_valid_starts_the_test_pass_from_the_adapted_weights(method):
    corpus = fake_corpus(train=random_tokens(400, 1), valid=random_tokens(151, 2), test=random_tokens(151, 3))
    options = DynamicOptions(method, lr=0.1 if method == "sgd" else 1e-3, segment=10, stat_batch_size=4)
    reports = {}
    for adapt_on in (None, "valid"):
        model = random_model()
        trained = weights(model)
        spy = WeightsAtStage(model)
        reports[adapt_on] = evaluate_dynamic(model, corpus, "test", options, adapt_on=adapt_on, progress=spy)
        start = spy.seen["dynamic test"]
        unchanged = all(torch.equal(a, b) for a, b in zip(start, trained))
        assert unchanged == (adapt_on is None)

    model = random_model()  # #2 by hand: one update rule over valid, then over test
    update = make_update(model, options, rms_statistics_like(model, corpus, options) if method == "rms" else None)
    dynamic_score(model, corpus.split("valid"), update, segment=10)
    by_hand = dynamic_score(model, corpus.split("test"), update, segment=10)
    assert reports["valid"].dynamic.nats == pytest.approx(by_hand.nats, rel=1e-6)
    assert reports["valid"].dynamic.nats != pytest.approx(reports[None].dynamic.nats, rel=1e-6)
    assert reports["valid"].static.nats == reports[None].static.nats
    assert reports["valid"].adaptation is not None and reports[None].adaptation is None


def rms_statistics_like(model, corpus, options):
    rms, _ = collect_gradient_statistics(
        model, corpus.split("train"), segment=options.segment, batch_size=options.stat_batch_size
    )
    return rms


@pytest.mark.parametrize("method, lr", [("sgd", 0.1), ("rms", 3e-4)])
def test_both_methods_lower_bpc_on_a_trained_model(trained_run, method, lr):
    model = load(trained_run, "cpu")
    corpus = model.corpus()
    report = evaluate_dynamic(
        model.network, corpus, "test", DynamicOptions(method, lr=lr, stat_batches=20), device="cpu"
    )
    assert report.static.tokens == report.dynamic.tokens == corpus.tokens("test") - 1
    assert report.dynamic.bpc < report.static.bpc - 0.02, (report.static.bpc, report.dynamic.bpc)


@pytest.mark.parametrize("cell", CELLS.names())
def test_every_cell_adapts_and_reproduces_static_at_learning_rate_zero(cell):
    model = random_model(cell, hidden=8)
    tokens = random_tokens(121)
    static = score_tokens(model, tokens, batch_size=2, bptt=10, device="cpu")
    rms = rms_statistics(model)
    for method, lr in (("sgd", 0.1), ("rms", 1e-2)):
        for step in (0.0, lr):
            options = DynamicOptions(method, lr=step, segment=10, batch_size=2)
            before = weights(model)
            score = dynamic_score(model, tokens, make_update(model, options, rms), segment=10, batch_size=2)
            moved = any(not torch.equal(a, b) for a, b in zip(before, weights(model)))
            if step == 0:
                # the static score of cells that evaluate through their sampling step rounds differently
                assert score.nats == pytest.approx(static.nats, rel=1e-6) and not moved
            else:
                assert np.isfinite(score.nats) and moved
            with torch.no_grad():
                for parameter, original in zip(model.parameters(), before):
                    parameter.copy_(original)


def test_grid_search_restores_the_weights_and_abandons_divergent_points():
    model = random_model()
    before = weights(model)
    result = grid_search(
        model, random_tokens(201), DynamicOptions("sgd", segment=10), lrs=(0.0, 0.05, 1e4), decays=(0.0,)
    )
    assert all(torch.equal(a, b) for a, b in zip(before, weights(model)))
    assert [point.lr for point in result.points] == [0.0, 0.05, 1e4]
    assert result.points[0].bpc == result.static_bpc
    assert result.points[2].bpc == float("inf")
    assert result.best.lr != 1e4 and result.tokens == 201


def test_a_best_value_at_an_edge_of_its_grid_is_said_with_the_way_to_extend_it():
    """Issue 34: the search chose η = 1e-05, the smallest it tried, without a word."""
    from charlm.inference.dynamic_protocol import SearchPoint, SearchResult

    def result(*points):
        return SearchResult([SearchPoint(*point) for point in points], static_bpc=5.0, tokens=100)

    rms = result((1e-5, 0.0, 2.0), (1e-5, 0.1, 1.9), (3e-5, 0.0, 2.2), (3e-5, 0.1, 2.1))
    assert rms.edge_notes() == [
        "the best η, 1e-05, is the smallest the search tried (1e-05 to 3e-05): a smaller one may do better; "
        "try --dyn-lr smaller than 1e-05",
        "the best λ, 0.1, is the largest the search tried (0 to 0.1): a larger one may do better; try --dyn-decay "
        "larger than 0.1",
    ]
    assert "largest" in result((0.001, 0.0, 2.0), (0.1, 0.0, 1.5)).edge_notes()[0]
    assert result((0.001, 0.0, 2.0), (0.01, 0.0, 1.5), (0.1, 0.0, 1.7)).edge_notes() == []  # inside the grid
    assert result((1e-5, 0.0, 1.5), (1e-5, 0.1, 1.7)).edge_notes() == []  # λ = 0: nothing below; one η: no grid
    assert result((0.001, 0.0, math.inf), (0.01, 0.0, math.inf)).edge_notes() == []  # every point diverged


def test_eval_warns_when_the_search_chose_an_edge(trained_run, tmp_path, monkeypatch):
    import charlm.inference.dynamic_protocol as protocol

    run = tmp_path / "run"
    shutil.copytree(trained_run, run)  # eval records its figures in the run
    monkeypatch.setitem(protocol.SEARCH_LRS, "sgd", (1e-9, 1e-8))
    monkeypatch.setattr(
        protocol,
        "grid_search",
        lambda model, tokens, options, rms, **rest: protocol.SearchResult(
            [protocol.SearchPoint(1e-9, 0.0, 4.0), protocol.SearchPoint(1e-8, 0.0, 4.1)], 4.2, len(tokens)
        ),
    )
    result = cli("eval", run, "--dynamic", "sgd", "--dyn-search", "--search-prefix", "300", check_code=0)
    assert (
        "warning: --dyn-search: the best η, 1e-09, is the smallest the search tried (1e-09 to 1e-08): a smaller "
        "one may do better; try --dyn-lr smaller than 1e-09"
    ) in result.stderr


def table_row(stdout, name):
    line = next(line for line in stdout.splitlines() if line.startswith("│ " + name))
    return [cell.strip() for cell in line.strip("│").split("│")]


def last_event(run):
    return records(run)[-1]


def test_cli_sgd_search_reports_both_figures_and_saves_adapted_weights(trained_run, tmp_path):
    run = trained_run
    adapted = tmp_path / "adapted.pt"
    result = cli(
        "eval",
        run,
        "--dynamic",
        "sgd",
        "--dyn-search",
        "--search-prefix",
        "300",
        "--save-adapted",
        adapted,
        check_code=0,
    )
    static, dynamic = table_row(result.stdout, "static"), table_row(result.stdout, "dynamic sgd")
    assert float(dynamic[1]) < float(static[1])
    assert "search on the first 300 valid predictions" in result.stdout
    assert result.stdout.count("←") == 1
    event = last_event(run)
    assert event["event"] == "eval" and event["mode"] == "dynamic" and event["split"] == "test"
    assert event["hyperparameters"]["method"] == "sgd" and event["hyperparameters"]["lr"] in SEARCH_LRS["sgd"]
    assert event["dynamic_bpc"] == pytest.approx(float(dynamic[1]), abs=1e-4)
    assert event["static_chars_per_s"] > 0 and event["dynamic_chars_per_s"] > 0
    assert len(event["search"]["points"]) == len(SEARCH_LRS["sgd"])

    original, saved = Checkpoint.load(run / "best.pt"), Checkpoint.load(adapted)
    assert saved.kind == "adapted" and saved.training is None
    assert saved.dynamic["lr"] == event["hyperparameters"]["lr"] and saved.dynamic["method"] == "sgd"
    assert any(not torch.equal(original.weights[name], saved.weights[name]) for name in original.weights)
    again = cli("eval", adapted, "--batch-size", "4", check_code=0)
    assert "bpc" in again.stdout
    sample = cli("sample", adapted, "--prime", "The ", "--length", "20", "--seed", "1", check_code=0)
    assert sample.stdout.startswith("The ")


def test_cli_rms_adapted_on_valid(trained_run):
    run = trained_run
    result = cli(
        "eval",
        run,
        "--dynamic",
        "rms",
        "--adapt-on",
        "valid",
        "--dyn-stat-batches",
        "5",
        "--dyn-lr",
        "0.0003",
        "--dyn-decay",
        "0.05",
        "--segment",
        "10",
        check_code=0,
    )
    assert "adapted on      valid" in result.stdout and "statistics      5 training batches" in result.stdout
    static, dynamic = table_row(result.stdout, "static"), table_row(result.stdout, "dynamic rms")
    assert float(dynamic[1]) < float(static[1])
    event = last_event(run)
    assert event["adapt_on"] == "valid" and event["statistics_batches"] == 5
    assert event["hyperparameters"] == {
        "method": "rms",
        "lr": 0.0003,
        "segment": 10,
        "batch_size": 1,
        "decay": 0.05,
        "eps": 1e-5,
        "stat_batch_size": 100,
        "stat_batches": 5,
    }


def test_cli_error_is_one_line(trained_run):
    assert_one_line_error(
        cli("eval", trained_run, "--dynamic", "sgd", "--adapt-on", "valid", "--split", "valid"),
        "--adapt-on valid",
        "--split test",
    )


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["--dynamic", "sgd", "--adapt-on", "valid", "--split", "valid"], "use it with --split test"),
        (["--adapt-on", "valid"], "--adapt-on applies to dynamic evaluation"),
        (["--dyn-lr", "0.1"], "--dyn-lr applies to dynamic evaluation"),
        (["--dyn-search"], "--dyn-search applies to dynamic evaluation"),
        (["--dynamic", "adam"], "--dynamic must be sgd or rms"),
        (["--dynamic", "--dyn-lr", "0.1"], "--dynamic must be sgd or rms, not '--dyn-lr': it takes a method first"),
        (
            ["--dynamic", "sgd", "--dyn-search", "--search-prefix", "0"],
            "--search-prefix must be a whole number of characters from 2",
        ),  # not the default of 50,000
        (["--dynamic", "sgd", "--dyn-lr", "-0.1"], "--dyn-lr must be in [0, 100], not -0.1"),
        (["--dynamic", "rms", "--dyn-decay", "1.5"], "--dyn-decay must be in [0, 1], not 1.5"),
        (["--dynamic", "rms", "--dyn-decay", "-0.1"], "--dyn-decay must be in [0, 1], not -0.1"),
        (["--dynamic", "rms", "--dyn-eps", "0"], "--dyn-eps must be positive, not 0.0"),  # open bound: the library's
        (["--dynamic", "sgd", "--dyn-decay", "0.1"], "--dyn-decay applies to --dynamic rms only"),
        (["--dynamic", "sgd", "--segment", "0"], "--segment must be at least 1, not 0"),
        (["--dynamic", "sgd", "--dyn-search", "--dyn-lr", "0.1"], "--dyn-search chooses --dyn-lr"),
        (["--dynamic", "sgd", "--search-prefix", "100"], "--search-prefix applies to --dyn-search only"),
        (["--dynamic", "sgd", "--adapt-on", "train"], "--adapt-on must be valid"),
        (["--dynamic", "sgd", "--bptt", "10"], "dynamic evaluation uses --segment"),
        (["--dynamic", "sgd", "--save-adapted", "/nonexistent/dir/a.pt"], "does not exist"),
    ],
)
def test_bad_dynamic_options_are_one_line_errors(trained_run, args, fragment):
    """Through the CLI in this process (one interpreter start for all of them)."""
    result = cli("eval", trained_run, *args)
    assert_one_line_error(result, fragment)
    assert result.stdout == ""


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["--dyn-lr", "0.1"], "--dyn-lr applies to dynamic scoring: add --dynamic sgd or --dynamic rms"),
        (["--dynamic", "adam"], "--dynamic must be sgd or rms, not 'adam'"),
        (["--dynamic", "--dyn-lr", "0.1"], "--dynamic must be sgd or rms, not '--dyn-lr'"),
    ],
)
def test_score_checks_its_dynamic_flags_as_eval_does(trained_run, tmp_path, args, fragment):
    text = tmp_path / "text.txt"
    text.write_text("abc", encoding="utf-8")
    result = cli("score", trained_run, text, *args)
    assert_one_line_error(result, fragment)
    assert result.stdout == ""


def test_save_adapted_refuses_to_overwrite_the_evaluated_checkpoint(trained_run):
    result = cli("eval", trained_run, "--dynamic", "sgd", "--save-adapted", trained_run / "best.pt")
    assert_one_line_error(result, "would overwrite the evaluated checkpoint")


def test_save_adapted_replaces_a_file_only_with_force(trained_run, tiny_corpus, tmp_path, monkeypatch):
    """As `charlm export` does: an existing file is refused before the evaluation, kept as it was; with
    --force it is replaced by the adapted checkpoint."""
    import charlm.api

    target = tmp_path / "kept.pt"
    target.write_bytes(b"an earlier file")
    scored = []
    monkeypatch.setattr(charlm.api.Model, "evaluate", lambda *args, **kwargs: scored.append(1))
    result = cli("eval", trained_run, "--dynamic", "sgd", "--save-adapted", target, "--data-dir", tiny_corpus)
    assert_one_line_error(
        result, f"--save-adapted {target} exists: pass --force to replace it, or give another file name"
    )
    assert target.read_bytes() == b"an earlier file" and scored == []
    monkeypatch.undo()
    cli(
        "eval",
        trained_run,
        "--dynamic",
        "sgd",
        "--segment",
        "50",
        "--save-adapted",
        target,
        "--force",
        "--data-dir",
        tiny_corpus,
        check_code=0,
    )
    assert Checkpoint.load(target).dynamic is not None
    assert_one_line_error(cli("eval", trained_run, "--force"), "--force")  # without --dynamic it does nothing


def test_options_record_only_what_the_method_uses():
    assert set(DynamicOptions("sgd").hyperparameters()) == {"method", "lr", "segment", "batch_size"}
    assert DynamicOptions("rms").hyperparameters()["decay"] == DynamicOptions().decay
    assert dataclasses.replace(DynamicOptions("rms"), lr=0.5).lr == 0.5


def test_help_states_the_library_defaults():
    import inspect

    from charlm.cli.evaluate import evaluate
    from charlm.config_inference import DEFAULT_DYNAMIC_LR
    from charlm.config_inference import DEFAULT_SEARCH_PREFIX

    helps = {
        parameter.default.param_decls[0]: parameter.default.help
        for parameter in inspect.signature(evaluate).parameters.values()
        if getattr(parameter.default, "param_decls", None)
    }
    defaults = DynamicOptions()
    assert f"(default: {DEFAULT_DYNAMIC_LR['sgd']:g} sgd, {DEFAULT_DYNAMIC_LR['rms']:g} rms)" in helps["--dyn-lr"]
    assert f"(default: {defaults.decay:g})" in helps["--dyn-decay"]
    assert f"(default: {defaults.eps:g})" in helps["--dyn-eps"]
    assert f"(default: {defaults.segment})" in helps["--segment"]
    assert f"(default: {defaults.stat_batch_size})" in helps["--dyn-stat-batch-size"]
    assert f"{defaults.batch_size} dynamic" in helps["--batch-size"]
    assert f"(default: {DEFAULT_SEARCH_PREFIX})" in helps["--search-prefix"]
