"""Every default of a training run, in one visible place, and loading a config file."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from charlm.errors import CharlmError


@dataclasses.dataclass
class TrainConfig:
    """A training run. Defaults follow the Lattice Recurrent Unit paper's fair comparison."""

    corpus: str = "pydoc"
    cell: str = "lstm"
    layers: int = 1
    hidden: int | None = None  # hidden size; None with no params budget means 256
    params: str | None = None  # parameter budget such as "1M"; chooses the hidden size
    embed_size: int | None = None
    dropout: float = 0.0
    cell_options: dict = dataclasses.field(default_factory=dict)
    batch_size: int = 250
    bptt: int = 50
    lr: float = 1e-3
    lr_decay: float = 0.9  # learning rate multiplied by this after every epoch
    epochs: int = 20
    patience: int = 3  # stop after this many epochs without a better validation bpc
    clip: float = 5.0  # gradient-norm clipping threshold (0: off)
    seed: int = 1
    device: str = "auto"
    train_fraction: float = 1.0
    eval_batch_size: int = 16
    eval_every: int = 0  # also evaluate on validation every K steps (0: only at epoch ends)
    log_every: int = 50  # write a step record to metrics.jsonl every K steps
    max_minutes: float | None = None  # stop (and still evaluate) after this much training time
    data_dir: str | None = None
    run_dir: str | None = None
    init_from: str | None = None

    def validate(self) -> None:
        checks = [
            (self.layers >= 1, "--layers must be at least 1"),
            (self.hidden is None or self.hidden >= 1, "--hidden must be at least 1"),
            (self.hidden is None or self.params is None, "give --hidden or --params, not both"),
            (self.batch_size >= 1, "--batch-size must be at least 1"),
            (self.bptt >= 1, "--bptt must be at least 1"),
            (self.lr > 0, "--lr must be positive"),
            (self.lr_decay > 0, "--lr-decay must be positive"),
            (self.epochs >= 1, "--epochs must be at least 1"),
            (self.patience >= 1, "--patience must be at least 1"),
            (self.clip >= 0, "--clip must be zero (off) or positive"),
            (0 < self.train_fraction <= 1, "--train-fraction must be in (0, 1]"),
            (0 <= self.dropout < 1, "--dropout must be in [0, 1)"),
            (self.eval_batch_size >= 1, "--eval-batch-size must be at least 1"),
            (self.device in ("auto", "cpu", "cuda") or self.device.startswith("cuda:"), "--device must be auto, cpu or cuda"),
            (self.max_minutes is None or self.max_minutes > 0, "--max-minutes must be positive"),
        ]
        for ok, message in checks:
            if not ok:
                raise CharlmError(message)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict) -> "TrainConfig":
        known = {field.name for field in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise CharlmError(f"unknown training settings: {', '.join(unknown)}")
        return cls(**values)


def read_config_file(path: str | Path) -> dict:
    """A JSON object of training settings (keys as in TrainConfig, e.g. "cell_options": {...})."""
    path = Path(path)
    try:
        values = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CharlmError(f"config file {path} does not exist") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CharlmError(f"config file {path} is not valid JSON: {error}") from None
    if not isinstance(values, dict):
        raise CharlmError(f"config file {path} must hold a JSON object")
    return {key.replace("-", "_"): value for key, value in values.items()}


@dataclasses.dataclass
class BenchmarkSettings:
    """`charlm bench`: models sized to one budget, timed on synthetic data."""

    budget: int = 1_000_000
    layers: int = 1
    vocab_size: int = 82
    batch_size: int = 250
    bptt: int = 50
    steps: int = 5  # timed training steps after one warm-up step
    sample_length: int = 200
    device: str = "cpu"
    seed: int = 0


@dataclasses.dataclass
class DemoSettings:
    """`charlm demo`: a small LRU on the embedded pydoc corpus for a couple of minutes."""

    minutes: float = 2.0
    cell: str = "lru"
    hidden: int = 192
    layers: int = 1
    batch_size: int = 32
    bptt: int = 50
    lr: float = 3e-3
    sample_length: int = 400
    seed: int = 1
