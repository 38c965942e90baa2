"""Write failures are one line: past a file-size limit (``ulimit -f``, set in a subprocess) or on
a full disk, every writer (a training's checkpoints, an export, a prepared corpus, a report, the
run's records, a download) stops with one line naming the file meant, exit code 1, no traceback, no
temporary file, the previous files intact; a training resumed afterwards ends as a straight one.
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import charlm.files
from charlm.checkpoint import Checkpoint
from charlm.corpora import load_corpus
from charlm.corpora.download import DownloadPolicy, RemoteFile, fetch
from charlm.files import WriteError, append_text, atomic_write, atomic_write_text
from charlm.training.trainer import Trainer
from helpers import assert_one_line_error, assert_same_run_end, cli, prepare_tiny_corpus, tiny_config

TINY = dict(hidden_size=16, train_fraction=0.1)  # 29 steps an epoch: a second or so


def run_with_file_size_limit(limit: int, *args, cwd: Path) -> subprocess.CompletedProcess:
    """`python -m charlm ARGS` in a subprocess that may write files of at most ``limit`` bytes."""
    _, hard = resource.getrlimit(resource.RLIMIT_FSIZE)

    def lower_the_limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))

    return subprocess.run(
        [sys.executable, "-m", "charlm", *map(str, args)],
        cwd=cwd,
        preexec_fn=lower_the_limit,
        capture_output=True,
        text=True,
        timeout=300,
    )


def digests(directory: Path, pattern: str = "*") -> dict[str, str]:
    return {
        path.name: hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(directory.glob(pattern))
        if path.is_file()
    }


def temporaries(directory: Path) -> list[Path]:
    return [path for path in directory.rglob(".*") if ".tmp" in path.name or ".partial-" in path.name]


def failed_target(result, limit: int) -> str:
    """The file the one line names, after checking the line: exit 1 (the reason is the system's, "File too
    large", or the writer's own where PyTorch's loses it)."""
    assert_one_line_error(result, "cannot write", code=1)
    line = result.stderr.strip().splitlines()[-1]
    return re.search(r"cannot write (\S+): ", line).group(1)


# --- in a subprocess, past a file-size limit ------------------------------------------------------


def test_training_save_past_the_limit_is_one_line_keeps_the_checkpoints_and_resumes_exactly(tiny_corpus, tmp_path):
    straight, run = tmp_path / "straight", tmp_path / "run"
    Trainer(tiny_config(tiny_corpus, straight, epochs=2, **TINY)).fit()
    Trainer(tiny_config(tiny_corpus, run, epochs=1, **TINY)).fit()
    before = digests(run, "*.pt")
    limit = min((run / "best.pt").stat().st_size, (run / "last.pt").stat().st_size) // 2  # records and logs fit

    result = run_with_file_size_limit(
        limit, "train", "--resume", run, "--epochs", "2", "--save-every", "1", cwd=tmp_path
    )  # the first step's save fails

    target = failed_target(result, limit)
    assert Path(target).name in ("last.pt", "best.pt") and Path(target).parent == run  # never the temporary file
    assert f"cannot write {target}: File too large; " in result.stderr  # the system's reason, not torch's writer's
    assert "training stopped" in result.stderr and "is intact" in result.stderr
    assert temporaries(run) == []
    assert digests(run, "*.pt") == before
    assert all(Checkpoint.load(run / name).training.progress["epoch"] == 1 for name in before)
    cli("train", "--resume", run, "--epochs", "2", check_code=0)
    assert_same_run_end(straight, run)


@pytest.mark.slow  # a subprocess importing torch; the training's checkpoints above go through torch's writer too
@pytest.mark.filterwarnings("ignore:`torch.jit.load` is deprecated:DeprecationWarning")
def test_export_past_the_limit_is_one_line_and_keeps_the_earlier_export(trained_run, tmp_path):
    output = tmp_path / "step.ts"
    cli("export", trained_run, output, "--format", "torchscript", check_code=0)
    before = digests(tmp_path)
    limit = output.stat().st_size // 2

    result = run_with_file_size_limit(
        limit, "export", trained_run, output, "--format", "torchscript", "--force", cwd=tmp_path
    )

    assert failed_target(result, limit) == str(output)  # torch's C++ writer used to abort the process here
    assert digests(tmp_path) == before and temporaries(tmp_path) == []
    torch.jit.load(str(output))


@pytest.mark.slow  # a subprocess importing torch; the default run keeps the training's ulimit test above
def test_prepare_past_the_limit_is_one_line_and_keeps_the_prepared_corpus(tmp_path):
    data = tmp_path / "data"
    prepare_tiny_corpus(data)
    before = digests(data / "tiny")
    limit = (data / "tiny" / "train.npy").stat().st_size // 2

    changed = tmp_path / "changed.txt"  # other inputs: the corpus is prepared again, replacing the one there
    changed.write_text((tmp_path / "tiny.txt").read_text(encoding="utf-8")[::-1], encoding="utf-8")
    result = run_with_file_size_limit(
        limit, "prepare", "text", changed, "--name", "tiny", "--data-dir", data, "--unknown", "unk", cwd=tmp_path
    )

    assert failed_target(result, limit) == str(data / "tiny")  # the corpus, not its staging directory
    assert result.stderr.strip().endswith(f"cannot write {data / 'tiny'}: File too large")  # not numpy's byte counts
    assert temporaries(data) == [] and digests(data / "tiny") == before
    corpus = load_corpus("tiny", data)
    assert np.array_equal(corpus.split("train"), np.load(data / "tiny" / "train.npy"))


@pytest.mark.slow  # a subprocess importing torch; the default run keeps the training's ulimit test above
def test_report_past_the_limit_is_one_line_and_keeps_the_earlier_report(trained_run, tmp_path):
    out = tmp_path / "report"
    cli("report", trained_run, "--out", out, check_code=0)
    before = digests(out)
    limit = max(path.stat().st_size for path in out.glob("*.png")) // 2

    result = run_with_file_size_limit(limit, "report", trained_run, "--out", out, cwd=tmp_path)

    target = Path(failed_target(result, limit))
    assert target.parent == out and target.suffix == ".png"
    assert digests(out) == before and temporaries(out) == []


@pytest.mark.slow  # two reports and a subprocess: about 3 s
def test_a_report_that_fails_midway_leaves_every_file_of_the_earlier_one(trained_run, tmp_path):
    """Its tables fit and its figures do not: the tables used to be replaced already, leaving a report
    half new, half old. (The report of another run: each file differs from the earlier one's.)"""
    out, other = tmp_path / "report", tmp_path / "other-run"
    cli("report", trained_run, "--out", out, check_code=0)
    shutil.copytree(trained_run, other)
    before = digests(out)
    limit = max(path.stat().st_size for path in out.glob("*.png")) // 2
    assert max(path.stat().st_size for path in out.glob("*.md")) < limit  # the tables would fit

    result = run_with_file_size_limit(limit, "report", other, "--out", out, cwd=tmp_path)

    assert Path(failed_target(result, limit)).parent == out  # the report's file, not its staging copy
    assert digests(out) == before and temporaries(out) == [] and [p.name for p in out.iterdir() if p.is_dir()] == []


@pytest.mark.slow  # a subprocess importing torch: about 2 s
def test_a_limit_of_no_bytes_at_all_is_one_line_too(trained_run, tmp_path):
    """`ulimit -f 0`: Python's tempfile, which torch calls as it is imported, finds no directory to
    write in: one line, not a traceback."""
    result = run_with_file_size_limit(0, "export", trained_run, tmp_path / "model.pt", cwd=tmp_path)
    assert_one_line_error(result, "No usable temporary directory", code=2)
    assert list(tmp_path.iterdir()) == []


# --- in this process: the reasons, the exit codes, appends, downloads ------------------------------


def test_append_that_fails_leaves_no_half_line(tmp_path, monkeypatch):
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text('{"event": "start"}\n', encoding="utf-8")
    real_write = os.write

    def write_half_then_fill_the_disk(descriptor, data):
        if len(data) > 4:
            return real_write(descriptor, data[: len(data) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(charlm.files.os, "write", write_half_then_fill_the_disk)
    with pytest.raises(WriteError) as caught:
        append_text(metrics, '{"event": "epoch", "epoch": 1}\n')
    monkeypatch.undo()
    assert str(caught.value) == f"cannot write {metrics}: No space left on device"
    assert caught.value.exit_code == 1 and caught.value.errno == errno.ENOSPC and caught.value.filename == str(metrics)
    assert metrics.read_text(encoding="utf-8") == '{"event": "start"}\n'  # cut back to its length before


def test_torch_writer_failure_on_a_full_disk_names_the_target(tmp_path):
    def torch_save_that_runs_out_of_space(temporary):
        temporary.write_bytes(b"PK\3\4 half an archive")
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534")

    target = tmp_path / "last.pt"
    target.write_bytes(b"the previous checkpoint")
    with pytest.raises(WriteError) as caught:
        atomic_write(target, torch_save_that_runs_out_of_space)
    assert str(caught.value) == (
        f"cannot write {target}: the write failed "
        "([enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534)"
    )
    assert caught.value.exit_code == 1
    assert target.read_bytes() == b"the previous checkpoint" and os.listdir(tmp_path) == ["last.pt"]


@pytest.mark.parametrize("number, code", [(errno.EROFS, 1), (errno.EIO, 1), (errno.EDQUOT, 1), (errno.ENOENT, 2)])
def test_failure_to_make_the_temporary_file_names_the_target(tmp_path, monkeypatch, number, code):
    def refuse(**names):
        raise OSError(number, os.strerror(number), str(tmp_path / ".config.json.x1y2.tmp"))

    monkeypatch.setattr(charlm.files.tempfile, "mkstemp", refuse)
    with pytest.raises(WriteError) as caught:
        atomic_write_text(tmp_path / "config.json", "{}")
    assert str(caught.value) == f"cannot write {tmp_path / 'config.json'}: {os.strerror(number)}"
    assert caught.value.exit_code == code  # the machine (1), or a path that is wrong (2)


def test_an_error_that_is_not_a_write_failure_passes_as_it_is(tmp_path):
    def broken_writer(temporary):
        raise RuntimeError("a bug in the writer")

    with pytest.raises(RuntimeError, match="^a bug in the writer$"):
        atomic_write(tmp_path / "out.pt", broken_writer)
    assert os.listdir(tmp_path) == []


def test_a_download_that_fills_the_disk_stops_at_once_naming_the_archive(corpus_server, tmp_path, monkeypatch):
    import charlm.corpora.download as download

    payload = bytes(range(256)) * 400
    corpus_server.files["corpus.zip"] = payload
    remote = RemoteFile(
        url=corpus_server.url("corpus.zip"),
        filename="corpus.zip",
        size=len(payload),
        sha256=hashlib.sha256(payload).hexdigest(),
    )

    class FullDiskFile:
        def __init__(self, path, mode):
            self.file = open(path, mode)

        def write(self, block):
            raise OSError(errno.ENOSPC, "No space left on device")

        def __getattr__(self, name):
            return getattr(self.file, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.file.close()

    monkeypatch.setattr(download, "open", FullDiskFile, raising=False)
    messages = []
    with pytest.raises(WriteError, match=re.escape(f"cannot write {tmp_path / 'corpus.zip'}: No space left on device")):
        fetch(
            remote,
            tmp_path,
            policy=DownloadPolicy(attempts=3, backoff=0.0, timeout=5.0),
            progress=False,
            log=messages.append,
        )
    assert messages == [] and len(corpus_server.requests) == 1  # the disk, not the network: no retry


def test_a_run_lock_that_cannot_be_opened_is_a_write_failure_not_a_run_in_use(trained_run, tmp_path, monkeypatch):
    """On a read-only file system the lock of a run cannot be opened: `train --resume` said so with
    exit code 2 (bad input) and `runs --prune` skipped the run as "being trained"."""
    import builtins

    import charlm.runs.directory as directory

    run = tmp_path / "run"
    shutil.copytree(trained_run, run)
    before = digests(run)

    def read_only(path, mode="r", *args, **kwargs):
        if Path(path).name == "lock" and mode != "r":
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
        return builtins.open(path, mode, *args, **kwargs)

    monkeypatch.setattr(directory, "open", read_only, raising=False)
    lock = f"cannot write {run / 'lock'}: Read-only file system"
    assert_one_line_error(cli("train", "--resume", run, "--epochs", "2"), lock, code=1)
    assert_one_line_error(cli("runs", run, "--prune"), lock, code=1)
    result = cli("runs", run, "--prune", "--dry-run", check_code=0)  # changes nothing: says what it would do
    assert "skipped" not in result.stdout and "would free" in result.stdout
    assert digests(run) == before
