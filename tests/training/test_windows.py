"""Window layouts of training (--windows, --vary-bptt): the windows each lays out, exact resume with
each, the fresh state of random windows, the learning rate of varied windows, the tokens counted."""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest
import torch

from charlm.checkpoint import Checkpoint
from charlm.config import TrainConfig
from charlm.training.step import TrainingStep
from charlm.training.trainer import Trainer, TrainingInterrupted
from charlm.training.windows import MIN_LENGTH, WindowLayout, awd_lengths, epoch_generator, scaled_learning_rate
from helpers import assert_one_line_error, assert_same_run_end, cli, records, tiny_config, tiny_train

TOKENS = np.arange(25)  # token i is i: a window's tokens say where it reads


def rows_of(layout: WindowLayout, epoch: int) -> list[list[list[int]]]:
    return [window.inputs.tolist() for window in layout.epoch(epoch).windows()]


def test_contiguous_windows_are_cut_at_the_same_places_every_epoch():
    layout = WindowLayout(TOKENS, 4, 3)
    expected = [
        [[0, 1, 2], [6, 7, 8], [12, 13, 14], [18, 19, 20]],
        [[3, 4, 5], [9, 10, 11], [15, 16, 17], [21, 22, 23]],
    ]
    assert rows_of(layout, 0) == rows_of(layout, 7) == expected
    assert not any(window.fresh_state for window in layout.epoch(0).windows())


def test_shifted_streams_start_at_an_offset_drawn_for_each_epoch():
    layout = WindowLayout(np.arange(101), 4, 10, "shifted", seed=1)
    offsets = []
    for epoch in range(6):
        streams = layout.epoch(epoch)
        assert len(streams) == 3 and streams.stream_length == 22  # (100 − 9) // 4, every epoch
        read = np.concatenate([window.inputs.numpy() for window in streams.windows()], axis=1)
        targets = np.concatenate([window.targets.numpy() for window in streams.windows()], axis=1)
        offset = int(read[0, 0])
        assert 0 <= offset < 10
        np.testing.assert_array_equal(read, offset + np.arange(4 * 22).reshape(4, 22))  # contiguous streams
        np.testing.assert_array_equal(targets, read + 1)
        assert [window.inputs.shape[1] for window in streams.windows()] == [10, 10, 2]
        offsets.append(offset)
    assert offsets == [5, 4, 2, 6, 7, 1]  # (seed 1, epoch): the same draw for every run of that seed
    assert rows_of(layout, 2) == rows_of(WindowLayout(np.arange(101), 4, 10, "shifted", seed=1), 2)
    other = [int(WindowLayout(np.arange(101), 4, 10, "shifted", seed=2).epoch(e)._inputs[0, 0]) for e in range(6)]
    assert other != offsets


def test_random_windows_read_bptt_tokens_from_offsets_in_range_and_predict_the_next():
    tokens = np.arange(1000)
    layout = WindowLayout(tokens, 8, 16, "random", seed=3)
    epochs = [list(layout.epoch(epoch).windows()) for epoch in range(3)]
    assert [len(windows) for windows in epochs] == [len(layout.contiguous)] * 3 == [8] * 3  # ⌈(999 // 8) / 16⌉
    for windows in epochs:
        for window in windows:
            assert window.fresh_state and window.inputs.shape == (8, 16)
            starts = window.inputs[:, :1]
            assert torch.equal(window.inputs, starts + torch.arange(16))  # each row a stretch of the text
            assert torch.equal(window.targets, window.inputs + 1)
            assert int(starts.min()) >= 0 and int(window.targets.max()) <= 999
    assert not torch.equal(epochs[0][0].inputs, epochs[1][0].inputs)
    again = list(WindowLayout(tokens, 8, 16, "random", seed=3).epoch(1).windows(start=5))
    assert [window.index for window in again] == [5, 6, 7]
    assert all(torch.equal(a.inputs, b.inputs) for a, b in zip(again, epochs[1][5:]))  # resumable at a window
    share = WindowLayout(tokens, 8, 16, "random", seed=3, rows=slice(2, 5))  # one process's rows under torchrun
    assert all(torch.equal(a.inputs, b.inputs[2:5]) for a, b in zip(share.epoch(1).windows(), epochs[1]))


def test_varied_lengths_are_awd_lstms_deterministic_per_seed_and_cover_the_streams():
    lengths = awd_lengths(epoch_generator(1, 0), 200_000, 50)
    assert lengths == awd_lengths(epoch_generator(1, 0), 200_000, 50)
    assert lengths != awd_lengths(epoch_generator(2, 0), 200_000, 50)
    assert lengths != awd_lengths(epoch_generator(1, 1), 200_000, 50)
    assert sum(lengths) == 200_000 and min(lengths[:-1]) >= MIN_LENGTH
    drawn = np.array(lengths[:-1])
    halved = drawn < 37  # below 50 − 2.6 sd: almost only the windows of mean 25
    assert 0.04 < halved.mean() < 0.06
    assert 49 < drawn[~halved].mean() < 50  # int() truncates: a mean half a step below bptt
    assert min(awd_lengths(epoch_generator(1, 0), 1000, 4)[:-1]) == MIN_LENGTH  # the minimum, also above bptt

    layout = WindowLayout(np.arange(4001), 4, 20, "shifted", vary_bptt=True, seed=5)
    counts = layout.windows_per_epoch(4)
    assert len(set(counts)) > 1 and counts == WindowLayout(
        np.arange(4001), 4, 20, "shifted", True, 5
    ).windows_per_epoch(4)
    for epoch, count in enumerate(counts):
        streams = layout.epoch(epoch)
        widths = [window.inputs.shape[1] for window in streams.windows()]
        assert len(widths) == count and sum(widths) == streams.stream_length and len(set(widths)) > 3


def test_a_scaled_learning_rate_is_put_back_exactly():
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.3)
    with scaled_learning_rate(optimizer, 1.7):
        assert optimizer.param_groups[0]["lr"] == 0.3 * 1.7
    assert optimizer.param_groups[0]["lr"] == 0.3


LAYOUTS = {
    "contiguous": {},
    "shifted": {"windows": "shifted"},
    "shifted-varied": {"windows": "shifted", "vary_bptt": True},
    "random": {"windows": "random", "accumulate": 2},
}


@pytest.mark.parametrize("name", LAYOUTS)
def test_a_run_interrupted_inside_an_epoch_resumes_exactly_with_every_layout(tiny_corpus, tmp_path, monkeypatch, name):
    """A SIGTERM in the middle of the second epoch, then a resume: the weights, optimizer and
    schedule of an uninterrupted run, with dropout drawing from torch's generator meanwhile."""
    settings = dict(hidden_size=16, epochs=2, train_fraction=0.3, dropout=0.1, **LAYOUTS[name])
    straight = tmp_path / "straight"
    Trainer(tiny_config(tiny_corpus, straight, **settings)).fit()

    interrupted = tmp_path / "interrupted"
    trainer = Trainer(tiny_config(tiny_corpus, interrupted, **settings))
    original = TrainingStep._grad_norms

    def signal_in_the_second_epoch(self):
        if trainer.progress.epoch == 1 and trainer.progress.window == 4:
            os.kill(os.getpid(), signal.SIGTERM)
        return original(self)

    monkeypatch.setattr(TrainingStep, "_grad_norms", signal_in_the_second_epoch)
    with pytest.raises(TrainingInterrupted):
        trainer.fit()
    monkeypatch.undo()
    assert Checkpoint.load(interrupted / "last.pt").training.progress["epoch"] == 1
    Trainer.resume(str(interrupted)).fit()
    assert_same_run_end(straight, interrupted)
    assert records(straight, "epoch")[-1]["valid_bpc"] == records(interrupted, "epoch")[-1]["valid_bpc"]


def states_each_window_starts_from(tiny_corpus, run_dir, monkeypatch, **settings) -> list[float]:
    """Trains one epoch and returns, for each window, the size of the state it started from."""
    seen = []
    original = TrainingStep._window

    def record_the_state(self, window, state, windows):
        seen.append(sum(float(tensor.abs().sum()) for layer in state for tensor in layer))
        return original(self, window, state, windows)

    monkeypatch.setattr(TrainingStep, "_window", record_the_state)
    Trainer(tiny_config(tiny_corpus, run_dir, hidden_size=16, epochs=1, train_fraction=0.2, **settings)).fit()
    monkeypatch.undo()
    return seen


def test_random_windows_start_from_a_fresh_state_and_contiguous_ones_carry_it(tiny_corpus, tmp_path, monkeypatch):
    carried = states_each_window_starts_from(tiny_corpus, tmp_path / "c", monkeypatch)
    assert carried[0] == 0 and all(size > 0 for size in carried[1:])
    fresh = states_each_window_starts_from(tiny_corpus, tmp_path / "r", monkeypatch, windows="random", accumulate=2)
    assert len(fresh) == len(carried) and all(size == 0 for size in fresh)  # inside an update's group too


def test_varied_windows_scale_the_rate_of_their_update_and_count_their_tokens(tiny_corpus, tmp_path, monkeypatch):
    """--vary-bptt: each update trains at lr × its window's length / bptt (the schedule's rate in
    the records), warmup-cosine ends at --min-lr on the last step of the last epoch, whatever the
    count of windows of each epoch; tokens_seen counts the tokens trained."""
    trained = []
    original = TrainingStep.__call__

    def record_the_rate(self, windows, *arguments):
        trained.append((windows[0].inputs.shape[1], self.optimizer.param_groups[0]["lr"]))
        return original(self, windows, *arguments)

    monkeypatch.setattr(TrainingStep, "__call__", record_the_rate)
    settings = dict(hidden_size=16, epochs=2, train_fraction=0.2, log_every=1, windows="shifted", vary_bptt=True)
    run = tmp_path / "run"
    trainer = Trainer(tiny_config(tiny_corpus, run, schedule="warmup-cosine", warmup_steps=2, min_lr=1e-4, **settings))
    trainer.fit()
    steps = records(run, "step")
    assert len(steps) == len(trained) == sum(trainer.layout.windows_per_epoch(2))
    assert len({length for length, _ in trained}) > 3
    for (length, rate), step in zip(trained, steps):
        assert rate == pytest.approx(step["lr"] * length / 16, rel=1e-12)
    assert steps[-1]["lr"] > 1e-4
    saved = Checkpoint.load(run / "last.pt").training
    assert saved.optimizer["param_groups"][0]["lr"] == pytest.approx(1e-4)
    streams = [trainer.layout.epoch(epoch) for epoch in range(2)]
    assert saved.progress["tokens_seen"] == sum(8 * s.stream_length for s in streams) == steps[-1]["tokens"]


def test_random_windows_count_full_windows_of_tokens(tiny_corpus, tmp_path):
    run = tmp_path / "run"
    trainer = Trainer(tiny_config(tiny_corpus, run, hidden_size=16, epochs=1, train_fraction=0.2, windows="random"))
    trainer.fit()
    count = len(trainer.layout.contiguous)
    assert len(trainer.train_streams) == count
    assert Checkpoint.load(run / "last.pt").training.progress["tokens_seen"] == count * 8 * 16


@pytest.mark.parametrize(
    "extra, fragment",
    [
        (["--vary-bptt"], "--vary-bptt needs --windows shifted, not --windows contiguous"),
        (["--windows", "random", "--vary-bptt"], "--vary-bptt needs --windows shifted, not --windows random"),
        (["--windows", "shifted", "--vary-bptt", "--cuda-graph"], "--vary-bptt and --cuda-graph are exclusive"),
        (["--windows", "moving"], "--windows must be one of contiguous, shifted, random, not 'moving'"),
    ],
)
def test_bad_window_settings_are_one_line_errors(tiny_corpus, tmp_path, extra, fragment):
    result = cli(*tiny_train(tiny_corpus, tmp_path / "r", *extra))
    assert_one_line_error(result, fragment)
    assert not (tmp_path / "r").exists()


def test_the_layout_defines_the_run_and_runs_before_it_train_contiguous(trained_run):
    assert_one_line_error(
        cli("train", "--resume", trained_run, "--windows", "random"), "--windows cannot change a run being resumed"
    )
    settings = TrainConfig(corpus="tiny").to_dict()
    del settings["windows"], settings["vary_bptt"]  # a config of charlm 0.3
    old = TrainConfig.from_dict(settings)
    assert old.windows == "contiguous" and old.vary_bptt is False
