"""One optimization step on one window, the same code for one process and for torchrun.

What differs between runs is chosen once, when the step is built: the forward pass the step calls
(the model, wrapped by DistributedDataParallel, ``torch.compile`` or CUDA graphs; see
``setup.forward_pass``) and how gradients are taken (:class:`PlainGradients`, or
:class:`ScaledGradients` under fp16). Nothing is branched on per step.

Under torchrun the processes agree, through two sums, on the loss (all stop, before the update,
when it is not finite: the result says so) and on whether Ctrl-C, SIGTERM or the time budget ends
training after this step; on one process these sums are the values themselves.

The loss of a window is the mean over every stream of every process. Each process computes the mean
over its own rows and scales it by ``world.size × its tokens / all tokens``; DistributedDataParallel
averages the processes' gradients, which makes that the gradient of the mean over all streams. On a
single process the scale is exactly 1.

With ``--accumulate K`` a step is one optimizer update on a group of K consecutive windows
(:func:`update_groups`): each window's forward and backward in turn, the state carried from one
into the next as between steps, each loss divided by the group's size so that the summed gradients
are those of the windows' mean loss; then the one read-back, clipping of the summed gradient and
the optimizer's step. Under torchrun the windows before the last run in DistributedDataParallel's
``no_sync``: gradients add up on each process and are averaged once, in the last backward.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Iterable, Iterator

import torch
from torch import nn

from charlm.corpora.streams import Window
from charlm.model import detach_state
from charlm.runtime.distributed import World
from charlm.runtime.precision import autocast, float32_state
from charlm.training.control import StopRequest, TimeBudget


class PlainGradients:
    """Backward and optimizer step in full or bf16 precision."""

    def backward(self, loss: torch.Tensor, optimizer: torch.optim.Optimizer) -> None:
        loss.backward()

    def unscale(self, optimizer: torch.optim.Optimizer) -> None:
        pass

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        optimizer.step()


class ScaledGradients:
    """fp16: the loss scaled before backward, the gradients unscaled (once an update, after its
    last window's backward) before their norms and the clipping, and a step skipped (by the scaler)
    when they overflowed."""

    def __init__(self, scaler: torch.amp.GradScaler):
        self.scaler = scaler

    def backward(self, loss: torch.Tensor, optimizer: torch.optim.Optimizer) -> None:
        self.scaler.scale(loss).backward()

    def unscale(self, optimizer: torch.optim.Optimizer) -> None:
        self.scaler.unscale_(optimizer)

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        self.scaler.step(optimizer)
        self.scaler.update()


@dataclasses.dataclass
class StepResult:
    """What one update did, or (``diverged``) why it did not."""

    loss: float  # mean nats per token over every stream of every process (and every window of the update)
    tokens: int  # tokens of the update's windows over every process
    grad_norms: dict[str, float]  # per layer group, before clipping
    state: list  # the carried state for the next window, detached, float32
    stop_requested: bool  # Ctrl-C or SIGTERM in any process
    out_of_time: bool  # the time budget is used up in any process
    diverged: bool = False  # a window's loss was inf or nan (``loss``: that window's): nothing was updated


class TrainingStep:
    """Forward, loss, backward, per-layer gradient norms, clipping and the optimizer step."""

    def __init__(
        self,
        model: nn.Module,
        forward,
        optimizer: torch.optim.Optimizer,
        gradients,
        world: World,
        *,
        batch_size: int,
        clip: float,
        precision: str,
        device: torch.device,
        gradient_sync_pause=contextlib.nullcontext,
        ar: float = 0.0,
        tar: float = 0.0,
    ):
        self.model = model
        self.forward = forward  # the model, or its wrappers: what computes a window's logits
        self.optimizer, self.gradients, self.world = optimizer, gradients, world
        self.batch_size, self.clip = batch_size, clip
        self.precision, self.device = precision, device
        self.gradient_sync_pause = gradient_sync_pause  # DDP's no_sync (setup.gradient_sync_pause)
        self.layer_groups = model.layer_groups()
        self.ar, self.tar = ar, tar  # the activation penalties' weights (activation_penalty)
        model.keeps_top_output = ar > 0 or tar > 0

    def __call__(
        self, windows: Window | list[Window], state: list, stop: StopRequest, budget: TimeBudget
    ) -> StepResult:
        """One update on ``windows``: a window, or the group of consecutive windows whose summed
        gradients make it (``--accumulate``), each starting from the state the one before left."""
        group = [windows] if isinstance(windows, Window) else list(windows)
        self.optimizer.zero_grad(set_to_none=True)
        means, shares, totals = [], [], []
        for number, window in enumerate(group):
            if window.fresh_state:  # --windows random: every window starts from the initial state
                state = self.model.initial_state(window.inputs.shape[0], device=self.device)
            pause = self.gradient_sync_pause if number < len(group) - 1 else contextlib.nullcontext
            with pause():
                mean, state = self._window(window, state, len(group))
            means.append(mean)
            shares.append(window.targets.numel())  # this process's rows
            totals.append(self.batch_size * window.targets.shape[1])  # every process's streams
        self.gradients.unscale(self.optimizer)
        norms = self._grad_norms()
        # One read-back a step (on a GPU, the one wait for it): the losses and every layer's norm together.
        fetched = torch.stack([*means, *norms.values()]).tolist()
        nats = self.world.sum([fetched[i] * shares[i] for i in range(len(group))])  # summed over the processes
        for window_nats, window_tokens in zip(nats, totals):
            if not math.isfinite(window_nats):  # every process sees the same sums: they stop together, before a step
                return StepResult(window_nats / window_tokens, 0, {}, state, False, False, diverged=True)
        grad_norms = dict(zip(norms, fetched[len(group) :]))
        if self.clip > 0:
            nn.utils.clip_grad_norm_(self.model.parameters(), self.clip)
        self.gradients.step(self.optimizer)
        # A stop asked for at any moment of this step ends training after it, in every process alike.
        stop_votes, time_votes = self.world.sum([stop.requested, budget.is_up()])
        return StepResult(sum(nats) / sum(totals), sum(totals), grad_norms, state, stop_votes > 0, time_votes > 0)

    def _window(self, window: Window, state: list, windows: int) -> tuple[torch.Tensor, list]:
        """Forward and backward of one window whose loss is ``1 / windows`` of the update's: its mean
        loss (on the device) and the state it leaves, detached and float32."""
        with autocast(self.precision, self.device):
            logits, new_state = self.forward(window.inputs, state)
        logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # the loss in float32 at least
        share_tokens = window.targets.numel()
        tokens = self.batch_size * window.targets.shape[1]
        mean = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), window.targets.reshape(-1))
        if self.model.keeps_top_output:  # trained on, not reported
            loss = mean + activation_penalty(*self.model.top_output, self.ar, self.tar)
            self.model.top_output = None  # not kept beyond its window
        else:
            loss = mean
        loss = loss * (self.world.size * share_tokens / tokens / windows)
        self.gradients.backward(loss, self.optimizer)
        return mean.detach().float(), float32_state(detach_state(new_state))

    def _grad_norms(self) -> dict[str, torch.Tensor]:
        """Each layer group's gradient norm, on the device (read back with the loss)."""
        norms = {}
        for name, params in self.layer_groups.items():
            grads = [p.grad for p in params if p.grad is not None]
            if grads:
                norms[name] = torch.linalg.vector_norm(
                    torch.stack([torch.linalg.vector_norm(g) for g in grads])
                ).float()
        return norms


def activation_penalty(top: torch.Tensor, dropped: torch.Tensor, ar: float, tar: float) -> torch.Tensor:
    """AWD-LSTM's activation regularisation ``ar`` · mean(dropped²), on the top layer's output as the
    softmax reads it (dropped), and temporal activation regularisation ``tar`` · mean((h_t − h_{t−1})²),
    on its undropped output (``[T, B, d]``, time-major: consecutive steps of the window)."""
    top, dropped = (x.to(torch.promote_types(x.dtype, torch.float32)) for x in (top, dropped))  # float32 at least
    penalty = ar * dropped.pow(2).mean()
    if tar > 0 and top.shape[0] > 1:
        penalty = penalty + tar * (top[1:] - top[:-1]).pow(2).mean()
    return penalty


def update_groups(windows: Iterable[Window], accumulate: int) -> Iterator[list[Window]]:
    """``windows`` (of one epoch) in the groups that make one update each: windows kK to kK + K − 1
    of the epoch, by index (so a run resumed at a group's start groups as an uninterrupted one);
    the epoch's last group holds what is left."""
    group = []
    for window in windows:
        group.append(window)
        if (window.index + 1) % accumulate == 0:
            yield group
            group = []
    if group:
        yield group


def gradients_for(scaler) -> PlainGradients | ScaledGradients:
    return PlainGradients() if scaler is None else ScaledGradients(scaler)
