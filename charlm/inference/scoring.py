"""Static evaluation: exact bits per character and perplexity over a whole split, state carried."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from charlm.corpora.streams import IGNORE, TokenStreams, check_streams_fit
from charlm.runtime.cuda_graphs import ScoringForward
from charlm.runtime.fast_path_check import FastPathCheck

LN2 = math.log(2.0)


@dataclass
class Score:
    """Summed negative log-likelihood over ``tokens`` predictions covering ``characters`` characters."""

    nats: float
    tokens: int
    characters: float
    token_nats: np.ndarray | None = None  # each prediction's NLL in text order, when asked for
    fast_path: FastPathCheck | None = None  # the scoring graph's first-use check (None: no graph was tried)

    @property
    def loss(self) -> float:
        """Mean NLL per token, in nats."""
        return self.nats / self.tokens

    @property
    def bits_per_token(self) -> float:
        return self.loss / LN2

    @property
    def bpc(self) -> float:
        return self.nats / LN2 / self.characters

    @property
    def perplexity(self) -> float:
        return math.exp(self.loss) if self.loss < 700 else math.inf

    def as_dict(self, prefix: str = "") -> dict:
        return {
            f"{prefix}loss": self.loss,
            f"{prefix}bits_per_token": self.bits_per_token,
            f"{prefix}bpc": self.bpc,
            f"{prefix}perplexity": self.perplexity,
            f"{prefix}tokens": self.tokens,
        }


def characters_per_token(corpus, split: str) -> float:
    """1 for character and byte corpora; the split's characters per token for word and subword
    corpora (spaces and line breaks counted: the characters of the text the tokens stand for)."""
    if corpus.unit in ("char", "byte"):
        return 1.0
    return corpus.characters(split) / corpus.tokens(split)


def window_nats(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Summed NLL of a window's predictions, padding excluded."""
    return token_nats(logits, targets).sum()


def token_nats(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """NLL of each prediction (0 where padded), in at least single precision."""
    logits = logits.reshape(-1, logits.shape[-1])
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    return F.cross_entropy(logits, targets.reshape(-1), ignore_index=IGNORE, reduction="none").view(targets.shape)


@torch.inference_mode()
def score_tokens(
    model,
    tokens: np.ndarray,
    *,
    batch_size: int,
    bptt: int,
    device,
    chars_per_token: float = 1.0,
    progress=None,
    per_token: bool = False,
    rows: slice = slice(None),
    cuda_graph: bool = True,
) -> Score:
    """Score every symbol of ``tokens`` after the first, carrying state across windows.

    ``per_token=True`` also returns each prediction's NLL in text order (``Score.token_nats``).
    ``rows``: score only these streams (one process's share); the nats are then that share's and
    the token counts the whole split's, so the shares' nats add up to the split's score.
    """
    device = torch.device(device if device is not None else "cpu")
    was_training = model.training
    model.eval()
    streams = TokenStreams(tokens, batch_size, bptt, cover_all=True, rows=rows)
    state = model.initial_state(streams.rows, device=device)
    forward = ScoringForward(model, device, len(streams), enabled=cuda_graph)  # on a GPU, replayed from a CUDA graph
    # Summed where computed, so a GPU never waits for the CPU between windows (MPS has no float64).
    total_on = torch.device("cpu") if device.type == "mps" else device
    nats = torch.zeros((), dtype=torch.float64, device=total_on)
    columns = []
    for window in streams.windows(device=device):
        logits, state = forward(window.inputs, state)
        each = token_nats(logits, window.targets)
        nats += each.sum().to(total_on)
        if per_token:
            columns.append(each.double().cpu())
        if progress is not None:
            progress(window.targets.numel())
    model.train(was_training)
    score = Score(nats.item(), streams.tokens_scored, streams.tokens_scored * chars_per_token, fast_path=forward.check)
    if per_token:
        # stream b holds a contiguous stretch of the text, so row-major order is text order
        score.token_nats = torch.cat(columns, dim=1).reshape(-1)[: streams.tokens_scored].numpy()
    return score


def check_splits_fit(corpus, splits, batch_size: int, owner: type, field: str = "batch_size") -> None:
    """Refuse, before any scoring, ``batch_size`` streams over a split of ``splits`` (None entries are
    skipped) with fewer predictions; the error names ``owner``'s ``field``."""
    for split in dict.fromkeys(name for name in splits if name is not None):
        check_streams_fit(batch_size, corpus.split(split), owner, field, f"the {split} split of {corpus.name!r}")


def score_split(
    model,
    corpus,
    split: str,
    *,
    batch_size: int,
    bptt: int,
    device,
    progress=None,
    rows: slice = slice(None),
    cuda_graph: bool = True,
) -> Score:
    return score_tokens(
        model,
        corpus.split(split),
        batch_size=batch_size,
        bptt=bptt,
        device=device,
        chars_per_token=characters_per_token(corpus, split),
        progress=progress,
        rows=rows,
        cuda_graph=cuda_graph,
    )
