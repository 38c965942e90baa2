"""Learning-rate schedules by name, and the token budget: each against a hand trace, through the trainer, resumed."""

from __future__ import annotations

import math

import pytest
import torch

from charlm.training.schedules import Schedule, warmup_cosine_factor
from charlm.training.trainer import Trainer
from helpers import assert_one_line_error, cli, records, tiny_config, tiny_train


def optimizer(lr=1e-3):
    return torch.optim.Adam([torch.nn.Parameter(torch.zeros(1))], lr=lr)


def rate(opt):
    return opt.param_groups[0]["lr"]


def test_plateau_halving_against_a_hand_trace():
    """Halve after an epoch no better than the best before it, never below min_lr."""
    opt = optimizer()
    schedule = Schedule(opt, "plateau-halving", lr=1e-3, min_lr=2e-4)
    rates = []
    for valid_loss in (3.0, 2.9, 2.95, 2.8, 2.85, 2.9, 2.9, 2.7):
        schedule.after_step()  # steps do not move it
        schedule.after_epoch(valid_loss)
        rates.append(rate(opt))
    assert rates == pytest.approx([1e-3, 1e-3, 5e-4, 5e-4, 2.5e-4, 2e-4, 2e-4, 2e-4])


def test_warmup_then_cosine():
    opt = optimizer(1.0)
    schedule = Schedule(opt, "warmup-cosine", lr=1.0, min_lr=0.1, warmup_steps=4, total_steps=14)
    seen = [rate(opt)]
    for _ in range(14):
        schedule.after_step()
        seen.append(rate(opt))
    assert seen[:4] == pytest.approx([0.25, 0.5, 0.75, 1.0])  # the step about to run: 1/4, 2/4, ...
    assert seen[4] == pytest.approx(1.0) and seen[9] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi / 2)))
    assert seen[14] == pytest.approx(0.1) and all(a >= b for a, b in zip(seen[4:], seen[5:]))
    assert warmup_cosine_factor(100, 4, 14, 0.1) == pytest.approx(0.1)  # past the end: the floor
    schedule.after_epoch(1.0)  # epochs do not move it
    assert rate(opt) == pytest.approx(0.1)


def test_constant_and_epoch_decay():
    opt = optimizer()
    constant = Schedule(opt, "constant", lr=1e-3)
    for _ in range(3):
        constant.after_step()
        constant.after_epoch(1.0)
    assert rate(opt) == 1e-3
    opt = optimizer()
    decay = Schedule(opt, "epoch-decay", lr=1e-3, lr_decay=0.5)
    decay.after_step()
    decay.after_epoch(1.0)
    decay.after_epoch(1.0)
    assert rate(opt) == pytest.approx(2.5e-4)
    assert set(decay.state_dict()) >= {"last_epoch", "gamma"}  # ExponentialLR's own state, as before


def test_a_schedule_resumes_where_it_was():
    opt = optimizer()
    schedule = Schedule(opt, "plateau-halving", lr=1e-3, min_lr=1e-5)
    for loss in (3.0, 3.1):
        schedule.after_epoch(loss)
    saved = schedule.state_dict()
    again_opt = optimizer()
    again_opt.param_groups[0]["lr"] = rate(opt)
    again = Schedule(again_opt, "plateau-halving", lr=1e-3, min_lr=1e-5)
    again.load_state_dict(saved)
    for loss in (3.05,):  # still no better than 3.0: halve again
        schedule.after_epoch(loss)
        again.after_epoch(loss)
    assert rate(again_opt) == rate(opt) == pytest.approx(2.5e-4)


def test_the_trainer_follows_the_schedule_it_was_given(tiny_corpus, tmp_path):
    config = tiny_config(
        tiny_corpus,
        tmp_path / "run",
        epochs=3,
        schedule="plateau-halving",
        lr=4e-3,
        min_lr=1e-3,
        train_fraction=0.3,
        patience=5,
    )
    Trainer(config).fit()
    epochs = records(tmp_path / "run", "epoch")
    best, expected = math.inf, 4e-3
    for epoch in epochs:  # each epoch's record has the rate it trained with
        assert epoch["lr"] == pytest.approx(expected)
        if epoch["valid_loss"] >= best:
            expected = max(expected * 0.5, 1e-3)
        best = min(best, epoch["valid_loss"])
    run = tmp_path / "cosine"
    Trainer(
        tiny_config(
            tiny_corpus, run, epochs=1, schedule="warmup-cosine", warmup_steps=3, log_every=1, train_fraction=0.3
        )
    ).fit()
    steps = records(run, "step")
    assert [step["lr"] for step in steps[:4]] == pytest.approx([1e-3 / 3, 2e-3 / 3, 1e-3, 1e-3])
    assert steps[-1]["lr"] < 1e-3 / 2  # the cosine's second half by the last step


def test_the_cosine_ends_where_a_token_budget_ends_the_run(tiny_corpus, tmp_path):
    """--max-tokens of 10 updates (batch 8 × bptt 16 each) over 3 epochs of many more: the cosine reaches --min-lr
    at the 10th update, as nanoGPT's at max_iters."""
    run = tmp_path / "budget"
    config = tiny_config(tiny_corpus, run, epochs=3, schedule="warmup-cosine", warmup_steps=2, min_lr=1e-4, log_every=1)
    config.max_tokens = 10 * 8 * 16
    Trainer(config).fit()
    steps = records(run, "step")
    assert len(steps) == 10
    assert steps[1]["lr"] == pytest.approx(1e-3)
    expected = [1e-4 + 0.9e-3 * 0.5 * (1 + math.cos(math.pi * (k - 2) / 8)) for k in range(2, 10)]
    assert [step["lr"] for step in steps[2:]] == pytest.approx(expected)


def test_schedule_errors_are_one_line(tiny_corpus):
    common = ("--corpus", "tiny", "--data-dir", str(tiny_corpus), "--epochs", "1", "--hidden", "8")
    assert_one_line_error(
        cli("train", *common, "--schedule", "sometimes"),
        "--schedule must be one of epoch-decay, plateau-halving, constant, warmup-cosine, not 'sometimes'",
    )
    assert_one_line_error(
        cli("train", *common, "--schedule", "plateau-halving", "--min-lr", "0.01"),
        "--min-lr must be below --lr (0.003) for plateau-halving, not 0.01",
    )
    assert_one_line_error(cli("train", *common, "--plateau-factor", "1"), "--plateau-factor")


def test_a_token_budget_stops_at_the_same_point_resumed_or_not(tiny_corpus, tmp_path):
    """--max-tokens counts every stream's tokens over the run's sessions: a run stopped at 2,048
    tokens and resumed to 6,144 ends with the weights of a run given 6,144 at once."""
    from helpers import assert_same_weights, weights

    settings = dict(epochs=3, batch_size=8, bptt=16, train_fraction=0.5)  # 128 tokens a step
    Trainer(tiny_config(tiny_corpus, tmp_path / "once", max_tokens=6144, **settings)).fit()
    Trainer(tiny_config(tiny_corpus, tmp_path / "twice", max_tokens=2048, **settings)).fit()
    (first,) = records(tmp_path / "twice", "end")
    assert first["tokens_seen"] == 2048 and first["stopped_by"] == "tokens"
    Trainer.resume(tmp_path / "twice", max_tokens=6144).fit()
    assert_same_weights(weights(tmp_path / "once"), weights(tmp_path / "twice"))
    ends = [records(run, "end")[-1] for run in (tmp_path / "once", tmp_path / "twice")]
    assert [end["tokens_seen"] for end in ends] == [6144, 6144] and {end["stopped_by"] for end in ends} == {"tokens"}
    written = {path.name: path.stat().st_mtime_ns for path in (tmp_path / "twice").iterdir() if path.name != "lock"}
    result = cli("train", "--resume", str(tmp_path / "twice"), "--max-tokens", "6144")
    assert_one_line_error(
        result,
        "the run has already trained on 6,144 tokens, its --max-tokens budget of 6,144: "
        "give a larger --max-tokens to go on",
    )
    assert {
        path.name: path.stat().st_mtime_ns for path in (tmp_path / "twice").iterdir() if path.name != "lock"
    } == written


def test_the_end_record_says_why_training_stopped(tiny_corpus, tmp_path):
    Trainer(tiny_config(tiny_corpus, tmp_path / "run", epochs=1, train_fraction=0.2)).fit()
    (end,) = records(tmp_path / "run", "end")
    assert end["stopped_by"] == "epochs" and end["tokens_seen"] > 0
    epochs = records(tmp_path / "run", "epoch")
    assert epochs[-1]["tokens_seen"] == end["tokens_seen"]


def test_a_token_budget_that_ends_with_an_epoch_ends_it_as_any_other(tiny_corpus, tmp_path):
    settings = dict(epochs=3, batch_size=8, bptt=16, train_fraction=0.5)
    probe = Trainer(tiny_config(tiny_corpus, tmp_path / "probe", **settings))
    per_epoch = probe.train_streams.tokens_scored  # every stream, its whole length (the last window is shorter)
    probe.run.release()
    Trainer(tiny_config(tiny_corpus, tmp_path / "run", max_tokens=per_epoch, **settings)).fit()
    epochs = records(tmp_path / "run", "epoch")
    (end,) = records(tmp_path / "run", "end")
    assert [epoch["partial"] for epoch in epochs] == [False] and end["stopped_by"] == "tokens"
    assert end["tokens_seen"] == per_epoch and end["epochs"] == 1


def test_a_batch_too_large_for_the_corpus_is_said(tiny_corpus, tmp_path):
    """Issue 24: 4,000 streams of a 36,000-token split are 9 tokens each, under one 50-token window."""
    small = dict(hidden_size=8, epochs=1, eval_batch_size=16, bptt=None)  # the default window, 50 tokens
    result = cli(*tiny_train(tiny_corpus, tmp_path / "run", batch_size=4000, **small), check_code=0)
    assert (
        "warning: --batch-size 4000 cuts the" in result.stderr
        and "shorter than one --bptt window (50)" in result.stderr
    )
    quiet = cli(*tiny_train(tiny_corpus, tmp_path / "quiet", batch_size=16, **small), check_code=0)
    assert "--batch-size" not in quiet.stderr


def test_validation_on_a_fraction_of_the_split_and_test_on_all_of_it(tiny_corpus, tmp_path):
    """Issue 24: --eval-fraction scores validation during training on the split's leading part (the
    same tokens every epoch) and says so in the records; the test score stays exact over the whole split."""
    whole = tmp_path / "whole"
    Trainer(tiny_config(tiny_corpus, whole, epochs=1)).fit()
    part = tmp_path / "part"
    Trainer(tiny_config(tiny_corpus, part, epochs=2, eval_fraction=0.25)).fit()
    [full_epoch] = records(whole, "epoch")
    epochs = records(part, "epoch")
    assert all(e["valid_fraction"] == 0.25 for e in epochs) and "valid_fraction" not in full_epoch
    assert epochs[0]["valid_tokens"] == epochs[1]["valid_tokens"]
    assert abs(epochs[0]["valid_tokens"] - full_epoch["valid_tokens"] / 4) <= 16  # the eval streams' rounding
    assert records(part, "test")[0]["test_tokens"] == records(whole, "test")[0]["test_tokens"]
    assert_one_line_error(
        cli(*tiny_train(tiny_corpus, eval_fraction=0)),
        "--eval-fraction must be in (0, 1]",
    )


def test_the_status_line_shows_the_running_train_bpc_and_the_last_validation(
    tiny_corpus, tmp_path, monkeypatch, caplog
):
    """Issue 24: what a watcher sees during an epoch (a bar on a terminal, these lines elsewhere)."""
    import logging

    from charlm.training import reporting

    monkeypatch.setattr(reporting, "STATUS_INTERVAL", 0.0)
    logger = logging.getLogger("charlm")  # charlm's logger does not propagate once the CLI has run: listen on it
    logger.addHandler(caplog.handler)
    try:
        with caplog.at_level(logging.INFO, logger="charlm"):
            Trainer(tiny_config(tiny_corpus, tmp_path / "run", epochs=2)).fit()
    finally:
        logger.removeHandler(caplog.handler)
    lines = [r.getMessage() for r in caplog.records if "window" in r.getMessage() and "chars/s" in r.getMessage()]
    first_epoch = [line for line in lines if line.startswith("epoch 1/2")]
    second_epoch = [line for line in lines if line.startswith("epoch 2/2")]
    assert first_epoch and "bpc (epoch so far)" in first_epoch[0] and "last valid" not in first_epoch[0]
    valid = records(tmp_path / "run", "epoch")[0]["valid_bpc"]
    assert second_epoch and f"last valid {valid:.4f} bpc" in second_epoch[0]


def test_print_every_writes_a_loss_line_per_k_steps_to_the_terminal_and_the_log(tiny_corpus, tmp_path):
    """char-rnn's habit: a training-loss line every K steps; the figures are the step records'."""
    run = tmp_path / "printed"
    small = dict(cell="gru", hidden_size=8, epochs=1, train_fraction=0.2)
    cli(*tiny_train(tiny_corpus, run, print_every=5, **small), check_code=0)
    lines = [line for line in (run / "train.log").read_text().splitlines() if line.startswith("step ")]
    steps = records(run, "step")
    assert len(lines) == len(steps) > 3
    for line, step in zip(lines, steps):
        assert line.startswith(f"step {step['step']:,}  epoch 1  window {step['step']:,}/")
        assert f"loss {step['loss']:.4f}  train {step['bpc']:.4f} bpc  lr {step['lr']:.2e}" in line
    quiet = tmp_path / "quiet"  # the default: no such lines
    cli(*tiny_train(tiny_corpus, quiet, **small), check_code=0)
    assert not [line for line in (quiet / "train.log").read_text().splitlines() if line.startswith("step ")]
