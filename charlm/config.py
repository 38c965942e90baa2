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

from charlm.config_rules import DEFAULT_MOMENTUM, adam_betas, check_training_rules, save_interval
from charlm.settings import from_dict, renamed, setting, validate

DEFAULT_HIDDEN = 256  # hidden size when neither a hidden size nor a parameter budget is given
MAX_LAYERS = 1024  # bounds of what makes sense, shown in the help: far beyond any model in the papers
MAX_WIDTH = 2**20  # --hidden, --embed-size: terabytes of weights already
MAX_LR = 1000  # learning rates: SGD's largest in use is AWD-LSTM's 30
MAX_WEIGHT_DECAY = 10
MAX_DYNAMIC_LR = 100
MAX_ACTIVATION_PENALTY = 1000  # --ar, --tar: AWD-LSTM's are 2 and 1
MAX_SAMPLE_LENGTH = 10**9  # --length, Model.sample: the symbols drawn are all kept (ids, the text), gigabytes already
DIST_TIMEOUT_MINUTES = 10.0  # --dist-timeout: how long a torchrun process waits for the others
OPTIMIZERS = ("adam", "adamw", "sgd", "rmsprop")  # --optimizer; built by charlm.training.optimizers
DEFAULT_WEIGHT_DECAY = {"adamw": 0.01}  # --weight-decay when not given (torch's AdamW default); 0 for the others
ADAM_BETAS = (0.9, 0.999)  # --adam-betas when not given (torch's default)
DECAY_ON = ("all", "matrices", "matrices-no-embedding")  # --decay-on; the groups: charlm.training.optimizers


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
    dropout: float = setting(
        0.0,
        "Dropout between layers and on the softmax input (a fresh mask each step); in a stack of residual blocks "
        "(transformer, mamba, --wiring block) on the embedding and each block's branches instead, as GPT-2.",
        min=0,
        max=1,
        max_open=True,
    )
    dropout_embed: float = setting(
        0.0,
        "Embedding dropout (AWD-LSTM's dropoute): each training window drops whole symbols, zeroing their rows of "
        "the embedding table and scaling the others by 1/(1 − p).",
        min=0,
        max=1,
        max_open=True,
    )
    dropout_input: float = setting(
        0.0,
        "Locked (variational) dropout on the embedding output (AWD-LSTM's dropouti): one mask per stream and "
        "window, the same at every step.",
        min=0,
        max=1,
        max_open=True,
    )
    dropout_hidden: float = setting(
        0.0,
        "Locked dropout between layers (AWD-LSTM's dropouth); in place of --dropout there.",
        min=0,
        max=1,
        max_open=True,
    )
    dropout_output: float = setting(
        0.0,
        "Locked dropout on the softmax input (AWD-LSTM's dropout); in place of --dropout there.",
        min=0,
        max=1,
        max_open=True,
    )
    weight_drop: float = setting(
        0.0,
        "DropConnect on the recurrent (hidden-to-hidden) matrices (AWD-LSTM's wdrop): one mask per training window, "
        "the same at every step; also with the fused cuDNN/oneDNN LSTM, GRU and RNN kernels. Cells without "
        "recurrent matrices refuse it.",
        min=0,
        max=1,
        max_open=True,
    )
    ar: float = setting(
        0.0,
        "Activation regularisation (AWD-LSTM's alpha): adds ar × the mean square of the top layer's dropped output "
        "to the training loss (not to the reported loss).",
        min=0,
        max=MAX_ACTIVATION_PENALTY,
    )
    tar: float = setting(
        0.0,
        "Temporal activation regularisation (AWD-LSTM's beta): adds tar × the mean square of the difference between "
        "the top layer's consecutive (undropped) outputs to the training loss (not to the reported loss).",
        min=0,
        max=MAX_ACTIVATION_PENALTY,
    )
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
    tie_weights: bool = setting(
        False,
        "Share the embedding table with the softmax layer's weight (Press & Wolf 2017; nanoGPT and AWD-LSTM do): "
        "where the top layer's output is not as wide as the embedding, a linear projection to the embedding's "
        "width (no bias) comes before the softmax. Needs an embedding, not --embed-size 0.",
    )
    head_bias: bool = setting(True, "A bias in the softmax layer (AWD-LSTM's has one, nanoGPT's none).")
    cell_options: dict = setting({}, "Options of the cell (--cell-opt key=value).", cli=False)
    batch_size: int = setting(32, "Parallel streams per step (the LRU paper's protocol: 250).", min=1)
    bptt: int = setting(50, "Truncated backpropagation window (steps).", min=1)
    windows: str = setting(
        "contiguous",
        "How training cuts the text into windows: contiguous (the batch's streams read in order and cut at the same "
        "places every epoch, the state carried from window to window: the LRU, Delta-RNN and Grid LSTM papers), "
        "shifted (the same streams started at a random offset below bptt each epoch, so that the cuts move; the state "
        "carried) or random (each window's rows read from random offsets, each from a fresh state: nanoGPT's "
        "sampling; an epoch is as many windows as contiguous gives). The draws follow the seed and the epoch; "
        "validation and test are always contiguous.",
        choices=("contiguous", "shifted", "random"),
    )
    vary_bptt: bool = setting(
        False,
        "--windows shifted: AWD-LSTM's window lengths, each drawn from a normal of mean bptt (with probability 0.95, "
        "else bptt/2) and standard deviation 5, at least 5; each update's learning rate scaled by its windows' length "
        "over bptt, as AWD-LSTM does (the records show the unscaled rate).",
    )
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
        "paper), constant, or warmup-cosine (linear warmup over --warmup-steps, then a cosine down to --min-lr at "
        "the run's last step: that of --epochs, or of --max-tokens where it ends the run first).",
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
        "Optimizer: adam (β = 0.9, 0.999; --adam-betas), adamw (Adam with decoupled weight decay), sgd (with "
        "--momentum, --nesterov; wants a far larger --lr than Adam, 0.1 to 1) or rmsprop (α = 0.99).",
        choices=OPTIMIZERS,
    )
    weight_decay: float | None = setting(
        None,
        "Weight decay of the weights --decay-on names (every weight by default): adamw's is decoupled (each update "
        "also multiplies the weights by 1 − lr × decay); adam's, sgd's and rmsprop's is L2 (decay × weight added to "
        "the gradient).",
        min=0,
        max=MAX_WEIGHT_DECAY,
        show_default="0.01 for adamw, else 0",
    )
    decay_on: str = setting(
        "all",
        "The parameters --weight-decay decays: all; matrices (every parameter of two or more dimensions: the "
        "weight matrices and the embedding table, not biases, norm gains or other vectors, as nanoGPT); "
        "matrices-no-embedding (the same without the embedding table, and so without a softmax tied to it).",
        choices=DECAY_ON,
    )
    adam_betas: str | None = setting(
        None,
        "Adam's β₁,β₂ (adam and adamw only), as two numbers in [0, 1) such as 0.9,0.99 (nanoGPT's).",
        show_default="0.9,0.999",
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
        """Every field within its bounds, and the rules across fields (``charlm.config_rules``)."""
        validate(self)
        check_training_rules(self)

    @property
    def effective_momentum(self) -> float | None:
        """``momentum``, or the optimizer's default; None for the optimizers without one."""
        if self.optimizer not in DEFAULT_MOMENTUM:
            return None
        return DEFAULT_MOMENTUM[self.optimizer] if self.momentum is None else self.momentum

    @property
    def effective_adam_betas(self) -> tuple[float, float]:
        """``adam_betas`` as two numbers, or Adam's default."""
        return ADAM_BETAS if self.adam_betas is None else adam_betas(self.adam_betas, type(self))

    @property
    def effective_weight_decay(self) -> float:
        """``weight_decay``, or the optimizer's default."""
        return DEFAULT_WEIGHT_DECAY.get(self.optimizer, 0.0) if self.weight_decay is None else self.weight_decay

    @property
    def save_interval(self) -> tuple[str, float] | None:
        """``("steps", n)``, ``("seconds", s)`` or None: when to save ``last.pt`` inside an epoch."""
        return save_interval(self.save_every, type(self))

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict) -> "TrainConfig":
        """From plain values (a config file, a checkpoint); unknown keys and wrong types are errors. A
        file written before 0.4 names the hidden size ``hidden`` (``charlm.settings.renamed``)."""
        return from_dict(cls, renamed(values))


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
