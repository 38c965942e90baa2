"""Run directories: `charlm runs` (statuses, sorting, JSON), provenance, and metrics.jsonl records."""

from __future__ import annotations

import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch

import charlm
from charlm.checkpoint import Checkpoint
from charlm.runs.directory import Run
from charlm.training.trainer import Trainer, TrainingDiverged, TrainingInterrupted
from helpers import (
    assert_fits,
    assert_one_line_error,
    cli,
    prepare_tiny_corpus,
    records,
    run_cli,
    table_header,
    tiny_train,
)

PROVENANCE_KEYS = {
    "command",
    "charlm_version",
    "git_commit",
    "python",
    "torch",
    "cuda",
    "device",
    "device_name",
    "threads",
    "host",
    "pid",
    "corpus",
    "corpus_fingerprint",
    "started",
}


def small_config(data_dir, run_dir, **changes) -> charlm.TrainConfig:
    values = dict(
        corpus="tiny",
        cell="lru",
        hidden_size=16,
        batch_size=8,
        bptt=16,
        eval_batch_size=4,
        epochs=1,
        lr=3e-3,
        data_dir=str(data_dir),
        run_dir=str(run_dir),
    )
    return charlm.TrainConfig(**{**values, **changes})


class InterruptAtFirstStep:
    """A sink that sends this process SIGINT when the first step record arrives (a Ctrl-C)."""

    def __init__(self):
        self.sent = False

    def write(self, event, fields):
        if event == "step" and not self.sent:
            self.sent = True
            signal.raise_signal(signal.SIGINT)

    def close(self):
        pass


def append_records(run, *records):
    with (run / "metrics.jsonl").open("a", encoding="utf-8") as handle:
        for record in records:
            handle.write(json.dumps({"time": time.time(), **record}) + "\n")


def dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


@pytest.fixture(scope="module")
def runs_root(tmp_path_factory):
    """Runs in every state under one directory: finished (1 and 2 epochs), interrupted by Ctrl-C,
    crashed (stale running.json), diverged, and running (its lock held by a live process)."""
    root = tmp_path_factory.mktemp("runs-root")
    data_dir = root / "data"
    prepare_tiny_corpus(data_dir, characters=8_000)
    runs = root / "runs"
    charlm.train(small_config(data_dir, runs / "finished"))
    shutil.copytree(runs / "finished", runs / "longer")
    Trainer.resume(runs / "longer", epochs=2).fit()
    cli("eval", runs / "longer", "--dynamic", "sgd", check_code=0)  # recorded: `runs` shows the figure

    trainer = Trainer(small_config(data_dir, runs / "interrupted", log_every=1))
    trainer.run.sinks.append(InterruptAtFirstStep())
    with pytest.raises(TrainingInterrupted):
        trainer.fit()

    trainer = Trainer(small_config(data_dir, runs / "diverged"))
    with torch.no_grad():
        trainer.model.head.weight.fill_(float("nan"))
    with pytest.raises(TrainingDiverged):
        trainer.fit()

    shutil.copytree(runs / "finished", runs / "crashed")  # a resumption killed before it could record anything
    append_records(runs / "crashed", {"event": "start", "parameters": 1, "resumed_at": {"epoch": 1, "window": 0}})
    (runs / "crashed" / "running.json").write_text(json.dumps({"pid": dead_pid(), "host": platform.node(), "since": 0}))

    shutil.copytree(runs / "finished", runs / "running")
    append_records(runs / "running", {"event": "start", "parameters": 1, "resumed_at": {"epoch": 1, "window": 0}})
    (runs / "running" / "running.json").write_text(
        json.dumps({"pid": os.getpid(), "host": platform.node(), "since": 0})
    )
    training = Run(runs / "running")
    training.acquire()  # as a training process holds its run directory's lock
    HELD_LOCKS.append(training)
    return root


HELD_LOCKS = []  # run directories whose lock this test process holds for the module's tests


STATUSES = {
    "finished": "finished",
    "longer": "finished",
    "interrupted": "interrupted",
    "crashed": "interrupted",
    "diverged": "diverged",
    "running": "running",
}


def table_rows(stdout: str) -> list[list[str]]:
    return [[cell.strip() for cell in line.split("│")[1:-1]] for line in stdout.splitlines() if line.startswith("│")]


def test_runs_table_shows_every_status(runs_root, monkeypatch):
    monkeypatch.chdir(runs_root / "runs")
    result = cli("runs", ".", check_code=0)
    assert "6 run(s) in ." in result.stdout
    header = [line for line in result.stdout.splitlines() if line.startswith("┃")][0]
    columns = [cell.strip() for cell in header.split("┃")[1:-1]]
    rows = {row[0]: dict(zip(columns, row)) for row in table_rows(result.stdout)}
    assert {name: row["status"] for name, row in rows.items()} == STATUSES
    finished = Checkpoint.load(runs_root / "runs" / "finished")
    assert rows["finished"]["test bpc"] == f"{finished.scores['test_bpc']:.4f}"
    assert (
        rows["finished"]["size"] == "1×16" and rows["finished"]["cell"] == "lru" and rows["finished"]["epochs"] == "1"
    )
    assert rows["longer"]["epochs"] == "2" and rows["longer"]["dynamic bpc"].startswith("sgd test ")
    assert rows["diverged"]["test bpc"] == "-" and rows["interrupted"]["epochs"] == "0"


def test_runs_json(runs_root):
    result = cli("runs", runs_root / "runs", "--json", check_code=0)
    rows = {os.path.basename(row["run"]): row for row in json.loads(result.stdout)}
    assert {name: row["status"] for name, row in rows.items()} == STATUSES
    meta = json.loads((runs_root / "data" / "tiny" / "meta.json").read_text(encoding="utf-8"))
    for name, row in rows.items():
        assert PROVENANCE_KEYS <= set(row["provenance"]), name
        assert row["provenance"]["corpus_fingerprint"] == meta["fingerprint"]
    longer = Checkpoint.load(runs_root / "runs" / "longer")
    assert rows["longer"]["test_bpc"] == longer.scores["test_bpc"] and rows["longer"]["best_epoch"] == 2
    assert rows["longer"]["best_valid_bpc"] == longer.scores["valid_bpc"]
    assert "resumed" in rows["longer"]["provenance"]
    [(label, dynamic_bpc)] = rows["longer"]["dynamic"].items()
    assert label == "sgd test" and 0 < dynamic_bpc < 10
    assert rows["diverged"]["test_bpc"] is None and rows["diverged"]["parameters"] > 0
    assert rows["finished"]["train_seconds"] > 0


@pytest.mark.parametrize("reverse", [False, True])
def test_runs_sort_by_test_bpc(runs_root, monkeypatch, reverse):
    monkeypatch.chdir(runs_root / "runs")
    flags = ("--sort", "test") + (("--reverse",) if reverse else ())
    rows = json.loads(cli("runs", ".", "--json", *flags, check_code=0).stdout)
    values = [row["test_bpc"] for row in rows]
    scored = [value for value in values if value is not None]
    assert len(set(scored)) >= 2 and values[len(scored) :] == [None] * (len(values) - len(scored))  # blanks last
    assert scored == sorted(scored, reverse=reverse)
    table = [row[0] for row in table_rows(cli("runs", ".", *flags, check_code=0).stdout)]
    assert table == [os.path.basename(row["run"]) for row in rows]


def test_runs_of_empty_and_missing_directories(tmp_path):
    result = cli("runs", tmp_path, check_code=0)
    assert f"0 run(s) in {tmp_path}" in result.stdout and not table_rows(result.stdout)
    assert json.loads(cli("runs", tmp_path, "--json", check_code=0).stdout) == []
    assert_one_line_error(cli("runs", tmp_path / "absent"), "no such directory", "absent")


# --- provenance ------------------------------------------------------------------------------------


def test_provenance_of_a_run(runs_root):
    run = runs_root / "runs" / "finished"
    provenance = json.loads((run / "provenance.json").read_text(encoding="utf-8"))
    assert PROVENANCE_KEYS <= set(provenance)
    meta = json.loads((runs_root / "data" / "tiny" / "meta.json").read_text(encoding="utf-8"))
    assert provenance["corpus"] == "tiny" and provenance["corpus_fingerprint"] == meta["fingerprint"]
    assert provenance["charlm_version"] == charlm.__version__
    assert provenance["python"] == platform.python_version() and provenance["torch"] == str(torch.__version__)
    assert provenance["device"] == "cpu" and provenance["threads"] == torch.get_num_threads()
    assert provenance["host"] == platform.node() and provenance["pid"] == os.getpid()
    time.strptime(provenance["started"], "%Y-%m-%dT%H:%M:%S%z")
    assert isinstance(provenance["command"], str) and provenance["command"]
    assert Checkpoint.load(run / "best.pt").provenance == provenance
    assert Checkpoint.load(run / "last.pt").provenance == provenance
    # a resumed run keeps where it started and adds where it was resumed
    resumed = json.loads((runs_root / "runs" / "longer" / "provenance.json").read_text(encoding="utf-8"))
    assert {key: value for key, value in resumed.items() if key != "resumed"} == provenance
    assert PROVENANCE_KEYS <= set(resumed["resumed"])
    assert Checkpoint.load(runs_root / "runs" / "longer").provenance == resumed


def test_command_line_records_its_command(runs_root, tmp_path):
    run = tmp_path / "run"
    run_cli(
        "train",
        "--corpus",
        "tiny",
        "--data-dir",
        runs_root / "data",
        "--run-dir",
        run,
        "--hidden",
        "8",
        "--batch-size",
        "8",
        "--bptt",
        "16",
        "--epochs",
        "1",
        "--eval-batch-size",
        "4",
        "--train-fraction",
        "0.1",
        check_code=0,
    )
    provenance = json.loads((run / "provenance.json").read_text(encoding="utf-8"))
    assert provenance["command"].startswith("charlm train --corpus tiny --data-dir ")
    assert provenance["command"].endswith("--eval-batch-size 4 --train-fraction 0.1")
    assert provenance["pid"] != os.getpid()


# --- metrics.jsonl ---------------------------------------------------------------------------------


def test_record_survives_a_half_written_line(tmp_path):
    run = Run(tmp_path)
    seen = []

    class Sink:
        def write(self, event, fields):
            seen.append((event, fields))

        def close(self):
            pass

    run.sinks.append(Sink())
    run.record("start", parameters=10)
    with run.metrics.open("a", encoding="utf-8") as handle:
        handle.write('{"event": "ep')  # a crash in the middle of a write
    run.record("epoch", epoch=1, valid_bpc=float("inf"), norm=torch.tensor([1.5, 2.0]), where=tmp_path)
    lines = run.metrics.read_text(encoding="utf-8").splitlines()
    assert lines[1] == '{"event": "ep'
    assert json.loads(lines[2])["event"] == "epoch"
    events = records(run.path)
    assert [row["event"] for row in events] == ["start", "epoch"]
    assert events[1]["valid_bpc"] == float("inf")
    assert events[1]["norm"] == [1.5, 2.0] and events[1]["where"] == str(tmp_path)
    assert [event for event, _ in seen] == ["start", "epoch"] and seen[1][1]["epoch"] == 1
    assert run.status() == "interrupted"  # started, never ended, not running
    run.record("end", epochs=1, best_epoch=1)
    assert Run(tmp_path).status() == "finished"


def test_status_of_created_run(tmp_path):
    run = Run(tmp_path)
    assert run.status() == "created" and run.history().records == ()
    run.metrics.write_text("", encoding="utf-8")
    (tmp_path / "config.json").write_text("{}", encoding="utf-8")
    assert run.summary()["status"] == "created"


def test_second_train_into_a_run_directory_is_refused(runs_root, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(runs_root / "runs" / "finished", run)
    before = {path.name: path.read_bytes() for path in run.iterdir()}
    result = cli(*tiny_train(runs_root / "data", run, hidden_size=8, epochs=1))
    assert_one_line_error(result, "already holds a run", f"--resume {run}")
    assert {path.name: path.read_bytes() for path in run.iterdir()} == before
    assert_one_line_error(cli("train", "--resume", tmp_path / "absent"), "no run directory")
    (run / "last.pt").unlink()
    resumed = cli("train", "--resume", run, "--epochs", "2", check_code=0)
    assert f"warning: {run / 'last.pt'} is missing: resuming from {run / 'previous.pt'}" in resumed.stderr
    assert_one_line_error(cli("train", "--resume", tmp_path), "is not a run directory")


def test_runs_fit_80_columns_and_print_plain_values_for_scripts(runs_root, monkeypatch):
    """Issue 24: at 80 columns the least needed columns go and no number is broken; --plain is TSV.
    Issue 34: the corpus stays (runs on different corpora are not comparable), and the sorted column."""
    from charlm.cli import output

    monkeypatch.chdir(runs_root / "runs")
    monkeypatch.setattr(output.stdout, "width", 80)
    narrow = cli("runs", ".", check_code=0)
    assert all(len(line) <= 80 for line in narrow.stdout.splitlines())
    header = [line for line in narrow.stdout.splitlines() if line.startswith("┃")][0]
    kept = [cell.strip() for cell in header.split("┃")[1:-1]]
    assert {"run", "corpus", "cell", "valid bpc", "test bpc", "status"} <= set(kept) and "dynamic bpc" not in kept
    by_time = cli("runs", ".", "--sort", "time", check_code=0).stdout  # issue 34: the column sorted by stays
    assert "time" not in kept and "time" in table_header(by_time) and "corpus" in table_header(by_time)
    assert_fits(by_time)
    finished = Checkpoint.load(runs_root / "runs" / "finished")
    assert f"{finished.scores['test_bpc']:.4f}" in narrow.stdout  # whole, on one line
    plain = cli("runs", ".", "--plain", check_code=0).stdout.splitlines()
    columns = plain[0].split("\t")
    assert columns[:7] == ["run", "corpus", "cell", "size", "params", "fraction", "tokens"] and len(plain) == 7
    rows = {line.split("\t")[0]: dict(zip(columns, line.split("\t"))) for line in plain[1:]}
    assert rows["finished"]["fraction"] == "1" and rows["finished"]["tokens"].replace(",", "").isdigit()
