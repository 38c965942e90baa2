"""The rules of ``TrainConfig`` across its fields, and the parsers of its settings written as text
(``--save-every``, ``--adam-betas``; ``owner`` is the config class their errors name the flag of).

Each field declares its own bounds (``charlm.settings``); what one field allows depending on another
(``--vary-bptt`` needs ``--windows shifted``, ``--nesterov`` needs sgd) is checked here, at
``TrainConfig.validate``, for the command line and Python alike.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re

from charlm.errors import ConfigError, shown
from charlm.settings import INT64_MAX

DEVICE_PATTERN = re.compile(r"auto|cpu|mps|cuda(:\d+)?")
DEFAULT_MOMENTUM = {"sgd": 0.9, "rmsprop": 0.0}  # --momentum when not given, for the optimizers that have one


def check_training_rules(config) -> None:
    """The rules of a run's settings (a ``TrainConfig``) across fields (each field's own bounds are declared
    with it)."""
    TrainConfig = type(config)  # the owner each error names the flag of
    changed = [
        name for name in ("block_conv", "block_expansion") if getattr(config, name) != _default(TrainConfig, name)
    ]
    if config.wiring == "stacked" and changed:
        raise ConfigError(TrainConfig, changed[0], "needs --wiring block")
    if config.tie_weights and config.embed_size == 0:
        raise ConfigError(
            TrainConfig, "tie_weights", "needs an embedding table to share with the softmax, not --embed-size 0"
        )
    if config.hidden_size is not None and config.params is not None:
        raise ConfigError(TrainConfig, "hidden_size", "and --params are exclusive: give one, not both")
    if not DEVICE_PATTERN.fullmatch(config.device):
        raise ConfigError(TrainConfig, "device", f"must be auto, cpu, cuda, cuda:N or mps, not {config.device!r}")
    if not isinstance(config.cell_options, dict) or not all(isinstance(key, str) for key in config.cell_options):
        raise ConfigError(TrainConfig, "cell_options", "must be a mapping of option names to values")
    if not isinstance(config.text, list) or not all(isinstance(path, str) and path for path in config.text):
        raise ConfigError(TrainConfig, "text", f"must be a list of file paths, not {shown(config.text)}")
    config.save_interval  # refuses a malformed --save-every
    for name in ("data_dir", "run_dir"):  # a file where the directory belongs: said now, named by its flag
        if getattr(config, name) and os.path.isfile(getattr(config, name)):
            raise ConfigError(TrainConfig, name, f"must be a directory: {getattr(config, name)} is a file")
    if config.vary_bptt and config.windows != "shifted":
        raise ConfigError(TrainConfig, "vary_bptt", f"needs --windows shifted, not --windows {config.windows}")
    if config.vary_bptt and config.cuda_graph:
        raise ConfigError(
            TrainConfig,
            "vary_bptt",
            "and --cuda-graph are exclusive (a captured graph replays one window length): give one, not both",
        )
    _check_regularisers(config)
    if config.cuda_graph and config.compile:
        raise ConfigError(TrainConfig, "cuda_graph", "and --compile are exclusive: give one, not both")
    if config.min_lr >= config.lr and config.schedule in ("plateau-halving", "warmup-cosine"):
        raise ConfigError(
            TrainConfig, "min_lr", f"must be below --lr ({config.lr:g}) for {config.schedule}, not {config.min_lr:g}"
        )
    _check_optimizer(config)


def _check_regularisers(config) -> None:
    """AWD-LSTM's locked dropouts in place of --dropout, and AR/TAR off CUDA graphs."""
    TrainConfig = type(config)
    for name in ("dropout_hidden", "dropout_output"):
        if getattr(config, name) > 0 and config.dropout > 0:
            raise ConfigError(
                TrainConfig,
                name,
                "and --dropout are exclusive (AWD-LSTM's locked dropout is in place of --dropout, a mask per window "
                "where --dropout draws one every step): give one, not both",
            )
    for name in ("ar", "tar"):
        if getattr(config, name) > 0 and config.cuda_graph:
            raise ConfigError(
                TrainConfig, name, "and --cuda-graph are exclusive (a captured window returns its logits only)"
            )


def _check_optimizer(config) -> None:
    """The settings that only some optimizers have, and gradient accumulation."""
    TrainConfig = type(config)
    if config.momentum is not None and config.optimizer not in DEFAULT_MOMENTUM:
        raise ConfigError(
            TrainConfig, "momentum", f"applies to --optimizer sgd and rmsprop only, not {config.optimizer}"
        )
    if config.nesterov and (config.optimizer != "sgd" or config.effective_momentum == 0):
        used = f"--optimizer {config.optimizer}" if config.optimizer != "sgd" else "--momentum 0"
        raise ConfigError(TrainConfig, "nesterov", f"needs --optimizer sgd with a positive --momentum, not {used}")
    if config.adam_betas is not None:
        if config.optimizer not in ("adam", "adamw"):
            raise ConfigError(
                TrainConfig, "adam_betas", f"applies to --optimizer adam and adamw only, not {config.optimizer}"
            )
        config.effective_adam_betas  # refuses a malformed value
    if config.decay_on != "all" and config.effective_weight_decay == 0:
        raise ConfigError(TrainConfig, "decay_on", f"{config.decay_on} needs a positive --weight-decay")
    if config.accumulate > 1 and config.cuda_graph:
        raise ConfigError(
            TrainConfig,
            "accumulate",
            "above 1 and --cuda-graph are exclusive (a captured backward "
            "reuses its gradient buffers at every window): give one, not both",
        )


def _default(owner, name: str):
    return next(field.default for field in dataclasses.fields(owner) if field.name == name)


def save_interval(text: str, owner) -> tuple[str, float] | None:
    """``--save-every``: ``"500"`` → ("steps", 500), ``"5m"`` → ("seconds", 300), ``"0"`` → None."""
    cleaned = str(text).strip().lower()
    unit = {"s": 1, "m": 60, "h": 3600}.get(cleaned[-1:], None)
    number = cleaned[:-1] if unit else cleaned
    try:
        value = float(number) if unit else int(number)
    except ValueError:
        value = math.nan
    finite = value <= INT64_MAX if isinstance(value, int) else math.isfinite(value)  # a step count of 400 digits too
    if not (finite and value >= 0):
        raise ConfigError(owner, "save_every", f"must be a number of steps (500) or of minutes (5m), not {shown(text)}")
    if value == 0:
        return None
    return ("seconds", value * unit) if unit else ("steps", value)


def adam_betas(text: str, owner) -> tuple[float, float]:
    """``--adam-betas``: ``"0.9,0.99"`` → (0.9, 0.99), each in [0, 1)."""
    parts = str(text).replace(" ", "").split(",")
    try:
        betas = tuple(float(part) for part in parts)
    except ValueError:
        betas = ()
    if len(betas) != 2 or not all(0 <= beta < 1 for beta in betas):
        raise ConfigError(owner, "adam_betas", f"must be two numbers in [0, 1) such as 0.9,0.99, not {shown(text)}")
    return betas
