"""Learning-rate schedules, chosen by name (``--schedule``).

- ``epoch-decay`` (the default; the LRU paper): the rate × ``lr_decay`` after every epoch.
- ``plateau-halving`` (the Delta-RNN paper, section 4.2): the rate × ``plateau_factor`` (½) after an
  epoch whose validation loss is no better than the best before it, never below ``min_lr``.
- ``constant``: ``lr`` throughout.
- ``warmup-cosine``: linear from ``lr / warmup_steps`` to ``lr`` over the first ``warmup_steps``
  steps, then half a cosine down to ``min_lr`` at the last step of the last epoch (or the step where
  ``--max-tokens`` ends the run, where that comes first).

Each is one of torch's own schedulers behind :class:`Schedule`, which the trainer tells when a step
and an epoch end; its state goes into the checkpoint (for ``epoch-decay`` exactly the
``ExponentialLR`` state earlier checkpoints hold).
"""

from __future__ import annotations

import math
import warnings

import torch

SCHEDULES = ("epoch-decay", "plateau-halving", "constant", "warmup-cosine")


def warmup_cosine_factor(step: int, warmup_steps: int, total_steps: int, floor: float) -> float:
    """The rate at ``step`` (0-based: the step about to run) as a fraction of ``lr``; ``floor`` is
    ``min_lr / lr``."""
    if warmup_steps and step < warmup_steps:
        return (step + 1) / warmup_steps
    span = max(total_steps - warmup_steps, 1)
    progress = min(max(step - warmup_steps, 0) / span, 1.0)
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))


class Schedule:
    """Sets the optimizer's learning rate as the named schedule says; the trainer calls
    :meth:`after_step` and :meth:`after_epoch`."""

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        name: str,
        *,
        lr: float,
        lr_decay: float = 0.9,
        min_lr: float = 0.0,
        plateau_factor: float = 0.5,
        warmup_steps: int = 0,
        total_steps: int = 1,
    ):
        if name not in SCHEDULES:
            raise ValueError(f"unknown schedule {name!r}")
        self.name = name
        if name == "epoch-decay":
            self.scheduler = torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=lr_decay)
        elif name == "plateau-halving":
            self.scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(
                optimizer, mode="min", factor=plateau_factor, patience=0, threshold=0.0, min_lr=min_lr
            )
        elif name == "constant":
            self.scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
        else:
            floor = min_lr / lr
            self.scheduler = torch.optim.lr_scheduler.LambdaLR(
                optimizer, lambda step: warmup_cosine_factor(step, warmup_steps, total_steps, floor)
            )

    def after_step(self) -> None:
        """A training step ended (``warmup-cosine`` moves on)."""
        if self.name == "warmup-cosine":
            self._step()

    def _step(self, *arguments) -> None:
        with warnings.catch_warnings():  # a step the fp16 scaler skipped still counts as a step here
            warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step\\(\\)` before")
            self.scheduler.step(*arguments)

    def after_epoch(self, valid_loss: float) -> None:
        """A whole epoch ended with this validation loss."""
        if self.name == "epoch-decay":
            self._step()
        elif self.name == "plateau-halving":
            self._step(valid_loss)

    def state_dict(self) -> dict:
        return self.scheduler.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.scheduler.load_state_dict(state)
