"""Training protocol: resume equivalence, Ctrl-C and SIGTERM, divergence, checkpoints and metrics, errors."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from charlm.checkpoint import Checkpoint
from charlm.model import LanguageModel, ModelConfig
from charlm.training.step import TrainingStep
from charlm.training.trainer import Trainer, TrainingInterrupted
from helpers import (
    assert_one_line_error,
    assert_same_run_end,
    assert_same_weights,
    cli,
    records,
    tiny_config,
    tiny_train,
    weights,
)


@pytest.mark.parametrize("cell", ["lstm", pytest.param("lru", marks=pytest.mark.slow)])  # lru: the same path, slower
def test_resume_after_one_epoch_equals_straight_run(tiny_corpus, tmp_path, cell):
    straight = tmp_path / "straight"
    Trainer(tiny_config(tiny_corpus, straight, cell=cell)).fit()

    split = tmp_path / "split"
    Trainer(tiny_config(tiny_corpus, split, cell=cell, epochs=1)).fit()
    assert Checkpoint.load(split / "last.pt").training.progress["epoch"] == 1
    Trainer.resume(str(split), epochs=2).fit()
    assert_same_run_end(straight, split)
    assert Checkpoint.load(split / "last.pt").training.optimizer["param_groups"][0]["lr"] == pytest.approx(
        1e-3 * 0.9**2
    )
    log = (split / "train.log").read_text()  # the resumed session says where it began
    first = Checkpoint.load(straight / "last.pt").training.progress
    assert f"resuming at epoch 2, window 0, step {first['step'] // 2:,}: {first['tokens_seen'] // 2:,} tokens" in log


def test_sigterm_inside_an_epoch_then_resume_equals_straight_run(tiny_corpus, tmp_path, monkeypatch):
    """A real SIGTERM to this process in the middle of the second epoch (after the scheduler's
    first step): last.pt is saved, TrainingInterrupted (exit 130); the resumed run ends exactly
    as the uninterrupted one, learning-rate schedule and optimizer state included."""
    settings = dict(cell="gru", hidden_size=16, epochs=3, train_fraction=0.3)
    straight = tmp_path / "straight"
    Trainer(tiny_config(tiny_corpus, straight, **settings)).fit()

    interrupted = tmp_path / "interrupted"
    trainer = Trainer(tiny_config(tiny_corpus, interrupted, **settings))
    stop_at = len(trainer.train_streams) + 8  # the 8th step of the second epoch
    original = TrainingStep._grad_norms

    def signal_during_the_step(self):  # after the backward pass, before the optimizer's step
        if trainer.progress.step + 1 == stop_at:
            os.kill(os.getpid(), signal.SIGTERM)
        return original(self)

    monkeypatch.setattr(TrainingStep, "_grad_norms", signal_during_the_step)
    handler_before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(TrainingInterrupted, match="interrupted: saved") as raised:
        trainer.fit()
    assert raised.value.exit_code == 130
    assert signal.getsignal(signal.SIGTERM) == handler_before  # the handler is put back
    monkeypatch.undo()
    saved = Checkpoint.load(interrupted / "last.pt").training
    assert saved.progress["epoch"] == 1 and saved.progress["window"] == 8 and saved.progress["step"] == stop_at
    assert saved.scheduler["last_epoch"] == 1
    assert saved.optimizer["param_groups"][0]["lr"] == pytest.approx(1e-3 * 0.9)
    assert records(interrupted, "interrupted")

    Trainer.resume(str(interrupted)).fit()
    assert_same_run_end(straight, interrupted)


def test_run_directory_holds_config_metrics_log_and_checkpoints(tiny_corpus, tmp_path):
    run = tmp_path / "run"
    summary = Trainer(tiny_config(tiny_corpus, run)).fit()
    for name in ("config.json", "metrics.jsonl", "train.log", "last.pt", "best.pt"):
        assert (run / name).is_file(), name
    rows = records(run)
    epochs = [row for row in rows if row["event"] == "epoch"]
    assert [row["epoch"] for row in epochs] == [1, 2]
    for key in ("train_loss", "train_bits", "valid_loss", "valid_bpc", "lr", "chars_per_second", "train_seconds"):
        assert all(key in row for row in epochs), key
    assert not any("test_bpc" in row for row in epochs)  # test is scored once, for the best weights
    assert set(epochs[0]["grad_norm"]) == {"embedding", "layer0", "softmax"}
    assert epochs[1]["lr"] == pytest.approx(1e-3 * 0.9)
    assert any(row["event"] == "step" for row in rows)
    best = Checkpoint.load(run / "best.pt")
    assert best.scores["valid_bpc"] == pytest.approx(min(row["valid_bpc"] for row in epochs))
    assert summary["best_valid_bpc"] == pytest.approx(best.scores["valid_bpc"])
    assert summary["test_bpc_at_best"] == pytest.approx(best.scores["test_bpc"])
    payload = torch.load(run / "last.pt", weights_only=True)  # plain tensors and containers only
    assert payload["tokenizer"]["vocab"] and payload["training"]["progress"]["finished"]
    assert payload["training"]["scheduler"]["last_epoch"] == 2


def test_test_split_is_scored_once_with_the_best_validation_weights(tiny_corpus, tmp_path):
    from charlm.api import load

    run = tmp_path / "run"
    summary = Trainer(tiny_config(tiny_corpus, run, epochs=3, train_fraction=0.3)).fit()
    rows = records(run)
    tests = [row for row in rows if row["event"] == "test"]
    assert len(tests) == 1 and tests[0]["epoch"] == summary["best_epoch"]
    direct = load(run, device="cpu").evaluate("test", batch_size=4, record=False)  # eval_batch_size of tiny_config
    assert tests[0]["test_bpc"] == pytest.approx(direct.bpc, rel=1e-12)
    assert summary["test_bpc_at_best"] == pytest.approx(direct.bpc, rel=1e-12)
    assert Checkpoint.load(run / "best.pt").scores["test_loss"] == pytest.approx(direct.loss, rel=1e-12)
    wall = summary["wall_seconds"]
    assert set(wall) == {"train", "valid", "test"} and all(seconds > 0 for seconds in wall.values())
    assert wall["train"] == pytest.approx(
        sum(row["train_seconds"] for row in rows if row["event"] == "epoch"), rel=1e-3
    )

    every = tmp_path / "every"
    Trainer(tiny_config(tiny_corpus, every, epochs=2, test_every_epoch=True, train_fraction=0.3)).fit()
    rows = records(every)
    assert all("test_bpc" in row for row in rows if row["event"] == "epoch")
    assert not any(row["event"] == "test" for row in rows)


def test_train_fraction_uses_leading_part(tiny_corpus, tmp_path):
    full = Trainer(tiny_config(tiny_corpus, tmp_path / "full", epochs=1))
    fifth = Trainer(tiny_config(tiny_corpus, tmp_path / "fifth", epochs=1, train_fraction=0.2))
    assert fifth.train_streams.num_windows < full.train_streams.num_windows / 4


def test_params_budget_chooses_hidden_size(tiny_corpus, tmp_path):
    trainer = Trainer(
        tiny_config(tiny_corpus, tmp_path / "budget", hidden_size=None, params="20k", cell="gru", epochs=1)
    )
    total = sum(p.numel() for p in trainer.model.parameters())
    assert abs(total - 20_000) < 0.05 * 20_000


def test_interrupt_then_resume_equals_straight_run(tiny_corpus, tmp_path):
    """Ctrl-C (SIGINT) to a real `python -m charlm train` process, then `--resume`."""
    args = [
        "train",
        "--corpus",
        "tiny",
        "--cell",
        "gru",
        "--hidden",
        "16",
        "--batch-size",
        "2",
        "--bptt",
        "8",
        "--epochs",
        "2",
        "--log-every",
        "1",
        "--eval-batch-size",
        "8",
        "--train-fraction",
        "0.1",
        "--data-dir",
        tiny_corpus,
    ]
    interrupted = tmp_path / "interrupted"
    process = subprocess.Popen(
        [sys.executable, "-m", "charlm", *map(str, args), "--run-dir", str(interrupted)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 120
    while time.time() < deadline and not records(interrupted, "step"):
        time.sleep(0.02)
    process.send_signal(signal.SIGINT)  # at its first logged step: an epoch is 225 windows, far from its end
    _, stderr = process.communicate(timeout=120)
    cli(*args, "--run-dir", tmp_path / "straight", check_code=0)
    assert process.returncode == 130, stderr
    assert "Traceback" not in stderr and "interrupted: saved" in stderr
    progress = Checkpoint.load(interrupted / "last.pt").training.progress
    assert progress["epoch"] == 0 and progress["window"] > 0  # stopped inside the first epoch

    cli("train", "--resume", interrupted, check_code=0)
    assert_same_run_end(tmp_path / "straight", interrupted)


def test_divergence_stops_and_keeps_last_good_checkpoint(tiny_corpus, tmp_path):
    run = tmp_path / "diverging"
    result = cli(*tiny_train(tiny_corpus, run, hidden_size=16, epochs=3, lr_decay=1e38, clip=0))
    assert_one_line_error(result, "training stopped: loss became", "kept the last good checkpoint", code=3)
    kept = Checkpoint.load(run / "last.pt")
    assert kept.training.progress["epoch"] == 1
    assert all(torch.isfinite(tensor).all() for tensor in kept.weights.values())
    tests = records(run, "test")
    assert len(tests) == 1 and tests[0]["epoch"] == 1  # the best weights before the divergence are still tested


def test_existing_run_directory_is_not_overwritten(tiny_corpus, tmp_path):
    run = tmp_path / "run"
    Trainer(tiny_config(tiny_corpus, run, epochs=1)).fit()
    result = cli(*tiny_train(tiny_corpus, run))
    assert_one_line_error(result, "already holds a run", "--resume")


@pytest.mark.parametrize(
    "extra, fragments",
    [
        (["--cell", "no-such-cell"], ["unknown cell 'no-such-cell'"]),
        (["--batch-size", "0"], ["--batch-size must be at least 1, not 0"]),
        (["--lr", "0"], ["--lr must be in (0, 1000], not 0.0"]),
        (["--hidden", "8", "--params", "1M"], ["not both"]),
        (["--train-fraction", "1.5"], ["--train-fraction"]),
        (["--cell", "lstm", "--cell-opt", "peephole=maybe"], ["peephole"]),
        (["--cell", "lstm", "--cell-opt", "nonsense=1"], ["has no option 'nonsense'"]),
        (["--params", "lots"], ["parameter budget 'lots'"]),
        (
            ["--device", "cuda"] if not torch.cuda.is_available() else ["--device", "tpu"],
            ["not available" if not torch.cuda.is_available() else "tpu"],
        ),
        (["--cell", "os.path:join"], ["not a subclass"]),
        (["--cell", "no_such_module_xyz:Cell"], ["cannot import"]),
    ],
)
def test_bad_training_input_is_one_line_error(tiny_corpus, tmp_path, extra, fragments):
    result = cli(*tiny_train(tiny_corpus, tmp_path / "r", *extra, epochs=1, hidden_size=None))
    assert_one_line_error(result, *fragments)
    assert result.stdout == ""
    assert not (tmp_path / "r" / "last.pt").exists()


def test_bad_training_input_is_one_line_error_in_a_real_process(tiny_corpus, tmp_path):
    """The exit code and the single line, through `python -m charlm` (a usage error from typer)."""
    from helpers import run_cli

    result = run_cli(*tiny_train(tiny_corpus, tmp_path / "r", layers=0))
    assert_one_line_error(result, "--layers must be in [1, 1024], not 0")
    assert result.stdout == ""


def test_missing_corpus_says_which_prepare_to_run(tmp_path):
    result = cli("train", "--corpus", "wp", "--data-dir", tmp_path / "empty", "--run-dir", tmp_path / "r")
    assert_one_line_error(result, "charlm prepare wp")


def test_config_file_sets_options_and_command_line_wins(tiny_corpus, tmp_path):
    config = tmp_path / "config.json"
    config.write_text(
        json.dumps({"cell": "lstm", "hidden": 12, "epochs": 1, "batch_size": 8, "cell_options": {"peephole": True}})
    )
    run = tmp_path / "run"
    cli(
        "train",
        "--config",
        config,
        "--corpus",
        "tiny",
        "--hidden",
        "10",
        "--data-dir",
        tiny_corpus,
        "--run-dir",
        run,
        check_code=0,
    )
    checkpoint = Checkpoint.load(run / "last.pt")
    assert checkpoint.model_config.hidden_size == 10
    assert checkpoint.model_config.cell_options == {"peephole": True}
    assert checkpoint.train_config.batch_size == 8 and checkpoint.train_config.epochs == 1
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert_one_line_error(cli("train", "--config", bad), "not valid JSON")


def test_init_from_starts_from_checkpoint_weights(tiny_corpus, tmp_path):
    source = tmp_path / "source"
    Trainer(tiny_config(tiny_corpus, source, epochs=1)).fit()
    tuned = Trainer(tiny_config(tiny_corpus, tmp_path / "tuned", epochs=1, init_from=str(source / "best.pt")))
    assert_same_weights(tuned.model.state_dict(), weights(source, "best.pt"))
    result = cli(*tiny_train(tiny_corpus, tmp_path / "mismatch", hidden_size=30, init_from=source / "best.pt"))
    assert_one_line_error(result, "--init-from", "holds another model (hidden_size 24 there, 30 here)")


def test_init_from_takes_the_model_from_the_checkpoint(tiny_corpus, tmp_path):
    """Issue 24: --init-from alone is enough; the cell, size, layers and corpus come from the checkpoint."""
    source = tmp_path / "source"
    Trainer(tiny_config(tiny_corpus, source, epochs=1, cell="gru", hidden_size=12, layers=2, train_fraction=0.2)).fit()
    cli(
        "train",
        "--init-from",
        source / "best.pt",
        "--data-dir",
        tiny_corpus,
        "--epochs",
        "1",
        "--batch-size",
        "8",
        "--bptt",
        "16",
        "--eval-batch-size",
        "4",
        "--train-fraction",
        "0.2",
        "--eval-fraction",
        "0.2",
        "--run-dir",
        tmp_path / "tuned",
        check_code=0,
    )
    tuned = Checkpoint.load(tmp_path / "tuned" / "last.pt")
    assert (tuned.model_config.cell, tuned.model_config.hidden_size, tuned.model_config.layers) == ("gru", 12, 2)
    assert tuned.train_config.corpus == "tiny"
    result = cli(
        "train",
        "--init-from",
        source / "best.pt",
        "--cell",
        "lstm",
        "--data-dir",
        tiny_corpus,
        "--run-dir",
        tmp_path / "conflict",
    )
    assert_one_line_error(result, "--init-from", "holds another model (cell 'gru' there, 'lstm' here")


def test_max_minutes_stops_with_a_resumable_evaluated_run(tiny_corpus, tmp_path):
    run = tmp_path / "timed"
    summary = Trainer(tiny_config(tiny_corpus, run, epochs=5, max_minutes=0.0005)).fit()
    assert summary["epochs"] == 0 and summary["best_epoch"] == 1  # a partial first epoch, evaluated
    progress = Checkpoint.load(run / "last.pt").training.progress
    assert 0 < progress["window"] and progress["epoch"] == 0
    Trainer.resume(str(run), epochs=1).fit()
    assert Checkpoint.load(run / "last.pt").training.progress["epoch"] == 1


def test_max_minutes_then_resume_equals_straight_run(tiny_corpus, tmp_path):
    """Stopped by its time budget inside the first epoch (and evaluated there), resumed to the end."""
    straight = tmp_path / "straight"
    Trainer(tiny_config(tiny_corpus, straight, cell="gru", hidden_size=16, train_fraction=0.3)).fit()
    timed = tmp_path / "timed"
    Trainer(tiny_config(tiny_corpus, timed, cell="gru", hidden_size=16, train_fraction=0.3, max_minutes=0.0002)).fit()
    progress = Checkpoint.load(timed / "last.pt").training.progress
    assert progress["epoch"] == 0 and 0 < progress["window"]
    Trainer.resume(str(timed)).fit()
    assert_same_run_end(straight, timed)


def test_resume_refuses_settings_that_define_the_run(tiny_corpus, tmp_path):
    from charlm.errors import ConfigError

    run = tmp_path / "run"
    Trainer(tiny_config(tiny_corpus, run, epochs=1, train_fraction=0.1)).fit()
    with pytest.raises(ConfigError, match="lr is fixed by the run being resumed"):
        Trainer.resume(str(run), epochs=2, lr=0.5)
    assert_one_line_error(
        cli("train", "--resume", run, "--epochs", "2", "--hidden", "8"), "--hidden cannot change a run being resumed"
    )


def test_bf16_training_matches_fp32_and_resumes_across_precisions(tiny_corpus, tmp_path):
    """bf16 autocast on the CPU: the loss is float32, the carried state is saved in float32, the
    result is within noise of fp32, and a bf16 run resumes in fp32."""
    fp32 = Trainer(tiny_config(tiny_corpus, tmp_path / "fp32", epochs=1, cell="gru", train_fraction=0.4)).fit()
    bf16 = Trainer(
        tiny_config(tiny_corpus, tmp_path / "bf16", epochs=1, cell="gru", precision="bf16", train_fraction=0.4)
    ).fit()
    assert abs(bf16["best_valid_bpc"] - fp32["best_valid_bpc"]) < 0.05
    assert bf16["best_valid_bpc"] != fp32["best_valid_bpc"]  # the low precision was really used
    saved = Checkpoint.load(tmp_path / "bf16" / "last.pt")
    assert all(value.dtype == torch.float32 for value in saved.weights.values())
    resumed = Trainer.resume(tmp_path / "bf16", epochs=2, precision="fp32").fit()
    assert resumed["epochs"] == 2


@pytest.mark.parametrize("cell, options", [("lstm", {}), ("rnn", {}), ("gru", {"reset_after": True})])
def test_cells_with_a_fused_kernel_train_in_bf16_on_any_cpu(cell, options):
    """The upper layer's input is no embedding row, so it would take the fused library kernel,
    whose bfloat16 form needs bf16 instructions (many CPUs lack them): under CPU autocast the
    loop runs instead, and computes what the float32 loop computes, to bf16's precision."""
    torch.manual_seed(0)
    model = LanguageModel(ModelConfig(cell, vocab_size=11, hidden_size=16, layers=2, cell_options=options))
    tokens = torch.randint(11, (3, 5))
    expected, _ = model(tokens, model.initial_state(3))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits, _ = model(tokens, model.initial_state(3))
    logits.float().sum().backward()
    torch.testing.assert_close(logits.float(), expected, atol=0.05, rtol=0.05)


def test_a_step_whose_gradients_overflowed_stays_out_of_the_epochs_gradient_norm(tiny_corpus, tmp_path, monkeypatch):
    """fp16's scaler skips a step whose gradients overflowed; its inf norm must not make the epoch's
    mean norm inf (simulated: the CPU has no fp16 training)."""
    original = TrainingStep._grad_norms
    calls = []

    def overflow_on_the_third(self):
        calls.append(1)
        norms = original(self)
        return {name: torch.full_like(norm, math.inf) for name, norm in norms.items()} if len(calls) == 3 else norms

    monkeypatch.setattr(TrainingStep, "_grad_norms", overflow_on_the_third)
    run = tmp_path / "run"
    Trainer(tiny_config(tiny_corpus, run, epochs=1, log_every=1, train_fraction=0.2)).fit()
    steps, (epoch,) = records(run, "step"), records(run, "epoch")
    assert math.isinf(steps[2]["grad_norm"]["layer0"])  # the step record says what happened
    finite = [step["grad_norm"]["layer0"] for step in steps if math.isfinite(step["grad_norm"]["layer0"])]
    assert len(finite) == len(steps) - 1
    assert epoch["grad_norm"]["layer0"] == pytest.approx(sum(finite) / len(finite), rel=1e-12)


def test_each_process_draws_its_own_masks_and_gets_its_own_stream_back():
    """Defect 6: under torchrun every process saved rank 0's generator and drew rank 0's dropout
    masks. Now each process is seeded apart after the weights are made, each one's state is saved,
    and each gets its own back."""
    import dataclasses as dc

    from charlm.runtime.distributed import World
    from charlm.training.resume import random_streams, restore_random_streams, seed_this_process

    @dc.dataclass(frozen=True)
    class TwoProcesses(World):
        others: tuple = ()

        def gather_objects(self, value):
            return [value, *self.others] if self.rank == 0 else [*self.others, value]

    draws = []
    for rank in (0, 1):
        torch.manual_seed(5)
        seed_this_process(5, World(rank, 2))
        draws.append(torch.rand(4))
    assert not torch.equal(draws[0], draws[1])
    torch.manual_seed(5)
    seed_this_process(5, World(0, 1))
    assert torch.equal(torch.rand(4), draws[0])  # one process: the stream of a single-process run

    torch.manual_seed(11)
    rank1_state = {"torch": torch.get_rng_state()}
    torch.manual_seed(3)
    saved = random_streams(TwoProcesses(0, 2, others=(rank1_state,)), torch.device("cpu"))
    assert len(saved["ranks"]) == 2
    restore_random_streams(saved, World(1, 2), torch.device("cpu"))
    torch.manual_seed(11)
    expected = torch.rand(3)
    restore_random_streams(saved, World(1, 2), torch.device("cpu"))
    assert torch.equal(torch.rand(3), expected)
    restore_random_streams(saved, World(0, 3), torch.device("cpu"))  # another world size: rank 0's stream
    first = torch.rand(3)
    torch.manual_seed(3)
    assert torch.equal(first, torch.rand(3))


def test_a_step_reads_back_from_the_device_once(monkeypatch):
    """Defect 8: the loss and every layer's gradient norm come back in one read (on a GPU, the one
    wait a step makes), not one ``.item()`` for the loss and one per layer group."""
    import numpy as np

    from charlm.corpora.streams import TokenStreams
    from charlm.model import LanguageModel, ModelConfig
    from charlm.runtime.distributed import World
    from charlm.training.control import StopRequest, TimeBudget
    from charlm.training.step import PlainGradients

    model = LanguageModel(ModelConfig("lstm", vocab_size=9, hidden_size=8, layers=2))
    step = TrainingStep(
        model,
        model,
        torch.optim.Adam(model.parameters()),
        PlainGradients(),
        World(),
        batch_size=3,
        clip=5.0,
        precision="fp32",
        device=torch.device("cpu"),
    )
    window = next(TokenStreams(np.random.default_rng(0).integers(9, size=100), 3, 6).windows())
    reads = []
    for name in ("item", "tolist"):
        original = getattr(torch.Tensor, name)
        monkeypatch.setattr(
            torch.Tensor,
            name,
            lambda self, _name=name, _original=original: (reads.append((_name, self)), _original(self))[1],
        )
    result = step(window, model.initial_state(3), StopRequest(), TimeBudget(None))
    adam_steps = [state["step"] for state in step.optimizer.state.values()]  # kept on the CPU by Adam, even on a GPU
    assert [name for name, tensor in reads if not any(tensor is kept for kept in adam_steps)] == ["tolist"]
    assert set(result.grad_norms) == set(model.layer_groups()) and math.isfinite(result.loss)


def test_a_checkpoint_holds_the_carried_state_and_not_the_window_it_was_cut_from(tiny_corpus, tmp_path):
    """A scan cell's state is the last step of its window's outputs, a view of them: saved as it is, it
    would carry the whole window into every checkpoint (10 MB for a 200k-parameter model)."""
    config = tiny_config(tiny_corpus, tmp_path / "run", cell="mingru", epochs=1, bptt=64, max_tokens=1024)
    Trainer(config).fit()  # stopped inside the epoch, by its token budget: last.pt carries the state
    hidden = torch.load(tmp_path / "run" / "last.pt", weights_only=True)["training"]["hidden"]
    tensors = [tensor for layer in hidden for tensor in layer]
    assert tensors and all(t.untyped_storage().nbytes() == t.numel() * t.element_size() for t in tensors)
