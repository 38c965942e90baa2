"""``--dist-timeout``: how long a torchrun process waits for the others, and the one line it stops with.

The fast tests follow the option from the command line to ``init_process_group``; the slow one
freezes rank 1 of a real 2-process gloo training and watches rank 0 stop within seconds.
"""

from __future__ import annotations

import datetime
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from charlm.config import TrainConfig
from charlm.errors import CharlmError
from charlm.runtime import distributed
from charlm.runtime.distributed import World, world_from_environment
from helpers import assert_one_line_error, cli


@pytest.fixture
def fake_group(monkeypatch):
    """torch.distributed as a 2-process torchrun would give it to rank 0, recording what charlm asks."""
    calls = {}
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setattr(distributed.dist, "is_initialized", lambda: False)

    def rendezvous(url, rank, size, timeout):
        calls["rendezvous"] = timeout
        yield object(), rank, size

    def init_process_group(backend, **options):
        calls["init"] = options["timeout"]
        if "fail" in calls:
            raise calls["fail"]

    monkeypatch.setattr(distributed.dist, "rendezvous", rendezvous)
    monkeypatch.setattr(distributed.dist, "PrefixStore", lambda prefix, store: store)
    monkeypatch.setattr(distributed.dist, "init_process_group", init_process_group)
    return calls


def test_the_timeout_is_the_process_groups_and_the_store_keeps_its_own(fake_group):
    world = world_from_environment(torch.device("cpu"), timeout_minutes=0.5)
    assert fake_group["init"] == datetime.timedelta(seconds=30)
    assert fake_group["rendezvous"] == datetime.timedelta(minutes=30)  # a process may still be importing torch
    assert (world.rank, world.size, world.timeout_minutes) == (0, 2, 0.5)
    world_from_environment(torch.device("cpu"))
    assert fake_group["init"] == datetime.timedelta(minutes=10)  # the default


def test_a_group_the_others_never_join_is_one_line_naming_the_option(fake_group):
    fake_group["fail"] = RuntimeError("Timed out after 61 seconds waiting for clients. 1/2 clients joined.")
    with pytest.raises(CharlmError, match=r"^process 0 of 2 waited --dist-timeout 1 minutes for the others to join"):
        world_from_environment(torch.device("cpu"), timeout_minutes=1)
    fake_group["fail"] = RuntimeError("Connection refused")  # not a timeout: torch's own error, as before
    with pytest.raises(RuntimeError, match="Connection refused"):
        world_from_environment(torch.device("cpu"), timeout_minutes=1)


@pytest.mark.parametrize(
    "rank, size, local_rank",
    [("0", "0", "0"), ("0", "-1", "0"), ("2", "2", "0"), ("-1", "2", "0"), ("0", "2", "-1"), ("5", "1", "0")],
)
def test_ranks_that_name_no_process_are_one_line(rank, size, local_rank, monkeypatch):
    """A WORLD_SIZE of 0 or a RANK beyond it used to reach torch's rendezvous and end in a traceback."""
    for name, value in (("RANK", rank), ("WORLD_SIZE", size), ("LOCAL_RANK", local_rank)):
        monkeypatch.setenv(name, value)
    with pytest.raises(
        CharlmError, match=rf"^RANK {rank}, WORLD_SIZE {size} and LOCAL_RANK {local_rank} name no process"
    ):
        world_from_environment(torch.device("cpu"))


def test_a_rendezvous_without_its_address_is_one_line(monkeypatch):
    for name, value in (("RANK", "0"), ("WORLD_SIZE", "2"), ("LOCAL_RANK", "0")):
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    monkeypatch.setattr(distributed.dist, "is_initialized", lambda: False)
    with pytest.raises(CharlmError, match=r"^process 0 of 2 cannot reach the others .*MASTER_ADDR"):
        world_from_environment(torch.device("cpu"))


def test_training_passes_its_setting_to_the_world(monkeypatch):
    from charlm.training import setup

    asked = []
    monkeypatch.setattr(
        setup, "world_from_environment", lambda device, timeout_minutes: asked.append(timeout_minutes) or World()
    )
    setup.placement(TrainConfig(device="cpu", dist_timeout=2.5))
    setup.placement(TrainConfig(device="cpu"))
    assert asked == [2.5, 10.0]


def test_a_collective_that_timed_out_names_the_option_and_another_failure_does_not():
    world = World(1, 4, timeout_minutes=0.25)
    gloo = RuntimeError(
        "[../gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 15000ms for recv operation to complete"
    )
    assert world.lost_peer(gloo, "ignored") == (
        "process 1 of 4 waited --dist-timeout 0.25 minutes for the others and stopped: one of them froze or was lost "
        "(if they were only slow, as when saving a large checkpoint, give a larger --dist-timeout)"
    )
    reset = RuntimeError("Connection reset by peer")
    assert (
        world.lost_peer(reset, "Connection reset by peer")
        == "a process of this training failed or was lost (Connection reset by peer)"
    )


@pytest.mark.parametrize(
    "value, message",
    [
        ("0", "--dist-timeout must be in (0, 10080], not 0"),
        ("-1", "--dist-timeout must be in (0, 10080], not -1"),
        ("nan", "--dist-timeout must be"),
        ("20000", "--dist-timeout must be in (0, 10080]"),
    ],
)
def test_a_timeout_out_of_range_is_refused_before_anything_is_written(value, message, tmp_path):
    assert_one_line_error(cli("train", "--dist-timeout", value, "--run-dir", tmp_path / "run"), message)
    assert not (tmp_path / "run").exists()


def test_the_option_is_documented_and_may_change_on_resume():
    from charlm.config import RESUMABLE_SETTINGS

    shown = " ".join(cli("train", "--help", check_code=0).stdout.replace("│", " ").split())  # the help's box, unwrapped
    assert "--dist-timeout <float> Under torchrun: minutes a process waits" in shown
    assert "a frozen process is noticed in minutes, not PyTorch's 30" in shown and "(default: 10.0)" in shown
    assert "dist_timeout" in RESUMABLE_SETTINGS


WORKER = Path(__file__).with_name("distributed_freeze.py")


@pytest.mark.slow  # two torchrun processes start (about 15 s on 2 cores): `pytest -m slow`
def test_a_frozen_process_stops_the_other_within_seconds_with_one_line(tiny_corpus, tmp_path):
    """Rank 1 freezes at its first step; rank 0 waits --dist-timeout 0.05 minutes (3 s) at the
    step's gradient all-reduce, then stops with one line naming the option."""
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        str(WORKER),
        "--corpus",
        "tiny",
        "--data-dir",
        str(tiny_corpus),
        "--cell",
        "gru",
        "--hidden",
        "8",
        "--batch-size",
        "4",
        "--bptt",
        "10",
        "--epochs",
        "1",
        "--train-fraction",
        "0.05",
        "--device",
        "cpu",
        "--run-dir",
        str(tmp_path / "run"),
        "--dist-timeout",
        "0.05",
    ]
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    lines, started, failed_at = [], None, None
    try:
        for line in process.stderr:  # torchrun then waits 30 s for the frozen one to take SIGTERM: not awaited here
            lines.append(line.rstrip("\n"))
            if line.startswith("training gru"):
                started = time.monotonic()
            if line.startswith("charlm: error:"):
                failed_at = time.monotonic()
                break
    finally:
        os.killpg(process.pid, signal.SIGKILL)  # torchrun and its two workers: the group this test started
        process.wait(timeout=60)
    errors = [line for line in lines if line.startswith("charlm: error:")]
    assert errors == [
        "charlm: error: training stopped: process 0 of 2 waited --dist-timeout 0.05 minutes for the "
        "others and stopped: one of them froze or was lost (if they were only slow, as when saving a large "
        f"checkpoint, give a larger --dist-timeout); no checkpoint had been saved; continue with `torchrun "
        f"... -m charlm train --resume {tmp_path / 'run'}` on any number of processes"
    ], "\n".join(lines)
    assert started is not None and failed_at - started < 30, "\n".join(lines)
    assert not any("Traceback" in line for line in lines)
