"""One optimization step on one window, the same code for one process and for torchrun.

What differs between runs is chosen once, when the step is built: the forward pass the step calls
(the model, wrapped by DistributedDataParallel, ``torch.compile`` or CUDA graphs; see
``setup.forward_pass``) and how gradients are taken (:class:`PlainGradients`, or
:class:`ScaledGradients` under fp16). Nothing is branched on per step.

Under torchrun the processes agree, through two sums, on the loss (all stop when it is not finite)
and on whether Ctrl-C, SIGTERM or the time budget ends training after this step; on one process
these sums are the values themselves.

The loss of a window is the mean over every stream of every process. Each process computes the mean
over its own rows and scales it by ``world.size × its tokens / all tokens``; DistributedDataParallel
averages the processes' gradients, which makes that the gradient of the mean over all streams. On a
single process the scale is exactly 1.
"""

from __future__ import annotations

import dataclasses
import math

import torch
from torch import nn

from charlm.corpora.streams import Window
from charlm.model import detach_state
from charlm.runtime.distributed import World
from charlm.runtime.precision import autocast, float32_state
from charlm.training.control import LossNotFinite, StopRequest, TimeBudget


class PlainGradients:
    """Backward and optimizer step in full or bf16 precision."""

    def backward(self, loss: torch.Tensor, optimizer: torch.optim.Optimizer) -> None:
        loss.backward()

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        optimizer.step()


class ScaledGradients:
    """fp16: the loss scaled before backward, the gradients unscaled before their norms and the
    clipping, and a step skipped (by the scaler) when they overflowed."""

    def __init__(self, scaler: torch.amp.GradScaler):
        self.scaler = scaler

    def backward(self, loss: torch.Tensor, optimizer: torch.optim.Optimizer) -> None:
        self.scaler.scale(loss).backward()
        self.scaler.unscale_(optimizer)

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        self.scaler.step(optimizer)
        self.scaler.update()


@dataclasses.dataclass
class StepResult:
    loss: float  # mean nats per token over every stream of every process
    tokens: int  # tokens of the window over every process
    grad_norms: dict[str, float]  # per layer group, before clipping
    state: list  # the carried state for the next window, detached, float32
    stop_requested: bool  # Ctrl-C or SIGTERM in any process
    out_of_time: bool  # the time budget is used up in any process


class TrainingStep:
    """Forward, loss, backward, per-layer gradient norms, clipping and the optimizer step."""

    def __init__(self, model: nn.Module, forward, optimizer: torch.optim.Optimizer, gradients, world: World, *,
                 batch_size: int, clip: float, precision: str, device: torch.device):
        self.model = model
        self.forward = forward  # the model, or its wrappers: what computes a window's logits
        self.optimizer, self.gradients, self.world = optimizer, gradients, world
        self.batch_size, self.clip = batch_size, clip
        self.precision, self.device = precision, device
        self.layer_groups = model.layer_groups()

    def __call__(self, window: Window, state: list, stop: StopRequest, budget: TimeBudget) -> StepResult:
        with autocast(self.precision, self.device):
            logits, new_state = self.forward(window.inputs, state)
        logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # the loss in float32 at least
        share_tokens = window.targets.numel()  # this process's rows
        tokens = self.batch_size * window.targets.shape[1]  # every process's streams
        mean = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), window.targets.reshape(-1))
        loss = mean * (self.world.size * share_tokens / tokens)
        self.optimizer.zero_grad(set_to_none=True)
        self.gradients.backward(loss, self.optimizer)
        norms = self._grad_norms()
        # One read-back a step (on a GPU, the one wait for it): the loss and every layer's norm together.
        fetched = torch.stack([mean.detach().float(), *norms.values()]).tolist()
        value = self.world.sum([fetched[0] * share_tokens])[0] / tokens  # summed over the processes
        if not math.isfinite(value):  # every process sees the same sum, so they stop together, before a step
            raise LossNotFinite(value)
        grad_norms = dict(zip(norms, fetched[1:]))
        if self.clip > 0:
            nn.utils.clip_grad_norm_(self.model.parameters(), self.clip)
        self.gradients.step(self.optimizer)
        # A stop asked for at any moment of this step ends training after it, in every process alike.
        stop_votes, time_votes = self.world.sum([stop.requested, budget.is_up()])
        return StepResult(value, tokens, grad_norms, float32_state(detach_state(new_state)), stop_votes > 0, time_votes > 0)

    def _grad_norms(self) -> dict[str, torch.Tensor]:
        """Each layer group's gradient norm, on the device (read back with the loss)."""
        norms = {}
        for name, params in self.layer_groups.items():
            grads = [p.grad for p in params if p.grad is not None]
            if grads:
                norms[name] = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads])).float()
        return norms


def gradients_for(scaler) -> PlainGradients | ScaledGradients:
    return PlainGradients() if scaler is None else ScaledGradients(scaler)
