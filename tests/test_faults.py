"""Faults a real run meets: kill -9, a second training into the same directory, a damaged
checkpoint, a full disk, a crash-cut metrics line, a run killed before its first save."""

from __future__ import annotations

import errno
import json
import signal
import subprocess
import sys
import time

import pytest

import torch

import charlm.checkpoint
import charlm.training.reporting
from charlm.checkpoint import Checkpoint
from charlm.config import TrainConfig
from charlm.files import atomic_write
from charlm.cells import CELLS, RecurrentCell
from charlm.runtime.memory import MemoryEstimate, check_fits, estimate_training_memory
from charlm.runs.directory import Run
from charlm.training.trainer import Trainer
from helpers import assert_one_line_error, cli, records
from helpers import assert_same_run_end, tiny_config, tiny_train

SMALL_RUN = dict(  # tiny_train's settings but these (and the default learning rate)
    cell="gru", hidden_size=16, batch_size=2, bptt=8, log_every=1, eval_batch_size=8, train_fraction=0.3, lr=None
)


def wait_for(predicate, seconds=120.0):
    deadline = time.time() + seconds
    while time.time() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def checkpoint_events(run_dir):
    metrics = run_dir / "metrics.jsonl"
    if not metrics.exists():
        return []
    return records(run_dir, "checkpoint")


@pytest.mark.slow  # about 25 s: real kill -9s of a training process; the kill-at-every-write tests of
# tests/training/test_crash_consistency.py and the sweep kill -9 test stay in the default run
def test_kill_9_inside_an_epoch_loses_at_most_save_every_and_the_lock_dies_with_the_process(tiny_corpus, tmp_path):
    killed = tmp_path / "killed"
    args = tiny_train(tiny_corpus, killed, save_every=3, **SMALL_RUN)
    process = subprocess.Popen(
        [sys.executable, "-m", "charlm", *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert wait_for(lambda: len(checkpoint_events(killed)) >= 2), process.stderr.read() if process.poll() else ""
        assert Run(killed).status() == "running"  # `charlm runs` sees the lock its process holds
        # While it trains, the directory is its own: a second training, new or resumed, is refused.
        assert_one_line_error(cli(*args), "is in use by another training", f"pid {process.pid}")
        assert_one_line_error(cli("train", "--resume", killed), "is in use by another training")
        process.send_signal(signal.SIGKILL)
        process.communicate(timeout=60)
    finally:
        process.kill()
    assert Run(killed).status() == "interrupted"  # the kernel dropped the dead process's lock
    saved = Checkpoint.load(killed / "last.pt").training.progress
    assert saved["epoch"] == 0 and saved["window"] > 0 and saved["step"] % 3 == 0  # a mid-epoch save
    steps_recorded = max(row["step"] for row in records(killed, "step"))
    assert steps_recorded - saved["step"] < 3 + 1  # at most --save-every steps lost (one may be in flight)

    # both finish without saving every 3 steps (a save is not part of the arithmetic; it takes time)
    straight = {**SMALL_RUN, "save_every": 0, "log_every": 100}
    cli(*tiny_train(tiny_corpus, tmp_path / "straight", **straight), check_code=0)
    resumed = cli(
        "train", "--resume", killed, "--save-every", "0", "--log-every", "100", check_code=0
    )  # the dead process's lock does not block
    assert "Traceback" not in resumed.stderr
    assert_same_run_end(tmp_path / "straight", killed)


def test_save_every_minutes_and_zero(tiny_corpus, tmp_path):
    assert TrainConfig(corpus="tiny", save_every="5m").save_interval == ("seconds", 300.0)
    assert TrainConfig(corpus="tiny", save_every="90s").save_interval == ("seconds", 90.0)
    assert TrainConfig(corpus="tiny", save_every="250").save_interval == ("steps", 250)
    assert TrainConfig(corpus="tiny", save_every="0").save_interval is None
    run = tmp_path / "run"
    Trainer(tiny_config(tiny_corpus, run, epochs=1, save_every="0")).fit()
    assert checkpoint_events(run) == []


def test_unreadable_last_checkpoint_falls_back_to_the_previous_one(tiny_corpus, tmp_path):
    run = tmp_path / "run"
    Trainer(tiny_config(tiny_corpus, run, epochs=2)).fit()
    assert Checkpoint.load(run / "previous.pt").training.progress["epoch"] == 2  # the save before the final one
    data = (run / "last.pt").read_bytes()
    (run / "last.pt").write_bytes(data[: len(data) // 2])  # a disk that lost the end of the file
    (run / ".last.pt.k9x.tmp").write_bytes(b"half a checkpoint")  # what kill -9 inside a write leaves
    result = cli("train", "--resume", run, "--epochs", "3", check_code=0)
    assert f"warning: {run / 'last.pt'} is not a readable charlm checkpoint" in result.stderr
    assert f"resuming from {run / 'previous.pt'}" in result.stderr
    assert Checkpoint.load(run / "last.pt").training.progress["epoch"] == 3
    assert not list(run.glob(".*.tmp"))


def test_no_readable_checkpoint_at_all_is_one_line(tiny_corpus, tmp_path):
    run = tmp_path / "run"
    Trainer(tiny_config(tiny_corpus, run, epochs=1)).fit()
    for name in ("last.pt", "previous.pt", "best.pt"):
        if (run / name).exists():
            (run / name).write_bytes(b"garbage")
    assert_one_line_error(cli("train", "--resume", run), "no other checkpoint to resume from")


def test_full_disk_while_saving_stops_with_one_line_and_keeps_the_last_checkpoint(tiny_corpus, tmp_path, monkeypatch):
    real_write, calls = charlm.checkpoint.atomic_write_bytes, []

    def write_until_the_disk_fills(path, data):
        calls.append(path)
        if len(calls) < 3:  # last.pt and best.pt of epoch 1 fit; the next write finds the disk full
            return real_write(path, data)

        def write_100_bytes_of_it(temporary):
            temporary.write_bytes(bytes(data[:100]))
            raise OSError(errno.ENOSPC, "No space left on device", str(temporary))

        atomic_write(path, write_100_bytes_of_it)

    monkeypatch.setattr(charlm.checkpoint, "atomic_write_bytes", write_until_the_disk_fills)
    run = tmp_path / "run"
    result = cli(*tiny_train(tiny_corpus, run, hidden_size=16, epochs=3))
    assert_one_line_error(
        result,
        "training stopped: cannot write",
        "No space left on device",
        f"the last checkpoint {run / 'last.pt'} is intact",
        code=1,
    )
    monkeypatch.undo()
    assert Checkpoint.load(run / "last.pt").training.progress["epoch"] == 1
    assert not list(run.glob(".*.tmp"))
    assert not (run / "running.json").exists()
    cli("train", "--resume", run, "--epochs", "2", check_code=0)  # and the lock was released


def test_metrics_line_cut_short_by_a_crash_breaks_nothing(tiny_corpus, tmp_path):
    run = tmp_path / "run"
    Trainer(tiny_config(tiny_corpus, run, epochs=1)).fit()
    with (run / "metrics.jsonl").open("a", encoding="utf-8") as handle:
        handle.write('{"event": "step", "epoch": 2, "lo')  # the disk filled inside this line
    assert "finished" in cli("runs", tmp_path, check_code=0).stdout
    cli("train", "--resume", run, "--epochs", "2", check_code=0)
    lines = (run / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    assert lines.count('{"event": "step", "epoch": 2, "lo') == 1
    assert all(json.loads(line) for line in lines if not line.startswith('{"event": "step", "epoch": 2, "lo'))
    assert cli("runs", tmp_path, "--json", check_code=0).stdout.count('"status": "finished"') == 1


def test_run_killed_before_its_first_checkpoint_starts_again_on_resume(tiny_corpus, tmp_path):
    run = tmp_path / "run"
    trainer = Trainer(tiny_config(tiny_corpus, run, epochs=1))  # config.json written; then the process died
    trainer.run.record("start", parameters=1)
    trainer.run.release()
    result = cli("train", "--resume", run, check_code=0)
    assert "holds no checkpoint (the run stopped before its first save): starting it again" in result.stderr
    assert Checkpoint.load(run / "last.pt").training.progress["epoch"] == 1


def test_progress_lines_when_stderr_is_not_a_terminal(tiny_corpus, tmp_path, monkeypatch):
    monkeypatch.setattr(charlm.training.reporting, "STATUS_INTERVAL", 0.0)
    result = cli(*tiny_train(tiny_corpus, tmp_path / "run", epochs=1, **SMALL_RUN), check_code=0)
    lines = [line for line in result.stderr.splitlines() if line.startswith("epoch 1/1  window ")]
    assert len(lines) > 10 and "bpc" in lines[0] and "chars/s" in lines[0]


def test_every_built_in_cell_declares_the_activation_memory_it_keeps():
    factors = {name: CELLS.get(name).activation_factor for name in CELLS.names()}
    assert all(0 < factor < RecurrentCell.activation_factor for factor in factors.values()), factors
    assert factors["rnn"] < factors["lstm"] < factors["lru"] < factors["rhn"]  # more gates, more kept


def test_memory_estimate_covers_weights_optimizer_and_activations():
    estimate = estimate_training_memory(
        1_000_000,
        CELLS.get("lstm").activation_factor,
        hidden_size=256,
        layers=2,
        vocab_size=50,
        embed_size=256,
        batch_size=100,
        bptt=50,
    )
    assert estimate.state_bytes == 16_000_000
    assert estimate.activation_bytes == 100 * 50 * (2 * 256 * 4 * 15 + (256 + 4 * 50) * 4)
    check_fits(estimate, torch.device("cpu"), available=estimate.total_bytes)  # just fits
    try:
        check_fits(MemoryEstimate(10**9, 16 * 10**9, 10**9), torch.device("cpu"), available=8 * 1024**3)
    except charlm.errors.CharlmError as error:
        assert str(error).startswith("a model of 1,000,000,000 parameters needs about 15.8 GiB to train (14.9 GiB")
        assert "cpu has 8.0 GiB free" in str(error)
    else:
        raise AssertionError("a model over the memory available was not refused")


def test_a_run_stopped_while_scoring_test_gets_its_score_and_end_on_resume(tiny_corpus, tmp_path):
    """Killed after its last checkpoint but before the test score and the end record were written."""
    run = tmp_path / "run"
    Trainer(tiny_config(tiny_corpus, run, epochs=2)).fit()
    kept = [row for row in records(run) if row["event"] not in ("test", "end")]
    (run / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in kept), encoding="utf-8")
    last = Checkpoint.load(run / "last.pt")
    last.training.progress["best_test_bpc"] = None
    last.save(run / "last.pt")
    summary = Trainer.resume(run).fit()
    events = records(run)
    assert [row["event"] for row in events[-2:]] == ["test", "end"]
    assert summary["test_bpc_at_best"] == events[-2]["test_bpc"] and summary["epochs"] == 2
    assert Run(run).status() == "finished"


def test_with_cuda_graphs_the_estimate_counts_the_graph_pool():
    """Issue 21: --cuda-graph keeps one window's activations in the graphs' pool for the run; without
    it the estimate is unchanged."""
    sizes = dict(hidden_size=256, layers=2, vocab_size=50, embed_size=256, batch_size=100, bptt=50)
    eager = estimate_training_memory(1_000_000, 15, **sizes)
    assert eager.graph_bytes == 0
    graphed = estimate_training_memory(1_000_000, 15, **sizes, cuda_graph=True)
    assert graphed.graph_bytes == eager.activation_bytes
    assert graphed.total_bytes == eager.total_bytes + graphed.graph_bytes
    try:
        check_fits(graphed, torch.device("cuda"), available=eager.total_bytes)
    except charlm.errors.CharlmError as error:
        assert "held by the CUDA graphs" in str(error) and "workspaces" not in str(error)
    else:
        raise AssertionError("a run over the memory available was not refused")
