"""Optimizers by name and gradient accumulation: each update against a hand computation, through the
trainer, resumed, and their errors."""

from __future__ import annotations

import contextlib
import copy
import io
import os
import signal

import numpy as np
import pytest
import torch

from charlm.checkpoint import Checkpoint
from charlm.config import TrainConfig
from charlm.corpora.streams import TokenStreams
from charlm.model import LanguageModel, ModelConfig
from charlm.runtime.distributed import World
from charlm.training.control import StopRequest, TimeBudget
from charlm.training.optimizers import build_optimizer
from charlm.training.schedules import Schedule
from charlm.training.step import PlainGradients, TrainingStep, update_groups
from charlm.training.trainer import Trainer, TrainingInterrupted
from helpers import assert_one_line_error, assert_same_run_end, cli, records, tiny_config, tiny_train

THETA = torch.tensor([0.5, -1.0, 2.0])
GRADIENTS = (torch.tensor([0.1, -0.3, 0.2]), torch.tensor([-0.2, 0.4, 0.05]))
LR, EPS = 0.1, 1e-8


def by_hand(name: str, settings: dict) -> torch.Tensor:
    """The weights after two updates with GRADIENTS, by the textbook formulas (float64)."""
    theta = THETA.double()
    decay = settings.get("weight_decay", 0.01 if name == "adamw" else 0.0)
    mu = settings.get("momentum", {"sgd": 0.9, "rmsprop": 0.0}.get(name))
    m = v = buffer = torch.zeros(3, dtype=torch.float64)
    for t, gradient in enumerate(GRADIENTS, start=1):
        g = gradient.double()
        if name == "adamw":
            theta = theta * (1 - LR * decay)  # decoupled: the weights shrink, apart from Adam's step
        else:
            g = g + decay * theta  # L2: into the gradient
        if name in ("adam", "adamw"):
            m, v = 0.9 * m + 0.1 * g, 0.999 * v + 0.001 * g**2
            theta = theta - LR * (m / (1 - 0.9**t)) / ((v / (1 - 0.999**t)).sqrt() + EPS)
        elif name == "sgd":
            buffer = g if t == 1 else mu * buffer + g  # the first update: the gradient itself (no dampening)
            theta = theta - LR * (g + mu * buffer if settings.get("nesterov") else buffer)
        else:  # rmsprop, α = 0.99
            v = 0.99 * v + 0.01 * g**2
            buffer = mu * buffer + g / (v.sqrt() + EPS)
            theta = theta - LR * buffer
    return theta


@pytest.mark.parametrize(
    "name, settings",
    [
        ("adam", {}),
        ("adam", {"weight_decay": 0.05}),
        ("adamw", {}),
        ("adamw", {"weight_decay": 0.2}),
        ("sgd", {}),
        ("sgd", {"momentum": 0.5, "nesterov": True, "weight_decay": 0.05}),
        ("sgd", {"momentum": 0.0}),
        ("rmsprop", {}),
        ("rmsprop", {"momentum": 0.5, "weight_decay": 0.05}),
    ],
)
def test_each_optimizer_updates_as_its_formula_says(name, settings):
    """Defaults included: adamw decays by 0.01, sgd's momentum is 0.9, rmsprop's 0."""
    config = TrainConfig(optimizer=name, lr=LR, **settings)
    config.validate()
    parameter = torch.nn.Parameter(THETA.clone())
    optimizer = build_optimizer([parameter], config)
    for gradient in GRADIENTS:
        parameter.grad = gradient.clone()
        optimizer.step()
    torch.testing.assert_close(parameter.detach().double(), by_hand(name, settings), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("name", ["adam", "adamw", "sgd", "rmsprop"])
def test_each_optimizer_follows_the_schedule_and_resumes_from_its_state(name):
    """The schedule sets the rate each optimizer steps with; its state saved after one update and
    loaded into a fresh optimizer (as a resumed run does) gives the same second update."""
    config = TrainConfig(optimizer=name, lr=LR)
    parameter = torch.nn.Parameter(THETA.clone())
    optimizer = build_optimizer([parameter], config)
    schedule = Schedule(optimizer, "warmup-cosine", lr=LR, warmup_steps=2, total_steps=10)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(LR / 2)
    parameter.grad = GRADIENTS[0].clone()
    optimizer.step()
    schedule.after_step()
    saved = io.BytesIO()
    torch.save({"optimizer": optimizer.state_dict(), "schedule": schedule.state_dict()}, saved)
    saved.seek(0)
    state = torch.load(saved, weights_only=True)
    resumed_parameter = torch.nn.Parameter(parameter.detach().clone())
    resumed = build_optimizer([resumed_parameter], config)
    Schedule(resumed, "warmup-cosine", lr=LR, warmup_steps=2, total_steps=10).load_state_dict(state["schedule"])
    resumed.load_state_dict(state["optimizer"])
    assert resumed.param_groups[0]["lr"] == optimizer.param_groups[0]["lr"] == pytest.approx(LR)
    for p, o in ((parameter, optimizer), (resumed_parameter, resumed)):
        p.grad = GRADIENTS[1].clone()
        o.step()
    assert torch.equal(parameter, resumed_parameter)
    if name == "sgd":  # the rate halved by warmup, then whole: θ − lr/2·g1 − lr·(0.9·g1 + g2)
        expected = THETA - LR / 2 * GRADIENTS[0] - LR * (0.9 * GRADIENTS[0] + GRADIENTS[1])
        torch.testing.assert_close(parameter.detach(), expected)


# --- gradient accumulation ------------------------------------------------------------------------


def tiny_model_and_windows(count: int = 2):
    torch.manual_seed(0)
    model = LanguageModel(ModelConfig("lstm", vocab_size=9, hidden_size=8, layers=2))  # no dropout
    windows = list(TokenStreams(np.random.default_rng(0).integers(9, size=200), 3, 6).windows())[:count]
    return model, windows


def training_step(model, optimizer, clip: float, **extra) -> TrainingStep:
    return TrainingStep(
        model,
        model,
        optimizer,
        PlainGradients(),
        World(),
        batch_size=3,
        clip=clip,
        precision="fp32",
        device=torch.device("cpu"),
        **extra,
    )


@pytest.mark.parametrize("clip", [0.0, 0.05])
def test_two_accumulated_windows_step_on_their_mean_loss(clip):
    """--accumulate 2 on windows w1, w2: one SGD update θ − lr·c·∇(L1 + L2)/2, where w2 starts from
    the state w1 left (detached) and c clips the summed gradient as a whole."""
    model, (w1, w2) = tiny_model_and_windows()
    reference = copy.deepcopy(model)
    step = training_step(model, torch.optim.SGD(model.parameters(), lr=0.5), clip)
    result = step([w1, w2], model.initial_state(3), StopRequest(), TimeBudget(None))

    cross_entropy = torch.nn.functional.cross_entropy
    logits, state = reference(w1.inputs, reference.initial_state(3))
    first = cross_entropy(logits.reshape(-1, 9), w1.targets.reshape(-1))
    logits, state = reference(w2.inputs, [tuple(t.detach() for t in layer) for layer in state])
    second = cross_entropy(logits.reshape(-1, 9), w2.targets.reshape(-1))
    parameters = list(reference.parameters())
    gradients = torch.autograd.grad((first + second) / 2, parameters)
    norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in gradients]))
    factor = min(1.0, clip / (norm.item() + 1e-6)) if clip else 1.0
    assert clip == 0 or factor < 1  # the clipping test does clip
    for parameter, before, gradient in zip(model.parameters(), parameters, gradients):
        torch.testing.assert_close(parameter.detach(), before.detach() - 0.5 * factor * gradient)
    assert result.loss == pytest.approx(((first + second) / 2).item(), rel=1e-6)
    assert result.tokens == 36
    total = sum(value**2 for value in result.grad_norms.values()) ** 0.5  # the summed gradient's, before clipping
    assert total == pytest.approx(norm.item(), rel=1e-5)
    for ours, theirs in zip(result.state, state):
        for a, b in zip(ours, theirs):
            torch.testing.assert_close(a, b.detach())


def test_the_windows_before_an_updates_last_run_without_gradient_sync():
    """Under torchrun the first K − 1 windows, forward and backward, run inside DDP's no_sync."""
    model, windows = tiny_model_and_windows(3)
    inside, seen = [], []

    class Pause:
        def __enter__(self):
            inside.append(True)

        def __exit__(self, *error):
            inside.pop()

    def forward(tokens, state):
        seen.append(bool(inside))
        return model(tokens, state)

    step = TrainingStep(
        model,
        forward,
        torch.optim.SGD(model.parameters(), lr=0.1),
        PlainGradients(),
        World(),
        batch_size=3,
        clip=0.0,
        precision="fp32",
        device=torch.device("cpu"),
        gradient_sync_pause=Pause,
    )
    step(windows, model.initial_state(3), StopRequest(), TimeBudget(None))
    assert seen == [True, True, False]


def test_the_pause_is_ddps_own_no_sync(tmp_path):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from charlm.runtime.compiling import CompiledForward
    from charlm.training.setup import gradient_sync_pause

    model, _ = tiny_model_and_windows()
    assert gradient_sync_pause(model) is contextlib.nullcontext  # one process: nothing to pause
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        ddp = DistributedDataParallel(model)
        assert gradient_sync_pause(ddp) == ddp.no_sync
        wrapped = CompiledForward.__new__(CompiledForward)
        wrapped.network = ddp
        assert gradient_sync_pause(wrapped) == ddp.no_sync
    finally:
        dist.destroy_process_group()


def test_windows_group_by_their_index_and_the_last_group_takes_the_rest():
    model, windows = tiny_model_and_windows(5)
    assert [[w.index for w in group] for group in update_groups(windows, 2)] == [[0, 1], [2, 3], [4]]
    assert [[w.index for w in group] for group in update_groups(windows[2:], 2)] == [[2, 3], [4]]  # resumed at 2
    assert [[w.index for w in group] for group in update_groups(windows, 1)] == [[0], [1], [2], [3], [4]]


SMALL = dict(
    cell="gru", hidden_size=8, batch_size=4, bptt=8, train_fraction=0.02, eval_fraction=0.2, eval_batch_size=16
)


def test_steps_count_updates_and_the_schedule_steps_per_update(tiny_corpus, tmp_path):
    """An epoch of an odd number of windows under --accumulate 2: ⌈windows / 2⌉ updates (the last
    one a single window), step records every update, warmup counted in updates."""
    trainer = Trainer(
        tiny_config(
            tiny_corpus,
            tmp_path / "run",
            epochs=1,
            accumulate=2,
            log_every=1,
            lr=3e-3,
            schedule="warmup-cosine",
            warmup_steps=3,
            **SMALL,
        )
    )
    windows = len(trainer.train_streams)
    assert windows % 2 == 1
    trainer.fit()
    steps = records(tmp_path / "run", "step")
    assert [step["step"] for step in steps] == list(range(1, windows // 2 + 2))
    assert [step["lr"] for step in steps[:4]] == pytest.approx([1e-3, 2e-3, 3e-3, 3e-3])
    saved = Checkpoint.load(tmp_path / "run" / "last.pt").training
    assert saved.progress["step"] == windows // 2 + 1
    assert saved.progress["tokens_seen"] == sum(window.targets.numel() for window in trainer.train_streams.windows())


def test_a_stop_inside_an_update_waits_for_its_end_and_sgd_resumes_exactly(tiny_corpus, tmp_path, monkeypatch):
    """SGD with Nesterov momentum and decay, --accumulate 2: a SIGTERM during the first window of
    an update in the second epoch saves last.pt after that update (never inside it); the resumed
    run ends with the weights, momentum buffers and schedule of an uninterrupted one."""
    settings = dict(
        SMALL, epochs=2, accumulate=2, optimizer="sgd", lr=0.5, momentum=0.8, nesterov=True, weight_decay=1e-3
    )
    straight = tmp_path / "straight"
    Trainer(tiny_config(tiny_corpus, straight, **settings)).fit()

    interrupted = tmp_path / "interrupted"
    trainer = Trainer(tiny_config(tiny_corpus, interrupted, **settings))
    windows = len(trainer.train_streams)
    original = TrainingStep._window

    def signal_in_the_first_window(self, window, state, count):
        if trainer.progress.epoch == 1 and window.index == 4:
            os.kill(os.getpid(), signal.SIGTERM)
        return original(self, window, state, count)

    monkeypatch.setattr(TrainingStep, "_window", signal_in_the_first_window)
    with pytest.raises(TrainingInterrupted):
        trainer.fit()
    monkeypatch.undo()
    saved = Checkpoint.load(interrupted / "last.pt").training
    assert saved.progress["epoch"] == 1 and saved.progress["window"] == 6
    assert saved.progress["step"] == (windows + 1) // 2 + 3
    assert all("momentum_buffer" in state for state in saved.optimizer["state"].values())
    Trainer.resume(str(interrupted)).fit()
    assert_same_run_end(straight, interrupted)


@pytest.mark.parametrize(
    "extra, fragments",
    [
        (["--optimizer", "lion"], ["--optimizer must be one of adam, adamw, sgd, rmsprop, not 'lion'"]),
        (["--momentum", "0.5"], ["--momentum applies to --optimizer sgd and rmsprop only, not adam"]),
        (["--optimizer", "sgd", "--momentum", "1"], ["--momentum must be in [0, 1), not 1.0"]),
        (
            ["--optimizer", "rmsprop", "--nesterov"],
            ["--nesterov needs --optimizer sgd with a positive --momentum, not --optimizer rmsprop"],
        ),
        (
            ["--optimizer", "sgd", "--momentum", "0", "--nesterov"],
            ["--nesterov needs --optimizer sgd with a positive --momentum, not --momentum 0"],
        ),
        (["--weight-decay", "-0.1"], ["--weight-decay must be in [0, 10], not -0.1"]),
        (["--accumulate", "0"], ["--accumulate must be at least 1, not 0"]),
        (["--accumulate", "2", "--cuda-graph"], ["--accumulate above 1 and --cuda-graph are exclusive"]),
    ],
)
def test_bad_optimizer_settings_are_one_line_errors(tiny_corpus, tmp_path, extra, fragments):
    result = cli(*tiny_train(tiny_corpus, tmp_path / "r", *extra, epochs=1))
    assert_one_line_error(result, *fragments)
    assert not (tmp_path / "r").exists()


def test_a_resumed_run_keeps_its_optimizer(trained_run):
    for flag, value in (("--optimizer", "sgd"), ("--accumulate", "2"), ("--weight-decay", "0.1")):
        assert_one_line_error(
            cli("train", "--resume", trained_run, flag, value), f"{flag} cannot change a run being resumed"
        )
