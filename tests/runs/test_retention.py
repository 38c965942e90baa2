"""What a run keeps on disk: best.pt without the optimizer's state, --keep-checkpoints N epoch
checkpoints named with their validation bpc, the disk column of `charlm runs`, and `--prune`."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
import torch

import charlm
from charlm.checkpoint import Checkpoint
from charlm.cli.runs import human_bytes
from charlm.runs.directory import Run
from charlm.runs.retention import epoch_checkpoint_name
from helpers import assert_one_line_error, cli, prepare_tiny_corpus, records


@pytest.fixture(scope="module")
def kept_run(tmp_path_factory) -> Path:
    """A tiny LRU trained for 3 short epochs with --keep-checkpoints 2. Tests copy it before changing it."""
    root = tmp_path_factory.mktemp("retention")
    prepare_tiny_corpus(root / "data", characters=8_000)
    charlm.train(
        charlm.TrainConfig(
            corpus="tiny",
            cell="lru",
            hidden_size=8,
            batch_size=8,
            bptt=16,
            epochs=3,
            lr=3e-3,
            train_fraction=0.25,
            eval_batch_size=4,
            save_every="0",
            keep_checkpoints=2,
            data_dir=str(root / "data"),
            run_dir=str(root / "run"),
        )
    )
    return root / "run"


def copy_of(run: Path, tmp_path: Path) -> Path:
    shutil.copytree(run, tmp_path / "run")
    return tmp_path / "run"


def files(run: Path) -> dict[str, int]:
    """Every file of a run directory and its size."""
    return {str(path.relative_to(run)): path.stat().st_size for path in sorted(run.rglob("*")) if path.is_file()}


def freed_bytes(stdout: str) -> int:
    """The exact total of the last line of `charlm runs --prune` (``freed 1.2K (1,234 bytes) in ...``)."""
    return int(stdout.strip().splitlines()[-1].split("(")[1].split(" bytes")[0].replace(",", ""))


# --- best.pt ---------------------------------------------------------------------------------------


def test_best_keeps_no_optimizer_state_and_scores_as_training_recorded(trained_run):
    best = torch.load(trained_run / "best.pt", weights_only=True)
    last = torch.load(trained_run / "last.pt", weights_only=True)
    assert best["training"]["optimizer"] is None and last["training"]["optimizer"]["state"]
    assert best["training"]["progress"]["epoch"] >= 1  # what a resumption from it needs besides the weights
    parameters = sum(tensor.numel() for tensor in best["weights"].values())
    assert (trained_run / "last.pt").stat().st_size - (
        trained_run / "best.pt"
    ).stat().st_size >= 2 * 4 * parameters  # Adam's two moments

    epochs = records(trained_run, "epoch")
    best_epoch = max(row["epoch"] for row in epochs if row["best"])
    recorded = next(row["valid_bpc"] for row in epochs if row["epoch"] == best_epoch)
    model = charlm.load(trained_run, device="cpu")
    assert model.checkpoint.path == trained_run / "best.pt"
    assert model.evaluate("valid", batch_size=4, record=False).bpc == pytest.approx(recorded, rel=1e-9)
    assert model.evaluate("test", batch_size=4, record=False).bpc == pytest.approx(best["scores"]["test_bpc"], rel=1e-9)


def test_resume_falls_back_to_best_with_a_fresh_optimizer(kept_run, tmp_path):
    run = copy_of(kept_run, tmp_path)
    (run / "last.pt").write_bytes(b"garbage")
    (run / "previous.pt").write_bytes(b"garbage")
    assert Checkpoint.load(run / "best.pt").scores["epoch"] == 3
    result = cli("train", "--resume", run, "--epochs", "4", check_code=0)
    assert (
        f"resuming from {run / 'best.pt'} (it keeps no optimizer state: the optimizer starts afresh)" in result.stderr
    )
    resumed = Checkpoint.load(run / "last.pt").training
    assert resumed.progress["epoch"] == 4 and resumed.optimizer["state"]
    fourth = records(run, "epoch")[-1]  # trained at the rate the schedule had reached: 3e-3 · 0.9³
    assert fourth["epoch"] == 4 and fourth["lr"] == pytest.approx(3e-3 * 0.9**3, rel=1e-12)


# --- epoch checkpoints -------------------------------------------------------------------------------


def test_keep_checkpoints_2_over_3_epochs_leaves_the_two_latest_named_by_valid_bpc(kept_run):
    valid = {row["epoch"]: row["valid_bpc"] for row in records(kept_run, "epoch")}
    assert sorted(valid) == [1, 2, 3]
    named = sorted(path.name for path in kept_run.glob("epoch*.pt"))
    assert named == [f"epoch02-valid{valid[2]:.4f}.pt", f"epoch03-valid{valid[3]:.4f}.pt"]
    third = Checkpoint.load(kept_run / named[1])
    assert third.training.optimizer is None and third.scores["epoch"] == 3
    assert third.scores["valid_bpc"] == pytest.approx(valid[3], rel=1e-12)
    last = Checkpoint.load(kept_run / "last.pt")
    assert all(torch.equal(third.weights[name], last.weights[name]) for name in last.weights)  # the end of epoch 3


def test_epoch_checkpoint_names():
    assert epoch_checkpoint_name(3, 1.84204, 3.58, "char") == "epoch03-valid1.8420.pt"
    assert epoch_checkpoint_name(12, 1.5, 2.8, "subword") == "epoch12-valid1.5000.pt"
    assert epoch_checkpoint_name(3, 1.3, 141.2749, "word") == "epoch03-ppl141.27.pt"  # perplexity per word
    assert epoch_checkpoint_name(123, 0.9, 1.0, "byte") == "epoch123-valid0.9000.pt"


# --- charlm runs: the disk column ---------------------------------------------------------------------


def test_runs_shows_the_disk_each_run_uses(kept_run, monkeypatch):
    from charlm.cli import output

    total = sum(files(kept_run).values())
    [row] = json.loads(cli("runs", kept_run, "--json", check_code=0).stdout)
    assert row["disk_bytes"] == total
    plain = cli("runs", kept_run, "--plain", check_code=0).stdout.splitlines()
    assert dict(zip(plain[0].split("\t"), plain[1].split("\t")))["disk"] == human_bytes(total)
    monkeypatch.setattr(output.stdout, "width", 300)
    assert f"│ {human_bytes(total)}" in cli("runs", kept_run, check_code=0).stdout
    monkeypatch.setattr(output.stdout, "width", 120)
    header = [line for line in cli("runs", kept_run, check_code=0).stdout.splitlines() if line.startswith("┃")][0]
    assert "disk" not in header and "valid bpc" in header  # the first column to go


def test_human_bytes():
    assert [human_bytes(n) for n in (0, 512, 1023, 1024, 12_900_000, 3 * 1024**3)] == [
        "0B",
        "512B",
        "1023B",
        "1.0K",
        "12.3M",
        "3.0G",
    ]


# --- charlm runs --prune -------------------------------------------------------------------------------


def test_prune_frees_exactly_what_it_says_and_the_run_still_resumes(kept_run, tmp_path):
    run = copy_of(kept_run, tmp_path)
    best, last = Checkpoint.load(run / "best.pt"), Checkpoint.load(run / "last.pt")
    dataclasses.replace(best, training=last.training).save(run / "best.pt")  # as charlm wrote best.pt before
    shutil.copy(next(run.glob("epoch02-*.pt")), run / "epoch01-valid9.9999.pt")  # one a lower --keep left behind
    (run / ".last.pt.k9x.tmp").write_bytes(b"half a checkpoint")
    before = files(run)
    epoch02, epoch03 = (next(name for name in before if name.startswith(prefix)) for prefix in ("epoch02", "epoch03"))
    removed = before["previous.pt"] + before[".last.pt.k9x.tmp"] + before["epoch01-valid9.9999.pt"] + before[epoch02]

    dry = cli("runs", run, "--prune", "--keep", "1", "--dry-run", check_code=0)
    assert files(run) == before
    assert f"would remove {run / 'previous.pt'}" in dry.stdout and "would free" in dry.stdout

    done = cli("runs", run, "--prune", "--keep", "1", check_code=0)
    after = files(run)
    assert sorted(after) == [
        "best.pt",
        "config.json",
        epoch03,
        "last.pt",
        "lock",
        "metrics.jsonl",
        "provenance.json",
        "train.log",
    ]
    slimmed = before["best.pt"] - after["best.pt"]
    assert slimmed >= 2 * 4 * sum(tensor.numel() for tensor in best.weights.values())  # Adam's two moments
    assert (
        freed_bytes(done.stdout)
        == removed + slimmed
        == sum(before.values()) - sum(after.values())
        == freed_bytes(dry.stdout)
    )
    assert f"rewrote {run / 'best.pt'} without its optimizer state" in done.stdout and "in 1 of 1 run(s)" in done.stdout
    pruned = Checkpoint.load(run / "best.pt")
    assert pruned.training.optimizer is None and all(
        torch.equal(pruned.weights[k], best.weights[k]) for k in best.weights
    )
    assert freed_bytes(cli("runs", run, "--prune", check_code=0).stdout) == 0  # nothing left to free

    cli("train", "--resume", run, "--epochs", "4", "--keep-checkpoints", "1", check_code=0)
    assert Checkpoint.load(run / "last.pt").training.progress["epoch"] == 4
    valid = records(run, "epoch")[-1]["valid_bpc"]
    assert [path.name for path in run.glob("epoch*.pt")] == [f"epoch04-valid{valid:.4f}.pt"]


def test_prune_keeps_previous_when_last_cannot_be_read(kept_run, tmp_path):
    run = copy_of(kept_run, tmp_path)
    data = (run / "last.pt").read_bytes()
    (run / "last.pt").write_bytes(data[: len(data) // 2])
    result = cli("runs", run, "--prune", check_code=0)
    assert f"{run}: kept previous.pt: last.pt cannot be read" in result.stdout
    assert (run / "previous.pt").exists() and freed_bytes(result.stdout) == 0


def test_prune_leaves_a_run_being_trained_alone(kept_run, tmp_path):
    run = copy_of(kept_run, tmp_path)
    before = {name: (run / name).read_bytes() for name in files(run)}
    training = Run(run)
    training.acquire()  # as a training process holds its run directory's lock
    try:
        result = cli("runs", tmp_path, "--prune", check_code=0)
    finally:
        training.release()
    holder = (run / "lock").read_text(encoding="utf-8").strip()
    assert f"skipped {run}: a training holds it ({holder}); nothing touched" in result.stdout
    assert "in 0 of 1 run(s); 1 skipped: being trained" in result.stdout
    assert {name: (run / name).read_bytes() for name in files(run)} == before


@pytest.mark.parametrize(
    "arguments, message",
    [
        (["--dry-run"], "--dry-run goes with --prune"),
        (["--keep", "1"], "--keep goes with --prune"),
        (["--prune", "--json"], "--json lists runs; --prune prints what it frees"),
        (["--prune", "--keep", "-1"], "--keep must be zero or positive, not -1"),
    ],
)
def test_prune_option_errors(kept_run, arguments, message):
    assert_one_line_error(cli("runs", kept_run, *arguments), message)


def test_keep_checkpoints_must_not_be_negative():
    assert_one_line_error(
        cli("train", "--corpus", "tiny", "--keep-checkpoints", "-1"),
        "--keep-checkpoints must be zero or positive, not -1",
    )
