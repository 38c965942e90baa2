"""Every default of charlm, in one visible place per concern: the settings of training here (``TrainConfig``),
those of using a model in ``charlm.config_inference`` and those of the tools in ``charlm.config_tools``,
each job's as a typed dataclass.

Each field carries its help text and its bounds (``setting(...)``, ``charlm.settings``). ``validate``
checks the bounds for Python callers; the command line builds its options, their help and their range checks from
the same fields (``charlm.cli.options``), so a default or a bound is written once, here.

Names: a ``*Config`` is the settings of one job (TrainConfig, EvalConfig, BenchmarkConfig, ...);
``*Options`` are a part of another config (``DynamicOptions``; a cell's ``--cell-opt`` options).
"""

from __future__ import annotations

import dataclasses
import math
import os
import re

from charlm.errors import ConfigError, shown
from charlm.settings import INT64_MAX, from_dict, renamed, setting, validate

DEFAULT_HIDDEN = 256  # hidden size when neither a hidden size nor a parameter budget is given
MAX_LAYERS = 1024  # bounds of what makes sense, shown in the help: far beyond any model in the papers
MAX_WIDTH = 2**20  # --hidden, --embed-size: terabytes of weights already
MAX_LR = 1000  # learning rates: SGD's largest in use is AWD-LSTM's 30
MAX_WEIGHT_DECAY = 10
MAX_DYNAMIC_LR = 100
MAX_SAMPLE_LENGTH = 10**9  # --length, Model.sample: the symbols drawn are all kept (ids, the text), gigabytes already
DIST_TIMEOUT_MINUTES = 10.0  # --dist-timeout: how long a torchrun process waits for the others
DEVICE_PATTERN = re.compile(r"auto|cpu|mps|cuda(:\d+)?")
OPTIMIZERS = ("adam", "adamw", "sgd", "rmsprop")  # --optimizer; built by charlm.training.optimizers
DEFAULT_MOMENTUM = {"sgd": 0.9, "rmsprop": 0.0}  # --momentum when not given, for the optimizers that have one
DEFAULT_WEIGHT_DECAY = {"adamw": 0.01}  # --weight-decay when not given (torch's AdamW default); 0 for the others


@dataclasses.dataclass
class TrainConfig:
    """A training run. The defaults suit a user's own text (batch 32, Adam at 3e-3, × 0.9 per epoch: the
    demo's settings, which learn fast on corpora of a few million characters); each paper's protocol
    (the LRU paper's batch 250 at 1e-3, the Delta-RNN paper's batch 64 with plateau halving) is
    written out in full in its plan (``charlm sweep PLAN``)."""

    corpus: str = setting(
        "pydoc", "Prepared corpus to train on (see `charlm corpora`); a path to a text file is taken as --text FILE."
    )
    text: list[str] = setting(
        [],
        "Your own UTF-8 text file (or directory; repeatable) to train on: prepared first as `charlm prepare "
        "text` does (split 90/5/5) into a corpus named after the first file (or --corpus NAME) in the data root, "
        "and reused while the files' sha256 are unchanged.",
        show_default="none",
    )
    cell: str = setting("lstm", "Recurrent cell (see `charlm cells`), or module:Class for your own.")
    layers: int = setting(1, "Number of stacked recurrent layers.", min=1, max=MAX_LAYERS)
    hidden_size: int | None = setting(
        None,
        "Hidden size n.",
        flag="--hidden",
        min=1,
        max=MAX_WIDTH,
        show_default=f"{DEFAULT_HIDDEN} when neither --hidden nor --params is given",
    )
    params: str | None = setting(
        None,
        "Parameter budget such as 1M or 2.5e6, or the size of a reference model such as lstm@100 (an LSTM of 100 "
        "units on this corpus; with options: lstm[peephole=full]@100): chooses the hidden size whose total count "
        "is closest.",
        show_default="none",
    )
    embed_size: int | None = setting(
        None,
        "Embedding width; 0 feeds one-hot symbols.",
        min=0,
        max=MAX_WIDTH,
        show_default="what the cell needs, else n",
    )
    dropout: float = setting(0.0, "Dropout between layers and on the softmax input.", min=0, max=1, max_open=True)
    wiring: str = setting(
        "stacked",
        "How layers are wired: stacked (cell on cell, the papers' protocol up to 2017) or block (each cell in a "
        "residual block with RMSNorm, a causal convolution and a gated MLP, as the recurrences of 2023-2025 are "
        "published).",
        choices=("stacked", "block"),
    )
    block_conv: int = setting(4, "--wiring block: the causal convolution's width (0: none).", min=0, max=16)
    block_expansion: float = setting(
        3.0, "--wiring block: the gated MLP's width over the hidden size (0: none).", min=0, max=16
    )
    cell_options: dict = setting({}, "Options of the cell (--cell-opt key=value).", cli=False)
    batch_size: int = setting(32, "Parallel streams per step (the LRU paper's protocol: 250).", min=1)
    bptt: int = setting(50, "Truncated backpropagation window (steps).", min=1)
    lr: float = setting(
        3e-3, "Initial learning rate (the LRU paper's protocol: 1e-3).", min=0, min_open=True, max=MAX_LR
    )
    lr_decay: float = setting(
        0.9, "Learning rate factor applied after every epoch (--schedule epoch-decay).", min=0, min_open=True
    )
    schedule: str = setting(
        "epoch-decay",
        "Learning-rate schedule: epoch-decay (× --lr-decay every epoch; the LRU paper), plateau-halving (× "
        "--plateau-factor after an epoch whose validation loss did not improve, down to --min-lr; the Delta-RNN "
        "paper), constant, or warmup-cosine (linear warmup over --warmup-steps, then a cosine down to --min-lr).",
        choices=("epoch-decay", "plateau-halving", "constant", "warmup-cosine"),
    )
    min_lr: float = setting(0.0, "Lower bound of plateau-halving; the final rate of warmup-cosine.", min=0, max=MAX_LR)
    plateau_factor: float = setting(
        0.5,
        "plateau-halving: the rate's factor after an epoch without improvement.",
        min=0,
        max=1,
        min_open=True,
        max_open=True,
    )
    warmup_steps: int = setting(0, "warmup-cosine: steps of linear warmup.", min=0)
    epochs: int = setting(20, "Maximum number of epochs (with --resume: the new total).", min=1)
    patience: int = setting(3, "Stop after this many epochs without a better validation bpc.", min=1)
    clip: float = setting(5.0, "Gradient-norm clipping threshold, 0 for none.", min=0)
    optimizer: str = setting(
        "adam",
        "Optimizer: adam (β = 0.9, 0.999), adamw (Adam with decoupled weight decay), sgd (with --momentum, "
        "--nesterov; wants a far larger --lr than Adam, 0.1 to 1) or rmsprop (α = 0.99).",
        choices=OPTIMIZERS,
    )
    weight_decay: float | None = setting(
        None,
        "Weight decay of every weight: adamw's is decoupled (each update also multiplies the weights by 1 − lr × "
        "decay); adam's, sgd's and rmsprop's is L2 (decay × weight added to the gradient).",
        min=0,
        max=MAX_WEIGHT_DECAY,
        show_default="0.01 for adamw, else 0",
    )
    momentum: float | None = setting(
        None,
        "Momentum of sgd and rmsprop (only those).",
        min=0,
        max=1,
        max_open=True,
        show_default="0.9 for sgd, 0 for rmsprop",
    )
    nesterov: bool = setting(False, "sgd: Nesterov momentum (needs a positive --momentum).")
    accumulate: int = setting(
        1,
        "Windows (K) whose gradients are summed into each optimizer update (gradient accumulation: each window's "
        "loss is divided by K, so one update is a step on the K windows' mean loss, clipped as a whole; "
        "--log-every, --eval-every, --save-every and --warmup-steps count updates).",
        min=1,
    )
    seed: int = setting(1, "Random seed (initialisation, dropout).")
    device: str = setting("auto", "auto, cpu, cuda, cuda:N or mps.")
    precision: str = setting(
        "fp32",
        "Arithmetic of the forward pass: fp32, bf16 (CPU or GPU) or fp16 (GPU, with a gradient scaler); the loss "
        "is always float32.",
        choices=("fp32", "bf16", "fp16"),
    )
    compile: bool = setting(
        False,
        "Run the training forward pass through torch.compile (the first step compiles; falls back to eager where "
        "it cannot).",
    )
    cuda_graph: bool = setting(
        False,
        "CUDA only: capture the forward and backward of a training window as CUDA graphs once and replay them "
        "(checked against eager on first use; falls back to eager where capture or the check fails).",
    )
    tf32: bool = setting(
        False,
        "CUDA only: let float32 matrix products and cuDNN run on TensorFloat-32 units (a 10-bit mantissa; faster "
        "on Ampere and later). Off by default, so fp32 is float32 in charlm's own loops and in cuDNN alike.",
    )
    train_fraction: float = setting(
        1.0, "Train on this leading fraction of the training split (0.2, 0.4, ...).", min=0, max=1, min_open=True
    )
    eval_batch_size: int = setting(
        16,
        "Streams used to score validation/test; when not given, lowered (with a note) to what a split too short "
        "for 16 allows.",
        min=1,
    )
    eval_fraction: float = setting(
        1.0,
        "Score validation during training on this leading fraction of the validation split (the same tokens "
        "every time; nanoGPT's eval_iters): faster with a small --train-fraction. The test score at the end is "
        "always the whole split.",
        min=0,
        max=1,
        min_open=True,
    )
    eval_every: int = setting(0, "Also score validation every K steps (0: epoch ends only).", min=0)
    log_every: int = setting(50, "Write a step record to metrics.jsonl every K steps.", min=1)
    print_every: int = setting(
        0,
        "Also print a training-loss line (step, loss, bpc, rate, speed) every K steps, on the terminal and in "
        "train.log; 0: the progress bar only.",
        min=0,
    )
    save_every: str = setting(
        "5m", "Also save last.pt inside an epoch, every N steps (500) or every N minutes (5m); 0: at epoch ends only."
    )
    keep_checkpoints: int = setting(
        0,
        "Also keep the N latest epoch-end checkpoints, weights only (no optimizer state), named with the epoch "
        "and the validation score: epoch03-valid1.8420.pt (bpc), epoch03-ppl141.27.pt on word corpora "
        "(perplexity per word); 0: only best.pt and last.pt.",
        min=0,
    )
    max_minutes: float | None = setting(
        None,
        "Stop training after this many minutes (the run is evaluated and resumable).",
        min=0,
        min_open=True,
        show_default="no limit",
    )
    max_tokens: int | None = setting(
        None,
        "Stop training once the run has trained on this many tokens (every stream of every process, over all its "
        "sessions); the run is evaluated and resumable with a larger budget. The same data for every cell of a "
        "comparison.",
        min=1,
        show_default="no limit",
    )
    data_dir: str | None = setting(None, "Root of prepared corpora.", show_default="$CHARLM_DATA or ./data")
    run_dir: str | None = setting(None, "Where to write checkpoints and metrics.", show_default="runs/CORPUS-CELL-TIME")
    init_from: str | None = setting(None, "Start from this checkpoint's weights (fine-tuning).", show_default="none")
    test_every_epoch: bool = setting(
        False,
        "Score the test split at every epoch end too (learning curves); by default only the best-validation "
        "weights are scored on test, once, at the end.",
    )
    tensorboard: bool = setting(False, "Also write every metrics record to TensorBoard (needs charlm[tensorboard]).")
    wandb: bool = setting(
        False,
        "Also log every metrics record to Weights & Biases (needs charlm[wandb]); the W&B run is named after the "
        "run directory and a resumed run goes on in the same W&B run. WANDB_MODE=offline logs to local files "
        "only.",
    )
    wandb_project: str | None = setting(None, "The W&B project of --wandb.", show_default="$WANDB_PROJECT or charlm")
    dist_timeout: float = setting(
        DIST_TIMEOUT_MINUTES,
        "Under torchrun: minutes a process waits for the others (to join, or at a collective) before it stops "
        "with a one-line error. Long enough for rank 0 to save a large model's checkpoint while the others wait; "
        "short enough that a frozen process is noticed in minutes, not PyTorch's 30. Raise it for models whose "
        "checkpoint takes longer to write.",
        min=0,
        max=10080,
        min_open=True,
    )

    def validate(self) -> None:
        validate(self)
        changed = [name for name in ("block_conv", "block_expansion") if getattr(self, name) != _DEFAULTS[name]]
        if self.wiring == "stacked" and changed:
            raise ConfigError(TrainConfig, changed[0], "needs --wiring block")
        if self.hidden_size is not None and self.params is not None:
            raise ConfigError(TrainConfig, "hidden_size", "and --params are exclusive: give one, not both")
        if not DEVICE_PATTERN.fullmatch(self.device):
            raise ConfigError(TrainConfig, "device", f"must be auto, cpu, cuda, cuda:N or mps, not {self.device!r}")
        if not isinstance(self.cell_options, dict) or not all(isinstance(key, str) for key in self.cell_options):
            raise ConfigError(TrainConfig, "cell_options", "must be a mapping of option names to values")
        if not isinstance(self.text, list) or not all(isinstance(path, str) and path for path in self.text):
            raise ConfigError(TrainConfig, "text", f"must be a list of file paths, not {shown(self.text)}")
        save_interval(self.save_every)
        for name in ("data_dir", "run_dir"):  # a file where the directory belongs: said now, named by its flag
            if getattr(self, name) and os.path.isfile(getattr(self, name)):
                raise ConfigError(TrainConfig, name, f"must be a directory: {getattr(self, name)} is a file")
        if self.cuda_graph and self.compile:
            raise ConfigError(TrainConfig, "cuda_graph", "and --compile are exclusive: give one, not both")
        if self.min_lr >= self.lr and self.schedule in ("plateau-halving", "warmup-cosine"):
            raise ConfigError(
                TrainConfig, "min_lr", f"must be below --lr ({self.lr:g}) for {self.schedule}, not {self.min_lr:g}"
            )
        self._validate_optimizer()

    def _validate_optimizer(self) -> None:
        """The settings that only some optimizers have, and gradient accumulation."""
        if self.momentum is not None and self.optimizer not in DEFAULT_MOMENTUM:
            raise ConfigError(
                TrainConfig, "momentum", f"applies to --optimizer sgd and rmsprop only, not {self.optimizer}"
            )
        if self.nesterov and (self.optimizer != "sgd" or self.effective_momentum == 0):
            used = f"--optimizer {self.optimizer}" if self.optimizer != "sgd" else "--momentum 0"
            raise ConfigError(TrainConfig, "nesterov", f"needs --optimizer sgd with a positive --momentum, not {used}")
        if self.accumulate > 1 and self.cuda_graph:
            raise ConfigError(
                TrainConfig,
                "accumulate",
                "above 1 and --cuda-graph are exclusive (a captured backward "
                "reuses its gradient buffers at every window): give one, not both",
            )

    @property
    def effective_momentum(self) -> float | None:
        """``momentum``, or the optimizer's default; None for the optimizers without one."""
        if self.optimizer not in DEFAULT_MOMENTUM:
            return None
        return DEFAULT_MOMENTUM[self.optimizer] if self.momentum is None else self.momentum

    @property
    def effective_weight_decay(self) -> float:
        """``weight_decay``, or the optimizer's default."""
        return DEFAULT_WEIGHT_DECAY.get(self.optimizer, 0.0) if self.weight_decay is None else self.weight_decay

    @property
    def save_interval(self) -> tuple[str, float] | None:
        """``("steps", n)``, ``("seconds", s)`` or None: when to save ``last.pt`` inside an epoch."""
        return save_interval(self.save_every)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict) -> "TrainConfig":
        """From plain values (a config file, a checkpoint); unknown keys and wrong types are errors. A
        file written before 0.4 names the hidden size ``hidden`` (``charlm.settings.renamed``)."""
        return from_dict(cls, renamed(values))


_DEFAULTS = {field.name: field.default for field in dataclasses.fields(TrainConfig)}


def save_interval(text: str) -> tuple[str, float] | None:
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
        raise ConfigError(
            TrainConfig, "save_every", f"must be a number of steps (500) or of minutes (5m), not {shown(text)}"
        )
    if value == 0:
        return None
    return ("seconds", value * unit) if unit else ("steps", value)


# Settings that may differ between a run and its resumption; the rest define the run.
RESUMABLE_SETTINGS = (
    "epochs",
    "max_minutes",
    "max_tokens",
    "device",
    "precision",
    "compile",
    "cuda_graph",
    "tf32",
    "patience",
    "eval_every",
    "log_every",
    "print_every",
    "save_every",
    "keep_checkpoints",
    "test_every_epoch",
    "tensorboard",
    "wandb",
    "wandb_project",
    "data_dir",
    "dist_timeout",
)
