"""The model's two ends, where it meets the vocabulary: the embedding the symbols enter by (a table, or
one-hot input) and the softmax layer that scores the next symbol, with its own weight or tied to the table."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from charlm.errors import CharlmError


class OneHot(nn.Module):
    """Feeds the symbol straight in as a one-hot vector (no trainable embedding)."""

    def __init__(self, vocab_size: int):
        super().__init__()
        self.vocab_size = vocab_size
        self.register_buffer("dtype_probe", torch.empty(0), persistent=False)  # follows .to() and .double()

    def forward(self, tokens: Tensor) -> Tensor:
        return F.one_hot(tokens.long(), self.vocab_size).to(self.dtype_probe.dtype)


def input_layer(vocab_size: int, embed_size: int) -> tuple[nn.Module, int]:
    """The embedding of ``embed_size`` (0: one-hot input) and the width the bottom layer reads."""
    if embed_size == 0:
        return OneHot(vocab_size), vocab_size
    return nn.Embedding(vocab_size, embed_size), embed_size


def softmax_layer(
    embedding: nn.Module, top_size: int, vocab_size: int, tie: bool, bias: bool
) -> tuple[nn.Module, nn.Linear]:
    """The projection before the softmax layer and the layer itself. Untied, the projection is nothing
    and the layer reads the top layer's ``top_size`` outputs. Tied (``tie``), the layer's weight is the
    embedding table, one Parameter, so it reads the embedding's width: where the top layer's output is
    as wide, directly, else through a bias-free linear projection to that width (Press & Wolf 2017)."""
    if not tie:
        return nn.Identity(), nn.Linear(top_size, vocab_size, bias=bias)
    if not isinstance(embedding, nn.Embedding):
        raise CharlmError("--tie-weights needs an embedding table to share with the softmax, not --embed-size 0")
    width = embedding.embedding_dim
    projection = nn.Identity() if width == top_size else nn.Linear(top_size, width, bias=False)
    head = nn.Linear(width, vocab_size, bias=bias)
    head.weight = embedding.weight
    return projection, head
