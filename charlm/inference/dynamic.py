"""Dynamic evaluation: adapting the weights to the text while scoring it, test-then-train.

The split is cut into segments of ``segment`` steps (over ``batch_size`` parallel streams laid
out as in static evaluation, every symbol after the first scored once). For each segment s:

1. score it with the current weights θ and the carried state: its summed NLL is added to the total;
2. only then update θ on L_s, the mean NLL over the segment's real (unpadded) tokens;
3. carry the state, detached, into segment s + 1.

No symbol is ever scored by weights that were updated on it, so the total is a legitimate online
code length. Two update rules are provided.

SGD, the dynamic evaluation of the Delta-RNN paper (Ororbia et al., 2017)::

    θ ← θ − η ∇θ L_s

RMS, Krause et al. (2018), "Dynamic Evaluation of Neural Sequence Models". Before evaluating,
mean squared gradients are collected once over the training split (eval mode, state carried,
mean loss of each batch of ``segment`` steps)::

    MS     = (1/K) Σ_k (∇θ L_k)²                       per parameter, K training batches
    decay  = √MS / (mean over tensors of mean(√MS)),    clipped at 1/λ
    θ ← θ − η ∇θ L_s / (√MS + ε) + λ · decay ⊙ (θ₀ − θ)

where θ₀ are the trained weights: the second term pulls each parameter back towards θ₀, harder
where the training gradients were large, and never past θ₀ (λ · decay ≤ 1).
"""

from __future__ import annotations

import contextlib
import math
from typing import Callable

import numpy as np
import torch
from torch import Tensor

from charlm.corpora.streams import IGNORE, TokenStreams
from charlm.config_inference import DynamicOptions
from charlm.errors import CharlmError
from charlm.inference.scoring import Score, token_nats, window_nats
from charlm.model import detach_state

METHODS = ("sgd", "rms")


class DynamicDiverged(CharlmError):
    """The adapted model produced a non-finite loss (the step size is too large)."""


def trainable_parameters(model) -> list[torch.nn.Parameter]:
    return [parameter for parameter in model.parameters() if parameter.requires_grad]


class SGDUpdate:
    """θ ← θ − η ∇θ L_s"""

    def __init__(self, model, lr: float):
        self.parameters = trainable_parameters(model)
        self.lr = lr

    @torch.no_grad()
    def __call__(self) -> None:
        for parameter in self.parameters:
            if parameter.grad is not None:
                parameter.add_(parameter.grad, alpha=-self.lr)


class RMSUpdate:
    """θ ← θ − η ∇θ L_s / (√MS + ε) + λ · decay ⊙ (θ₀ − θ), θ₀ the weights at construction."""

    def __init__(self, model, rms: list[Tensor], lr: float, decay: float, eps: float):
        self.parameters = trainable_parameters(model)
        if len(rms) != len(self.parameters):
            raise ValueError("gradient statistics do not match the model's parameters")
        self.lr = lr
        self.trained = [parameter.detach().clone() for parameter in self.parameters]
        self.inverse_scale = [1.0 / (root + eps) for root in rms]
        self.pull = [decay * rate for rate in decay_rates(rms, decay)]

    @torch.no_grad()
    def __call__(self) -> None:
        for parameter, trained, inverse_scale, pull in zip(
            self.parameters, self.trained, self.inverse_scale, self.pull
        ):
            step = pull * (trained - parameter)
            if parameter.grad is not None:
                step.addcmul_(parameter.grad, inverse_scale, value=-self.lr)
            parameter.add_(step)


def decay_rates(rms: list[Tensor], decay: float) -> list[Tensor]:
    """decay = √MS / (mean over tensors of mean(√MS)), clipped at 1/λ (unclipped when λ = 0)."""
    global_scale = sum(root.mean() for root in rms) / len(rms)
    rates = [root / global_scale if global_scale > 0 else torch.zeros_like(root) for root in rms]
    if decay > 0:
        rates = [rate.clamp(max=1.0 / decay) for rate in rates]
    return rates


def collect_gradient_statistics(
    model,
    tokens: np.ndarray,
    *,
    segment: int,
    batch_size: int,
    max_batches: int | None = None,
    device=None,
    progress=None,
) -> tuple[list[Tensor], int]:
    """√MS for every trainable parameter, and K: MS = (1/K) Σ_k (∇θ L_k)².

    L_k is the mean loss of training batch k (``batch_size`` streams × ``segment`` steps), taken
    in eval mode with state carried across batches; ``max_batches`` bounds K.
    """
    parameters = trainable_parameters(model)
    squares = [torch.zeros_like(parameter) for parameter in parameters]
    batch_size = max(1, min(batch_size, len(tokens) // (segment + 1)))
    streams = TokenStreams(tokens, batch_size, segment)
    state = model.initial_state(batch_size, device=device)
    batches = 0
    with _backward_in_eval_mode(model):
        for window in streams.windows(device=device):
            if max_batches is not None and batches >= max_batches:
                break
            model.zero_grad(set_to_none=True)
            logits, state = model(window.inputs, state)
            state = detach_state(state)
            loss = window_nats(logits, window.targets) / window.targets.numel()
            if not torch.isfinite(loss):
                raise DynamicDiverged(
                    f"the training loss is not finite at batch {batches} while collecting gradient statistics"
                )
            loss.backward()
            with torch.no_grad():
                for square, parameter in zip(squares, parameters):
                    if parameter.grad is not None:
                        square.addcmul_(parameter.grad, parameter.grad)
            batches += 1
            if progress is not None:
                progress(window.targets.numel(), loss.item() * window.targets.numel())
    model.zero_grad(set_to_none=True)
    if batches == 0:
        raise CharlmError("the training split is too short to collect gradient statistics")
    return [torch.sqrt(square / batches) for square in squares], batches


def make_update(model, options: DynamicOptions, rms: list[Tensor] | None = None) -> Callable[[], None]:
    """The update rule of ``options.method``, anchored (for rms) at the model's current weights."""
    if options.method == "sgd":
        return SGDUpdate(model, options.lr)
    if rms is None:
        raise ValueError("rms dynamic evaluation needs gradient statistics")
    return RMSUpdate(model, rms, options.lr, options.decay, options.eps)


def dynamic_score(
    model,
    tokens: np.ndarray,
    update: Callable[[], None],
    *,
    segment: int,
    batch_size: int = 1,
    device=None,
    chars_per_token: float = 1.0,
    progress: Callable[[int, float], None] | None = None,
    per_token: bool = False,
) -> Score:
    """Score every symbol of ``tokens`` after the first, test-then-train, leaving θ adapted.

    ``per_token=True`` also returns each prediction's NLL in text order (``Score.token_nats``).

    ``update`` is called after the gradient of each segment's mean loss has been computed (and
    after the segment's score has been recorded); ``progress(tokens, nats)`` after each segment.
    """
    streams = TokenStreams(tokens, batch_size, segment, cover_all=True)
    state = model.initial_state(batch_size, device=device)
    total = 0.0
    columns = []
    with _backward_in_eval_mode(model):
        for window in streams.windows(device=device):
            model.zero_grad(set_to_none=True)
            logits, state = model(window.inputs, state)
            state = detach_state(state)
            each = token_nats(logits, window.targets)
            nats = each.sum()
            if per_token:
                columns.append(each.detach().double().cpu())
            segment_nats = nats.item()  # the score, fixed before any update on this segment
            if not math.isfinite(segment_nats):
                raise DynamicDiverged(
                    f"dynamic evaluation diverged at segment {window.index} (non-finite loss): lower --dyn-lr"
                )
            total += segment_nats
            real = int((window.targets != IGNORE).sum())
            (nats / real).backward()
            update()
            if progress is not None:
                progress(real, segment_nats)
    model.zero_grad(set_to_none=True)
    score = Score(total, streams.tokens_scored, streams.tokens_scored * chars_per_token)
    if per_token:
        score.token_nats = torch.cat(columns, dim=1).reshape(-1)[: streams.tokens_scored].numpy()
    return score


@contextlib.contextmanager
def _backward_in_eval_mode(model):
    """Eval mode (no dropout) with gradients. cuDNN's fused RNNs only differentiate in training
    mode, so cuDNN is switched off for the duration; other backends are unaffected."""
    was_training, cudnn_enabled = model.training, torch.backends.cudnn.enabled
    model.eval()
    torch.backends.cudnn.enabled = False
    try:
        with torch.enable_grad():
            yield
    finally:
        torch.backends.cudnn.enabled = cudnn_enabled
        model.train(was_training)
