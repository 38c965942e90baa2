"""Training across processes with torchrun (DistributedDataParallel, gloo on the CPU).

The same global batch split over 2 processes must give the weights of 1 process (float64, to
1e-10), checkpoints must resume on another number of processes, and only rank 0 writes the run.
Each torchrun launch starts 2 Python processes: the models are tiny and the runs short.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from charlm.checkpoint import Checkpoint
from charlm.config import TrainConfig
from charlm.runtime.distributed import World
from charlm.training.trainer import Trainer
from helpers import records

WORKER = Path(__file__).with_name("distributed_train.py")
TOLERANCE = 1e-10


def settings(corpus_dir, run_dir, **changes) -> dict:
    # 5 streams over 2 processes (shares 3 and 2), 3 evaluation streams (2 and 1): uneven on purpose
    values = dict(
        corpus="tiny",
        cell="gru",
        hidden_size=12,
        batch_size=5,
        bptt=10,
        epochs=2,
        train_fraction=0.08,
        eval_batch_size=3,
        log_every=5,
        save_every="0",
        device="cpu",
        data_dir=str(corpus_dir),
        run_dir=str(run_dir),
    )
    values.update(changes)
    return values


def torchrun(processes: int, values: dict) -> subprocess.CompletedProcess:
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        str(processes),
        str(WORKER),
        json.dumps(values),
    ]
    environment = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(command, capture_output=True, text=True, env=environment, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


@pytest.fixture(scope="module")
def one_process(tiny_corpus, tmp_path_factory) -> Path:
    """The reference: 2 epochs in this process, float64."""
    run = tmp_path_factory.mktemp("one-process") / "run"
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        Trainer(TrainConfig(**settings(tiny_corpus, run))).fit()
    finally:
        torch.set_default_dtype(previous)
    return run


def largest_difference(run_a: Path, run_b: Path) -> float:
    a, b = Checkpoint.load(run_a / "last.pt"), Checkpoint.load(run_b / "last.pt")
    assert a.weights.keys() == b.weights.keys()
    assert all(value.dtype == torch.float64 for value in a.weights.values())
    return max((a.weights[key] - b.weights[key]).abs().max().item() for key in a.weights)


def test_shares_are_contiguous_and_cover_every_stream():
    for size in (1, 2, 3, 4):
        for count in (1, 5, 9, 250):
            if count < size:
                continue
            world_shares = [World(rank, size).share(count) for rank in range(size)]
            rows = [row for share in world_shares for row in range(count)[share]]
            assert rows == list(range(count))
            assert max(s.stop - s.start for s in world_shares) - min(s.stop - s.start for s in world_shares) <= 1


def test_a_batch_smaller_than_the_processes_is_refused():
    from charlm.errors import ConfigError
    from charlm.training.setup import check_streams_per_process

    check_streams_per_process(TrainConfig(corpus="tiny", batch_size=2, eval_batch_size=2), World(1, 2))  # one each
    with pytest.raises(ConfigError, match="batch_size is 3, fewer streams than the 4 processes") as raised:
        check_streams_per_process(TrainConfig(corpus="tiny", batch_size=3, eval_batch_size=8), World(0, 4))
    assert raised.value.field == "batch_size"
    with pytest.raises(ConfigError, match="eval_batch_size is 2, fewer streams than the 4 processes"):
        check_streams_per_process(TrainConfig(corpus="tiny", batch_size=8, eval_batch_size=2), World(3, 4))


def test_two_processes_train_the_weights_of_one(tiny_corpus, tmp_path, one_process):
    run = tmp_path / "two"
    torchrun(2, settings(tiny_corpus, run))
    assert largest_difference(one_process, run) < TOLERANCE
    ours, reference = Checkpoint.load(run / "best.pt"), Checkpoint.load(one_process / "best.pt")
    assert abs(ours.scores["valid_bpc"] - reference.scores["valid_bpc"]) < TOLERANCE
    assert abs(ours.scores["test_bpc"] - reference.scores["test_bpc"]) < TOLERANCE
    events = [row["event"] for row in records(run)]
    assert events.count("start") == 1 and events.count("end") == 1 and events.count("epoch") == 2  # rank 0 alone wrote
    assert len((run / "train.log").read_text().splitlines()) == len(
        (one_process / "train.log").read_text().splitlines()
    )


@pytest.mark.slow  # about 30 s or more on 2 cores: `pytest -m slow`
def test_a_run_resumes_on_another_number_of_processes(tiny_corpus, tmp_path, one_process, double_precision):
    two_then_one = tmp_path / "two-then-one"
    torchrun(2, settings(tiny_corpus, two_then_one, epochs=1))
    Trainer.resume(two_then_one, epochs=2).fit()
    assert largest_difference(one_process, two_then_one) < TOLERANCE

    one_then_two = tmp_path / "one-then-two"
    Trainer(TrainConfig(**settings(tiny_corpus, one_then_two, epochs=1))).fit()
    torchrun(2, {"resume": str(one_then_two), "epochs": 2})
    assert largest_difference(one_process, one_then_two) < TOLERANCE


@pytest.mark.slow  # about 17 s under torchrun; test_two_processes_train_the_weights_of_one stays in the default run
def test_a_mid_epoch_checkpoint_holds_every_streams_state(tiny_corpus, tmp_path, one_process, double_precision):
    """Stopped by the time budget inside an epoch on 2 processes, resumed on 1: the carried state of
    all 5 streams was gathered into the checkpoint and the run ends where the reference does."""
    run = tmp_path / "mid-epoch"
    torchrun(2, settings(tiny_corpus, run, max_minutes=1e-6))
    stopped = Checkpoint.load(run / "last.pt")
    assert stopped.training.progress["window"] > 0
    assert [tuple(t.shape[0] for t in layer) for layer in stopped.training.hidden] == [(5,)]
    Trainer.resume(run).fit()
    assert largest_difference(one_process, run) < TOLERANCE


def _worker_of_rank(parent_pid: int, rank: int) -> int | None:
    """The pid of the torchrun worker with RANK=rank (a child of torchrun's agent)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            environment = (entry / "environ").read_bytes().split(b"\0")
        except (OSError, IndexError, ValueError):
            continue
        if parent == parent_pid and f"RANK={rank}".encode() in environment:
            return int(entry.name)
    return None


@pytest.mark.slow  # about 30 s or more on 2 cores: `pytest -m slow`
@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="finds the worker through /proc")
def test_a_killed_process_stops_the_attempt_and_torchrun_restarts_it_from_the_checkpoint(tiny_corpus, tmp_path):
    """SIGKILL of rank 1: rank 0 stops with one line naming the intact checkpoint; torchrun
    --max-restarts 1 reruns the command, which goes on from that checkpoint to the end."""
    run = tmp_path / "killed"
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        "--max-restarts",
        "1",
        "-m",
        "charlm",
        "train",
        "--corpus",
        "tiny",
        "--data-dir",
        str(tiny_corpus),
        "--cell",
        "gru",
        "--hidden",
        "16",
        "--batch-size",
        "4",
        "--bptt",
        "10",
        "--epochs",
        "2",
        "--train-fraction",
        "0.3",
        "--save-every",
        "5",
        "--device",
        "cpu",
        "--run-dir",
        str(run),
    ]
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}
    )
    try:
        deadline = time.monotonic() + 120
        while not (run / "last.pt").exists() and time.monotonic() < deadline and process.poll() is None:
            time.sleep(0.2)
        assert (run / "last.pt").exists(), process.stderr.read() if process.poll() is not None else "no save"
        worker = _worker_of_rank(process.pid, 1)
        assert worker is not None
        os.kill(worker, signal.SIGKILL)
        _, stderr = process.communicate(timeout=240)
    finally:
        if process.poll() is None:
            process.kill()
    assert "charlm: error: training stopped: a process of this training failed or was lost" in stderr
    assert "the last checkpoint" in stderr and "is intact" in stderr
    assert process.returncode == 0, stderr[-3000:]
    starts = records(run, "start")
    assert len(starts) == 2 and starts[1]["resumed_at"] != {"epoch": 0, "window": 0}  # from the checkpoint
    assert Checkpoint.load(run / "last.pt").training.progress["epoch"] == 2


@pytest.mark.slow  # about 30 s or more on 2 cores: `pytest -m slow`
def test_bench_under_torchrun_reports_scaling(tmp_path):
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        "-m",
        "charlm",
        "bench",
        "--cells",
        "gru",
        "--params",
        "20k",
        "--batch-size",
        "9",
        "--bptt",
        "5",
        "--steps",
        "1",
        "--repeat",
        "2",
        "--device",
        "cpu",
        "--json",
    ]
    result = subprocess.run(
        command, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout)  # rank 0 alone printed
    assert report["processes"] == 2
    assert [row["name"] for row in report["results"]] == ["torch.nn.LSTM (fused)", "gru"]
    for row in report["results"]:
        assert row["allreduce_bytes_per_step"] == 4 * row["parameters"]
        assert len(row["together_chars_per_second"]["runs"]) == 2 and row["single_chars_per_second"]["median"] > 0
        assert row["efficiency"] == pytest.approx(row["speedup"] / 2)


def test_a_sweep_under_torchrun_is_refused(monkeypatch, tmp_path):
    from helpers import assert_one_line_error, cli

    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    result = cli("sweep", "lru-table1", "--profile", "small", "--dir", str(tmp_path / "sweep"))
    assert_one_line_error(result, "charlm sweep runs its points in one process")
    assert not (tmp_path / "sweep").exists()


def test_a_restarted_command_goes_on_with_its_run(tiny_corpus, tmp_path, monkeypatch):
    """torchrun --max-restarts reruns the same command line with TORCHELASTIC_RESTART_COUNT > 0:
    charlm then continues the run in its --run-dir instead of refusing the existing directory."""
    from helpers import cli

    run = tmp_path / "restarted"
    command = [
        "train",
        "--corpus",
        "tiny",
        "--data-dir",
        str(tiny_corpus),
        "--cell",
        "gru",
        "--hidden",
        "12",
        "--batch-size",
        "4",
        "--bptt",
        "10",
        "--train-fraction",
        "0.1",
        "--device",
        "cpu",
        "--run-dir",
        str(run),
    ]
    assert cli(*command, "--epochs", "1").returncode == 0
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    result = cli(*command, "--epochs", "2")
    assert result.returncode == 0, result.stderr
    starts = records(run, "start")
    assert len(starts) == 2 and starts[1]["resumed_at"]["epoch"] == 1
    assert Checkpoint.load(run / "last.pt").training.progress["epoch"] == 2
    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT")
    refused = cli(*command, "--epochs", "3")  # not a restart: the directory holds a run
    assert refused.returncode == 2 and "already holds a run" in refused.stderr
