"""How fast a run's own model trains and scores on the device it would train on, measured now.

The model, batch, window, precision and fast paths (``--compile``, ``--cuda-graph``) of the run's
settings are built as ``charlm train`` builds them (``charlm.training.setup``); a warm-up step
(compiling, capturing, a cold cache) is left out, then training steps (forward, backward, the
optimizer's step) are timed for ``TRAIN_SECONDS`` or ``TRAIN_STEPS``, whichever comes first, and the
forward pass alone on the start of the validation split, as validation scores it.
"""

from __future__ import annotations

import dataclasses
import itertools
import platform
import time

import torch

from charlm.cells import CELLS
from charlm.config import TrainConfig
from charlm.inference.scoring import score_tokens
from charlm.model import LanguageModel
from charlm.runs.provenance import device_name
from charlm.runtime.devices import resolve_device
from charlm.runtime.distributed import World
from charlm.runtime.precision import autocast, check_precision, grad_scaler, set_tf32
from charlm.runtime.seeds import torch_seed
from charlm.training.control import StopRequest, TimeBudget
from charlm.training.setup import (
    check_cuda_graph,
    check_model_fits,
    forward_pass,
    model_config_for,
    optimizer_and_schedule,
    training_tokens,
)
from charlm.tasks.config import TaskConfig
from charlm.tasks.models import build_task_model
from charlm.tasks.training import check_task_fits, masked_loss
from charlm.training.optimizers import optimizer_named
from charlm.training.step import TrainingStep, gradients_for, update_groups
from charlm.training.windows import WindowLayout

TRAIN_STEPS = 20  # timed training steps at most (one at least), after the warm-up
TRAIN_SECONDS = 2.0  # ... or until this long has passed
WARM_UP_STEPS = 3  # at most: until a fast path has compiled or captured (one step without one)
SCORE_SECONDS = 1.0  # about this long of the forward pass alone


@dataclasses.dataclass(frozen=True)
class Speed:
    """Tokens a second of a run's model on a device."""

    train: float  # forward, backward and the optimizer's step
    score: float  # the forward pass alone, as validation and test score
    adapt: float | None = None  # a step on a dynamic evaluation's segments (its streams × segment), where measured


def device_label(device_setting: str) -> str:
    """The device a setting resolves to on this machine, in words: ``cpu (x86_64, 2 threads)``,
    ``cuda:0 (NVIDIA H200)``."""
    device = resolve_device(device_setting)
    if device.type == "cpu":
        threads = torch.get_num_threads()
        return f"cpu ({platform.machine() or device_name(device)}, {threads} thread{'s' if threads != 1 else ''})"
    return f"{device} ({device_name(device)})"


def measure_speed(config: TrainConfig, corpus, adapt_shape: tuple[int, int] | None = None) -> Speed:
    """The training and scoring speeds of ``config``'s model on ``corpus``, on the device it names,
    and with ``adapt_shape`` (streams, segment) the speed of a training step of that shape, eager
    (a dynamic evaluation's). Raises ``CharlmError`` where the run could not train there (a device,
    a precision, a size)."""
    device = resolve_device(config.device)
    check_precision(config.precision, device)
    check_cuda_graph(config.cuda_graph, device)
    set_tf32(config.tf32)
    cell_class = CELLS.get(config.cell)
    model_config = model_config_for(config, corpus.vocab_size, cell_class, device)
    check_model_fits(model_config, config, device, cell_class)
    torch.manual_seed(torch_seed(config.seed))
    model = LanguageModel(model_config, cell_class).to(device)
    try:
        adapt = None
        if adapt_shape is not None:
            streams, segment = adapt_shape
            shape = dict(batch_size=streams, bptt=segment, accumulate=1, windows="contiguous", vary_bptt=False)
            eager = dataclasses.replace(config, **shape, compile=False, cuda_graph=False)
            adapt = _training_speed(model, eager, corpus, device)
        train, score = _training_speed(model, config, corpus, device), _scoring_speed(model, config, corpus, device)
        return Speed(train, score, adapt)
    finally:
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()


def _training_speed(model: LanguageModel, config: TrainConfig, corpus, device: torch.device) -> float:
    world = World()
    forward, fast_path = forward_pass(model, config, device, world)
    optimizer, _ = optimizer_and_schedule(model, config)
    step = TrainingStep(
        model,
        forward,
        optimizer,
        gradients_for(grad_scaler(config.precision, device)),
        world,
        batch_size=config.batch_size,
        clip=config.clip,
        precision=config.precision,
        device=device,
        ar=config.ar,
        tar=config.tar,
    )
    layout = WindowLayout(
        corpus.split("train")[: training_tokens(corpus, config)],
        config.batch_size,
        config.bptt,
        config.windows,
        config.vary_bptt,
        config.seed,
    )
    groups = itertools.cycle(list(update_groups(_first_windows(layout, config, device), config.accumulate)))
    stop, budget, state = StopRequest(), TimeBudget(None), None
    model.train()

    def one_step() -> int:
        nonlocal state
        group = next(groups)
        if group[0].index == 0 or state is None:  # the epoch's start, or the measurement's
            state = model.initial_state(group[0].inputs.shape[0], device=device)
        state = step(group, state, stop, budget).state
        return sum(window.targets.numel() for window in group)

    return _timed(one_step, device, settled=lambda: fast_path is None or fast_path.settled)


def _first_windows(layout: WindowLayout, config: TrainConfig, device: torch.device) -> list:
    """The first epoch's first windows: enough for the warm-up and the timed steps, or all it has."""
    wanted = (WARM_UP_STEPS + TRAIN_STEPS) * config.accumulate
    return list(itertools.islice(layout.epoch(0).windows(0, device=device), wanted))


def _scoring_speed(model: LanguageModel, config: TrainConfig, corpus, device: torch.device) -> float:
    """Tokens a second of the forward pass alone: one window of the validation split (the warm-up,
    a CUDA graph captured), then as many as fill about ``SCORE_SECONDS``, or the whole split."""
    tokens = corpus.split("valid")
    window = config.eval_batch_size * config.bptt
    windows_there = max(1, (len(tokens) - 1) // window)
    seconds, scored = _timed_score(model, config, tokens[: window + 1], device)
    wanted = min(windows_there, max(1, int(SCORE_SECONDS / max(seconds, 1e-9))))
    seconds, scored = _timed_score(model, config, tokens[: wanted * window + 1], device)
    return scored / max(seconds, 1e-9)


def _timed_score(model: LanguageModel, config: TrainConfig, tokens, device: torch.device) -> tuple[float, int]:
    started = time.perf_counter()
    with autocast(config.precision, device):
        score = score_tokens(
            model, tokens, batch_size=min(config.eval_batch_size, len(tokens) - 1), bptt=config.bptt, device=device
        )
    _synchronize(device)
    return time.perf_counter() - started, score.tokens


def measure_task_speed(config: TaskConfig) -> float:
    """Samples a second of a `charlm task` run of ``config`` (resolved) on its device: a warm-up step,
    then steps timed as a training's are."""
    task = config.make_task()
    device = resolve_device(config.device)
    check_task_fits(config, task, device, resumed=False)
    torch.manual_seed(torch_seed(config.seed))
    model = build_task_model(task, config.cell, config.hidden_size, config.layers, config.tied, config.cell_options)
    model.to(device).train()
    if getattr(model, "use_wavefront", False) and not config.wavefront:
        model.use_wavefront = False
    optimizer = optimizer_named(config.optimizer, model.parameters(), config.lr)
    generator = torch.Generator().manual_seed(torch_seed(config.seed))

    def one_step() -> int:
        batch = task.sample(generator, config.batch_size).to(device)
        loss = masked_loss(model(batch.inputs), batch)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if config.clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), config.clip)
        optimizer.step()
        loss.item()  # the training reads it back each step too
        return config.batch_size

    return _timed(one_step, device)


def _timed(one_step, device: torch.device, settled=lambda: True) -> float:
    """What ``one_step`` counts a second after its warm-up (one step, or until ``settled``, at most
    ``WARM_UP_STEPS``): for ``TRAIN_STEPS`` steps or ``TRAIN_SECONDS``, whichever comes first (one at least)."""
    for _ in range(WARM_UP_STEPS):
        one_step()
        if settled():
            break
    _synchronize(device)
    started, counted, steps = time.perf_counter(), 0, 0
    while steps < TRAIN_STEPS and (steps == 0 or time.perf_counter() - started < TRAIN_SECONDS):
        counted += one_step()
        steps += 1
    _synchronize(device)
    return counted / max(time.perf_counter() - started, 1e-9)


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()
