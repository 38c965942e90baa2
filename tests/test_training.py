"""Training protocol: resume equivalence, Ctrl-C, divergence, checkpoints and metrics, errors."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest
import torch

from charlm.checkpoints import load_checkpoint
from charlm.config import TrainConfig
from charlm.training import Trainer, resume_training
from helpers import assert_one_line_error, prepare_tiny_corpus, run_cli


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("corpus") / "data"
    prepare_tiny_corpus(data_dir)
    return data_dir


def tiny_config(corpus_dir, run_dir, **overrides) -> TrainConfig:
    settings = dict(corpus="tiny", cell="lstm", hidden=24, batch_size=8, bptt=16, epochs=2, log_every=5,
                    eval_batch_size=4, data_dir=str(corpus_dir), run_dir=str(run_dir))
    settings.update(overrides)
    return TrainConfig(**settings)


def weights(run_dir, name="last.pt"):
    return load_checkpoint(run_dir / name)["model"]


def assert_same_weights(a, b):
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


@pytest.mark.parametrize("cell", ["lstm", "lru"])
def test_resume_after_one_epoch_equals_straight_run(corpus_dir, tmp_path, cell):
    straight = tmp_path / "straight"
    Trainer(tiny_config(corpus_dir, straight, cell=cell)).fit()

    split = tmp_path / "split"
    Trainer(tiny_config(corpus_dir, split, cell=cell, epochs=1)).fit()
    assert load_checkpoint(split / "last.pt")["progress"]["epoch"] == 1
    resume_training(str(split), epochs=2).fit()
    assert_same_weights(weights(straight), weights(split))


def test_run_directory_holds_config_metrics_log_and_checkpoints(corpus_dir, tmp_path):
    run = tmp_path / "run"
    summary = Trainer(tiny_config(corpus_dir, run)).fit()
    for name in ("config.json", "metrics.jsonl", "train.log", "last.pt", "best.pt"):
        assert (run / name).is_file(), name
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    epochs = [row for row in rows if row["event"] == "epoch"]
    assert [row["epoch"] for row in epochs] == [1, 2]
    for key in ("train_loss", "train_bits", "valid_loss", "valid_bpc", "test_loss", "test_bpc", "lr", "chars_per_second", "train_seconds"):
        assert all(key in row for row in epochs), key
    assert set(epochs[0]["grad_norm"]) == {"embedding", "layer0", "softmax"}
    assert epochs[1]["lr"] == pytest.approx(1e-3 * 0.9)
    assert any(row["event"] == "step" for row in rows)
    best = load_checkpoint(run / "best.pt")
    assert best["valid_bpc"] == pytest.approx(min(row["valid_bpc"] for row in epochs))
    assert summary["best_valid_bpc"] == pytest.approx(best["valid_bpc"])
    assert summary["test_bpc_at_best"] == pytest.approx(best["test_bpc"])
    payload = torch.load(run / "last.pt", weights_only=True)  # plain tensors and containers only
    assert payload["tokenizer"]["vocab"] and payload["progress"]["finished"]


def test_train_fraction_uses_leading_part(corpus_dir, tmp_path):
    full = Trainer(tiny_config(corpus_dir, tmp_path / "full", epochs=1))
    fifth = Trainer(tiny_config(corpus_dir, tmp_path / "fifth", epochs=1, train_fraction=0.2))
    assert fifth.train_streams.num_windows < full.train_streams.num_windows / 4


def test_params_budget_chooses_hidden_size(corpus_dir, tmp_path):
    trainer = Trainer(tiny_config(corpus_dir, tmp_path / "budget", hidden=None, params="20k", cell="gru", epochs=1))
    total = sum(p.numel() for p in trainer.model.parameters())
    assert abs(total - 20_000) < 0.05 * 20_000


def test_interrupt_then_resume_equals_straight_run(corpus_dir, tmp_path):
    args = ["train", "--corpus", "tiny", "--cell", "gru", "--hidden", "16", "--batch-size", "2", "--bptt", "8",
            "--epochs", "2", "--log-every", "1", "--eval-batch-size", "8", "--train-fraction", "0.3", "--data-dir", corpus_dir]
    run_cli(*args, "--run-dir", tmp_path / "straight", check_code=0)

    interrupted = tmp_path / "interrupted"
    process = subprocess.Popen([sys.executable, "-m", "charlm", *map(str, args), "--run-dir", str(interrupted)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    metrics = interrupted / "metrics.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and not (metrics.exists() and '"event": "step"' in metrics.read_text()):
        time.sleep(0.05)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 130, stderr
    assert "Traceback" not in stderr and "interrupted: saved" in stderr
    progress = load_checkpoint(interrupted / "last.pt")["progress"]
    assert progress["epoch"] == 0 and progress["window"] > 0  # stopped inside the first epoch

    run_cli("train", "--resume", interrupted, check_code=0)
    assert_same_weights(weights(tmp_path / "straight"), weights(interrupted))


def test_divergence_stops_and_keeps_last_good_checkpoint(corpus_dir, tmp_path):
    run = tmp_path / "diverging"
    result = run_cli("train", "--corpus", "tiny", "--cell", "lstm", "--hidden", "16", "--batch-size", "8",
                     "--epochs", "3", "--lr-decay", "1e38", "--clip", "0", "--data-dir", corpus_dir, "--run-dir", run)
    assert_one_line_error(result, "training stopped: loss became", "kept the last good checkpoint", code=3)
    kept = load_checkpoint(run / "last.pt")
    assert kept["progress"]["epoch"] == 1
    assert all(torch.isfinite(tensor).all() for tensor in kept["model"].values())


def test_existing_run_directory_is_not_overwritten(corpus_dir, tmp_path):
    run = tmp_path / "run"
    Trainer(tiny_config(corpus_dir, run, epochs=1)).fit()
    result = run_cli("train", "--corpus", "tiny", "--data-dir", corpus_dir, "--run-dir", run)
    assert_one_line_error(result, "already holds a run", "--resume")


@pytest.mark.parametrize(
    "extra, fragments",
    [
        (["--cell", "no-such-cell"], ["unknown cell 'no-such-cell'"]),
        (["--batch-size", "0"], ["--batch-size must be at least 1"]),
        (["--hidden", "8", "--params", "1M"], ["not both"]),
        (["--train-fraction", "1.5"], ["--train-fraction"]),
        (["--cell", "lstm", "--cell-opt", "peephole=maybe"], ["peephole"]),
        (["--cell", "lstm", "--cell-opt", "nonsense=1"], ["has no option 'nonsense'"]),
        (["--params", "lots"], ["parameter budget 'lots'"]),
        (["--device", "cuda"] if not torch.cuda.is_available() else ["--device", "tpu"], ["not available" if not torch.cuda.is_available() else "tpu"]),
        (["--cell", "os.path:join"], ["not a subclass"]),
        (["--cell", "no_such_module_xyz:Cell"], ["cannot import"]),
    ],
)
def test_bad_training_input_is_one_line_error(corpus_dir, tmp_path, extra, fragments):
    result = run_cli("train", "--corpus", "tiny", "--data-dir", corpus_dir, "--run-dir", tmp_path / "r", "--epochs", "1", *extra)
    assert_one_line_error(result, *fragments)
    assert not (tmp_path / "r" / "last.pt").exists()


def test_missing_corpus_says_which_prepare_to_run(tmp_path):
    result = run_cli("train", "--corpus", "wp", "--data-dir", tmp_path / "empty", "--run-dir", tmp_path / "r")
    assert_one_line_error(result, "charlm prepare wp")


def test_config_file_sets_options_and_command_line_wins(corpus_dir, tmp_path):
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"cell": "lstm", "hidden": 12, "epochs": 1, "batch_size": 8, "cell_options": {"peephole": True}}))
    run = tmp_path / "run"
    run_cli("train", "--config", config, "--corpus", "tiny", "--hidden", "10", "--data-dir", corpus_dir, "--run-dir", run, check_code=0)
    payload = load_checkpoint(run / "last.pt")
    assert payload["model_config"]["hidden_size"] == 10
    assert payload["model_config"]["cell_options"] == {"peephole": True}
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert_one_line_error(run_cli("train", "--config", bad), "not valid JSON")


def test_init_from_starts_from_checkpoint_weights(corpus_dir, tmp_path):
    source = tmp_path / "source"
    Trainer(tiny_config(corpus_dir, source, epochs=1)).fit()
    tuned = Trainer(tiny_config(corpus_dir, tmp_path / "tuned", epochs=1, init_from=str(source / "best.pt")))
    assert_same_weights(tuned.model.state_dict(), weights(source, "best.pt"))
    result = run_cli("train", "--corpus", "tiny", "--hidden", "30", "--init-from", source / "best.pt",
                     "--data-dir", corpus_dir, "--run-dir", tmp_path / "mismatch")
    assert_one_line_error(result, "--init-from", "differs")


def test_max_minutes_stops_with_a_resumable_evaluated_run(corpus_dir, tmp_path):
    run = tmp_path / "timed"
    summary = Trainer(tiny_config(corpus_dir, run, epochs=5, max_minutes=0.0005)).fit()
    assert summary["epochs"] == 0 and summary["best_epoch"] == 1  # a partial first epoch, evaluated
    progress = load_checkpoint(run / "last.pt")["progress"]
    assert 0 < progress["window"] and progress["epoch"] == 0
    resume_training(str(run), epochs=1).fit()
    assert load_checkpoint(run / "last.pt")["progress"]["epoch"] == 1
