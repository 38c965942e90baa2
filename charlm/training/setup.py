"""A training run's parts, built from its config: the cell, the device and the torchrun world, the
model's size and whether it fits, the forward pass a step calls, the optimizer and its schedule,
the training streams; and the checks of the settings and of a checkpoint to resume from that come
before any of them is built.

Each choice that depends on the config (DistributedDataParallel, ``torch.compile``, CUDA graphs,
fp16 scaling) is made here, once, so the step and the loop never branch on it.
"""

from __future__ import annotations

import contextlib
import dataclasses

import torch
from torch.nn.parallel import DistributedDataParallel

from charlm.cells import CELLS
from charlm.cells.block import block_activation_factor
from charlm.checkpoint import Checkpoint
from charlm.checkpoint_checks import check_against_model, compare_weights
from charlm.config import DEFAULT_HIDDEN, TrainConfig
from charlm.corpora.catalog import TrainedOn
from charlm.corpora.streams import check_streams_fit
from charlm.errors import CharlmError, ConfigError
from charlm.inference.scoring import check_splits_fit
from charlm.model import LanguageModel, ModelConfig, count_parameters
from charlm.sizing import budget_of, size_for_budget
from charlm.regularisers import REGULARISER_FIELDS
from charlm.runtime.compiling import CompiledForward
from charlm.runtime.training_graphs import graphed_window
from charlm.runtime.devices import resolve_device
from charlm.runtime.distributed import World, device_for_rank, world_from_environment
from charlm.runtime.memory import check_budget_fits, check_fits, estimate_training_memory
from charlm.runtime.precision import check_precision, set_tf32
from charlm.runs import tensorboard, wandb_sink
from charlm.training.optimizers import build_optimizer, decay_groups
from charlm.training.control import tokens_used_up
from charlm.training.resume import read_progress
from charlm.training.schedules import Schedule
from charlm.training.windows import WindowLayout
from charlm.logs import get_logger, info


def cell_class_for(config: TrainConfig, resumed_run=None, checkpoint=None, cells=(), trust_code: bool = False):
    """The cell to train. A new run's caller named it (it may be a ``module:Class``); a resumed
    run's checkpoint or config.json names it, and importing a user cell then needs ``cells`` or
    ``trust_code``."""
    if checkpoint is not None:
        return checkpoint.cell_class(cells, trust_code)
    if resumed_run is not None:
        return CELLS.resolve(config.cell, cells=cells, trust_code=trust_code, source=str(resumed_run.config_file))
    return CELLS.get(config.cell)


def check_cuda_graph(cuda_graph: bool, device: torch.device) -> None:
    """One line when ``--cuda-graph`` is asked for off a CUDA device."""
    if cuda_graph and device.type != "cuda":
        raise CharlmError(f"--cuda-graph needs a CUDA device, not {device.type}")


def placement(config: TrainConfig) -> tuple[torch.device, World]:
    """The device this process trains on and its place among torchrun's processes, with the
    precision and ``--cuda-graph`` checked against that device."""
    device = resolve_device(config.device)
    check_precision(config.precision, device)
    set_tf32(config.tf32)
    check_cuda_graph(config.cuda_graph, device)
    world = world_from_environment(device, timeout_minutes=config.dist_timeout)
    check_streams_per_process(config, world)
    return device_for_rank(device, world), world


def check_streams_per_process(config: TrainConfig, world: World) -> None:
    """Refuse a batch that leaves a torchrun process without a stream to carry (it would train and
    score on nothing, and its share of the state would be empty)."""
    for name in ("batch_size", "eval_batch_size"):
        streams = getattr(config, name)
        if streams < world.size:
            raise ConfigError(
                TrainConfig,
                name,
                f"is {streams}, fewer streams than the {world.size} processes: give each process at least one",
            )


def check_streams(config: TrainConfig, corpus) -> None:
    """Refuse, before anything is written, a ``--batch-size`` with more streams than the training
    tokens used have predictions, or an ``--eval-batch-size`` with more than a split it scores (found
    otherwise at the first epoch's end, after the run directory exists)."""
    check_streams_fit(
        config.batch_size,
        corpus.split("train")[: training_tokens(corpus, config)],
        TrainConfig,
        "batch_size",
        f"the training split of {config.corpus!r}"
        + ("" if config.train_fraction == 1 else f" (its first {config.train_fraction:g}, --train-fraction)"),
    )
    check_splits_fit(corpus, ("valid", "test"), config.eval_batch_size, TrainConfig, "eval_batch_size")


def training_tokens(corpus, config: TrainConfig) -> int:
    """How many tokens of the training split a run trains on: its first ``train_fraction``."""
    return max(2, int(len(corpus.split("train")) * config.train_fraction))


def model_config_for(
    config: TrainConfig, vocab_size: int, cell_class=None, device: torch.device | None = None
) -> ModelConfig:
    """The model a training config describes: its hidden size given, or sized to its budget.
    With ``device``, a budget whose optimizer state alone cannot fit there is refused first."""
    model_config = ModelConfig(
        cell=config.cell,
        vocab_size=vocab_size,
        hidden_size=config.hidden_size or DEFAULT_HIDDEN,
        layers=config.layers,
        embed_size=config.embed_size,
        dropout=config.dropout,
        cell_options=dict(config.cell_options),
        wiring=config.wiring,
        block_conv=config.block_conv,
        block_expansion=config.block_expansion,
        tie_weights=config.tie_weights,
        head_bias=config.head_bias,
        **{name: getattr(config, name) for name in REGULARISER_FIELDS},
    )
    if config.params is not None:
        budget = budget_of(config.params, model_config)
        if device is not None:
            check_budget_fits(budget, device)
        hidden_size, _ = size_for_budget(model_config, budget, cell_class=cell_class)
        model_config = dataclasses.replace(model_config, hidden_size=hidden_size)
    return model_config


def check_model_fits(model_config: ModelConfig, config: TrainConfig, device: torch.device, cell_class=None) -> None:
    """Refuse, before allocating it, a model that ``device`` cannot train (``charlm.runtime.memory``)."""
    with torch.device("meta"):
        shape = LanguageModel(model_config, cell_class)
    embed_size = getattr(shape.embedding, "embedding_dim", 0)
    activation_factor = (cell_class or CELLS.get(model_config.cell)).activation_factor
    batch_size = max(config.batch_size, config.eval_batch_size)
    carried = sum(part.numel() for layer in shape.initial_state(batch_size, device="meta") for part in layer)
    if model_config.wiring == "block":
        activation_factor += block_activation_factor(model_config.block_conv, model_config.block_expansion)
    estimate = estimate_training_memory(
        count_parameters(shape),
        activation_factor,
        model_config.hidden_size,
        model_config.layers,
        model_config.vocab_size,
        embed_size,
        batch_size,
        config.bptt,
        cuda_graph=config.cuda_graph,
        carried_values=carried,
    )
    check_fits(estimate, device, advice=oversize_advice(model_config, count_parameters(shape), cell_class))


def oversize_advice(model_config: ModelConfig, parameters: int, cell_class=None) -> str:
    """What to change in a model too large to train, naming the options at fault first: ``--embed-size``
    or ``--layers`` where setting it back to its default would at least halve the parameters."""
    faults = []
    for flag, default in (("--embed-size", {"embed_size": None}), ("--layers", {"layers": 1})):
        smaller = dataclasses.replace(model_config, **default)
        if smaller != model_config:
            with torch.device("meta"):
                if 2 * count_parameters(LanguageModel(smaller, cell_class)) <= parameters:
                    faults.append(flag)
    named = " and ".join(f"a smaller {flag}" if flag == "--embed-size" else f"fewer {flag}" for flag in faults)
    memory = "a smaller --cell-opt memory (the past keys and values each stream carries), or " * bool(
        model_config.cell_options.get("memory")
    )
    return (
        f"use {memory}{named} (most of its size comes from {'it' if len(faults) == 1 else 'them'}), or "
        if faults
        else f"use {memory}"
    ) + "a smaller --hidden or --params, or a smaller --batch-size or --bptt"


def forward_pass(model: LanguageModel, config: TrainConfig, device: torch.device, world: World):
    """What a training step calls for a window's logits: the model, inside DistributedDataParallel
    under torchrun, then compiled (``--compile``) or replayed from CUDA graphs (``--cuda-graph``), for
    full windows only (this process's streams × bptt: a run resumed at an epoch's shorter last window
    does not compile or capture that one). Returns it and its fast path, the wrapper a first step
    settles and ``reporting.FastPathReport`` reports (None: the forward pass is the model's own)."""
    rows = world.share(config.batch_size)
    window_shape = (rows.stop - rows.start, config.bptt)
    plain = model
    if world.distributed:
        plain = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    forward = plain
    if config.compile:
        forward = CompiledForward(forward, device, window_shape=window_shape)
    if config.cuda_graph:
        forward = graphed_window(forward, device, world.distributed, window_shape)
    return forward, (None if forward is plain else forward)


def optimizer_and_schedule(model: LanguageModel, config: TrainConfig, windows_per_epoch: int | list[int] = 1):
    """The optimizer (``charlm.training.optimizers``), and its learning rate's schedule
    (``charlm.training.schedules``), whose steps are updates: ``accumulate`` windows each, over
    ``epochs`` epochs of ``windows_per_epoch`` windows (or of each epoch's count, a list), or as many
    as ``max_tokens`` allows where it is fewer."""
    counts = windows_per_epoch if isinstance(windows_per_epoch, list) else [windows_per_epoch] * config.epochs
    total_steps = sum(updates_per_epoch(count, config.accumulate) for count in counts)
    if config.max_tokens:  # a token budget that ends the run first ends the schedule there too
        total_steps = min(total_steps, -(-config.max_tokens // (config.batch_size * config.bptt * config.accumulate)))
    optimizer = build_optimizer(decay_groups(model, config.decay_on), config)
    return optimizer, Schedule(
        optimizer,
        config.schedule,
        lr=config.lr,
        lr_decay=config.lr_decay,
        min_lr=config.min_lr,
        plateau_factor=config.plateau_factor,
        warmup_steps=config.warmup_steps,
        total_steps=total_steps,
    )


def check_training_state(training, model, config, path) -> None:
    """The training state of a checkpoint a run resumes from, before anything is built: its schedule
    put back into the run's own, built over ``model`` (the meta-device model ``check_against_model``
    returned: nothing is allocated); the carried state against the model's, and the random-number states
    on generators of their own. Whatever torch refuses is one line naming the file. (The optimizer's
    state is put back by ``resume.restore``, which says the same of it.)"""
    _, schedule = optimizer_and_schedule(model, config)
    part = "learning-rate schedule"
    try:
        if training.scheduler is not None:
            schedule.scheduler.load_state_dict(training.scheduler)
        part = "carried"
        if training.hidden is not None:
            expected = model.initial_state(config.batch_size, device="meta")
            dtype = next(model.parameters()).dtype
            if [[(tuple(t.shape), t.dtype) for t in layer] for layer in training.hidden] != [
                [(tuple(t.shape), dtype) for t in layer] for layer in expected
            ]:
                raise ValueError("its shapes or precision are not those of the model it describes")
        part = "random-number"
        rng = training.rng
        for state in [rng["torch"]] + [rank["torch"] for rank in rng.get("ranks") or ()]:
            torch.Generator().set_state(state)
    except (RuntimeError, ValueError, TypeError, KeyError, IndexError, AttributeError) as error:
        reason = str(error).strip().splitlines()[0][:200] if str(error).strip() else type(error).__name__
        raise CharlmError(f"{path}: its {part} state does not fit this run ({reason})") from None


def updates_per_epoch(windows: int, accumulate: int) -> int:
    """Optimizer updates in an epoch of ``windows``: one per ``accumulate`` windows, and one for a
    shorter last group."""
    return -(-windows // accumulate)


def gradient_sync_pause(forward):
    """What the windows of an update but its last run inside: DistributedDataParallel's ``no_sync``
    where ``forward`` is or wraps one (the gradients then add up on each process and are averaged
    once, in the last window's backward), else a context that does nothing."""
    inner = forward
    while not isinstance(inner, DistributedDataParallel) and hasattr(inner, "network"):
        inner = inner.network
    return inner.no_sync if isinstance(inner, DistributedDataParallel) else contextlib.nullcontext


def training_windows(corpus, config: TrainConfig, world: World) -> WindowLayout:
    """The windows of the first ``train_fraction`` of the training split, epoch by epoch, laid out
    as ``--windows`` says (``charlm.training.windows``), of which this process reads its share of the rows."""
    tokens = corpus.split("train")
    used = training_tokens(corpus, config)
    layout = WindowLayout(
        tokens[:used],
        config.batch_size,
        config.bptt,
        config.windows,
        config.vary_bptt,
        config.seed,
        rows=world.share(config.batch_size),
    )
    streams = layout.contiguous
    if streams.stream_length < config.bptt and config.windows != "random":
        get_logger().warning(
            f"warning: --batch-size {config.batch_size} cuts the {used:,} training tokens into streams "
            f"of {streams.stream_length} tokens, shorter than one --bptt window ({config.bptt}): an "
            "epoch is a single short step; a smaller --batch-size trains more steps"
        )
    return layout


def settings_from_init(settings: dict) -> dict:
    """``settings`` (a new run's, as given) with what ``init_from``'s checkpoint says of the model filled
    in where they say nothing: its cell, size, layers, embedding, dropout and cell options, and its
    corpus (its vocabulary). A value given here that differs is left to ``load_initial_weights`` to refuse."""
    reference = settings.get("init_from")
    if not reference:
        return settings
    checkpoint = Checkpoint.load(reference)
    model, trained = checkpoint.model_config, checkpoint.train_config
    known = {
        "cell": model.cell,
        "hidden_size": model.hidden_size,
        "layers": model.layers,
        "embed_size": trained.embed_size,
        "dropout": model.dropout,
        "cell_options": model.cell_options,
        "wiring": model.wiring,
        "block_conv": model.block_conv,
        "block_expansion": model.block_expansion,
        "tie_weights": model.tie_weights,
        "head_bias": model.head_bias,
        **{name: getattr(model, name) for name in REGULARISER_FIELDS},
        "corpus": trained.corpus,
    }
    filled = dict(settings)
    for name, value in known.items():
        if name in filled or (name == "hidden_size" and "params" in filled):
            continue
        filled[name] = value
    return filled


def load_initial_weights(model: LanguageModel, model_config: ModelConfig, corpus, config: TrainConfig) -> None:
    """``init_from``: start from another run's weights (the same model, the same vocabulary)."""
    reference = config.init_from
    if not reference:
        return
    checkpoint = Checkpoint.load(reference)
    if checkpoint.model_config != model_config:
        theirs, ours = checkpoint.model_config.to_dict(), model_config.to_dict()
        differences = ", ".join(
            f"{key} {theirs[key]!r} there, {ours[key]!r} here" for key in ours if theirs.get(key) != ours[key]
        )
        raise ConfigError(TrainConfig, "init_from", f"{reference} holds another model ({differences})")
    if checkpoint.tokenizer["vocab"] != corpus.tokenizer.vocab:
        raise ConfigError(
            TrainConfig, "init_from", f"{reference}: its vocabulary differs from corpus {config.corpus!r}"
        )
    compare_weights(checkpoint.weights, model.state_dict(), checkpoint.path)
    model.load_state_dict(checkpoint.weights)
    trained_on = TrainedOn.of(checkpoint.provenance)
    if checkpoint.train_config.corpus == corpus.name and trained_on is not None and not trained_on.matches(corpus):
        info(
            f"note: {checkpoint.path} trained on an earlier version of corpus {corpus.name!r}; "
            "this run starts from its weights on the corpus as it is now"
        )


def checked_settings(config: TrainConfig) -> TrainConfig:
    """``config``, its settings checked, and the packages its sinks need present."""
    if not isinstance(config, TrainConfig):
        raise CharlmError(f"config must be a charlm.TrainConfig, not {type(config).__name__}")
    config.validate()
    if config.tensorboard:
        tensorboard.check_available()
    if config.wandb:
        wandb_sink.check_available()
    return config


def check_checkpoint(checkpoint: Checkpoint, cell_class, config: TrainConfig) -> None:
    """The checkpoint a run resumes from, before anything is built or written: its weights,
    optimizer and carried state against the model's shapes (on the meta device), and a
    ``--max-tokens`` budget left to train."""
    shape = check_against_model(checkpoint, cell_class)
    if checkpoint.training is not None:
        check_training_state(checkpoint.training, shape, checkpoint.train_config, checkpoint.path)
    progress = read_progress(checkpoint)
    if tokens_used_up(progress.tokens_seen, config.max_tokens):
        raise CharlmError(
            f"the run has already trained on {progress.tokens_seen:,} tokens, its --max-tokens budget of "
            f"{config.max_tokens:,}: give a larger --max-tokens to go on"
        )
