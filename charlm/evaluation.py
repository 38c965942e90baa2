"""Static evaluation: exact bits per character and perplexity over a whole split, state carried."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from charlm.batching import IGNORE, TokenStreams
from charlm.errors import CharlmError
from charlm.model import detach_state

LN2 = math.log(2.0)


@dataclass
class Score:
    """Summed negative log-likelihood over ``tokens`` predictions covering ``characters`` characters."""

    nats: float
    tokens: int
    characters: float

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
        return math.exp(self.loss)

    def as_dict(self, prefix: str = "") -> dict:
        return {
            f"{prefix}loss": self.loss,
            f"{prefix}bits_per_token": self.bits_per_token,
            f"{prefix}bpc": self.bpc,
            f"{prefix}perplexity": self.perplexity,
            f"{prefix}tokens": self.tokens,
        }


def characters_per_token(corpus, split: str) -> float:
    """1 for character and byte corpora; the split's characters per subword token otherwise."""
    if corpus.unit != "subword":
        return 1.0
    return corpus.characters(split) / corpus.tokens(split)


def window_nats(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Summed NLL of a window's predictions, padding excluded."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1), ignore_index=IGNORE, reduction="sum")


@torch.no_grad()
def score_tokens(model, tokens: np.ndarray, *, batch_size: int, bptt: int, device, chars_per_token: float = 1.0, progress=None) -> Score:
    """Score every symbol of ``tokens`` after the first, carrying state across windows."""
    was_training = model.training
    model.eval()
    streams = TokenStreams(tokens, batch_size, bptt, cover_all=True)
    state = model.initial_state(batch_size, device=device)
    nats = 0.0
    for window in streams.windows(device=device):
        logits, state = model(window.inputs, state)
        state = detach_state(state)
        nats += window_nats(logits, window.targets).item()
        if progress is not None:
            progress(window.targets.numel())
    model.train(was_training)
    return Score(nats, streams.tokens_scored, streams.tokens_scored * chars_per_token)


def score_split(model, corpus, split: str, *, batch_size: int, bptt: int, device, progress=None) -> Score:
    return score_tokens(
        model,
        corpus.split(split),
        batch_size=batch_size,
        bptt=bptt,
        device=device,
        chars_per_token=characters_per_token(corpus, split),
        progress=progress,
    )


def corpus_for_checkpoint(payload: dict, data_dir=None):
    """The prepared corpus a checkpoint was trained on, checked to have the same vocabulary."""
    from charlm.corpora import load_corpus

    name = payload["config"]["corpus"]
    corpus = load_corpus(name, data_dir if data_dir is not None else payload["config"].get("data_dir"))
    if list(corpus.tokenizer.vocab) != list(payload["tokenizer"]["vocab"]):
        raise CharlmError(f"the prepared corpus {name!r} has another vocabulary than the checkpoint {payload['path']}")
    return corpus
