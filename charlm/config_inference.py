"""The settings of using a trained model: scoring a split (``EvalConfig``) or any text (``ScoreConfig``),
sampling (``SampleConfig``), serving (``ServeConfig``) and dynamic evaluation (``DynamicOptions``), each
field with its help and bounds as in ``charlm.config``.
"""

from __future__ import annotations

import dataclasses

from charlm.config import MAX_DYNAMIC_LR, MAX_SAMPLE_LENGTH
from charlm.settings import setting, validate


@dataclasses.dataclass
class EvalConfig:
    """`charlm eval` and `Model.evaluate`: static scoring of a split."""

    split: str = setting("test", "Split to score.", choices=("valid", "test"))
    batch_size: int = setting(16, "Parallel streams; every symbol is scored once whatever the value.", min=1)
    bptt: int | None = setting(None, "Window length.", min=1, show_default="the training bptt")


@dataclasses.dataclass
class ScoreConfig:
    """`charlm score` and `Model.score`: scoring any text."""

    unknown: str = setting(
        "error",
        "Characters outside the vocabulary: error names them, skip drops them "
        "(counted), unk maps them to the vocabulary's unknown entry.",
        choices=("error", "skip", "unk"),
    )
    batch_size: int = setting(1, "Parallel streams (1: the text in order, exact).", min=1)


@dataclasses.dataclass
class SampleConfig:
    """`charlm sample` and `Model.sample`."""

    length: int = setting(500, "Symbols (tokens) to generate per sample.", min=0, max=MAX_SAMPLE_LENGTH)
    temperature: float = setting(
        1.0,
        "Softmax temperature: below 1 is more conservative; 0 is greedy, the likeliest symbol at each step "
        "(as --beam 1).",
        min=0,
    )
    top_k: int = setting(0, "Draw only from the k most likely symbols (0: off).", min=0)
    top_p: float = setting(
        1.0, "Draw only from the smallest set with this much probability (1: off).", min=0, max=1, min_open=True
    )
    seed: int | None = setting(None, "Random seed: the same seed gives the same text.", show_default="random")
    num_samples: int = setting(1, "How many samples to draw (separated by a blank line).", min=1)
    beam: int = setting(
        0,
        "Beam width: 0 draws at random; N returns the most probable continuation a beam search of "
        "width N finds (1: greedy, the likeliest symbol at each step). Deterministic.",
        min=0,
    )
    length_penalty: float = setting(
        1.0,
        "Beam search: a continuation's score is its log probability / length^alpha "
        "(1: per symbol; 0: in total); it decides only between continuations that "
        "--stop ended at different lengths.",
        min=0,
    )
    stop: list[str] = setting(
        [],
        "End a sample once the text generated after the prime contains this string; the "
        "output ends with it. Repeatable: the first one generated ends the sample.",
        show_default="none",
    )


DEFAULT_PRIME = "\n"  # what sampling starts from when no prime is given (a line break)


@dataclasses.dataclass
class ServeConfig:
    """`charlm serve`: where it listens and the limits every request is held to."""

    host: str = setting(
        "127.0.0.1",
        "Address to listen on (0.0.0.0: every interface; anyone who can reach the machine can use the models).",
    )
    port: int = setting(8000, "Port to listen on (0: any free port, printed at start).", min=0, max=65535)
    api_key: str | None = setting(
        None,
        "Require 'Authorization: Bearer KEY' on every /v1 request (also read from CHARLM_API_KEY).",
        show_default="none, or $CHARLM_API_KEY",
    )
    max_body: int = setting(1_000_000, "Largest request body, in bytes.", min=1024)
    max_prompt: int = setting(2_000, "Longest sampling prompt, in characters.", min=1)
    max_text: int = setting(20_000, "Longest text to score or look inside, in characters.", min=2)
    max_length: int = setting(2_000, "Most symbols one sample may ask for.", min=1)
    max_samples: int = setting(4, "Most samples one request may ask for.", min=1)
    max_beam: int = setting(16, "Widest beam search one request may ask for (its time grows with the width).", min=1)
    concurrency: int = setting(2, "Requests computed at once (sampling, scoring, activations).", min=1)
    queue: int = setting(8, "Requests that may wait for a turn; beyond them the server answers 503 busy.", min=0)


@dataclasses.dataclass
class DynamicOptions:
    """Every setting of a dynamic evaluation (see charlm.inference.dynamic), with its default."""

    method: str = setting(
        "sgd", "sgd (Delta-RNN paper) or rms (Krause et al. 2018).", choices=("sgd", "rms"), cli=False
    )
    lr: float | None = setting(
        None, "Step size η.", flag="--dyn-lr", min=0, max=MAX_DYNAMIC_LR, show_default="0.01 sgd, 0.0001 rms"
    )
    decay: float = setting(0.01, "rms: λ, the pull back towards the trained weights.", flag="--dyn-decay", min=0, max=1)
    eps: float = setting(
        1e-5, "rms: ε added to the RMS of the training gradients.", flag="--dyn-eps", min=0, min_open=True
    )
    segment: int = setting(
        20, "Steps per segment, one update after each; the static figure uses the same segments.", min=1
    )
    batch_size: int = setting(1, "Parallel streams (1: adapts on the text strictly in order, exact).", min=1, cli=False)
    stat_batch_size: int = setting(
        100, "rms: streams per training batch for the statistics.", flag="--dyn-stat-batch-size", min=1
    )
    stat_batches: int | None = setting(
        None,
        "rms: collect gradient statistics on at most this many training batches.",
        flag="--dyn-stat-batches",
        min=1,
        show_default="the whole training split",
    )

    def __post_init__(self):
        if self.lr is None and self.method in DEFAULT_DYNAMIC_LR:
            self.lr = DEFAULT_DYNAMIC_LR[self.method]

    def validate(self) -> None:
        validate(self)

    def hyperparameters(self) -> dict:
        values = {"method": self.method, "lr": self.lr, "segment": self.segment, "batch_size": self.batch_size}
        if self.method == "rms":
            values.update(
                decay=self.decay, eps=self.eps, stat_batch_size=self.stat_batch_size, stat_batches=self.stat_batches
            )
        return values


DEFAULT_DYNAMIC_LR = {"sgd": 0.01, "rms": 1e-4}  # η of DynamicOptions by method
DEFAULT_SEARCH_PREFIX = 50_000  # characters of the validation split that --dyn-search scores
