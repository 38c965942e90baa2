"""The optimizer a run trains with, by name (``--optimizer``); its defaults are in ``charlm.config``.

- ``adam`` (the default): ``torch.optim.Adam``, β = (0.9, 0.999), ε = 1e-8. ``--weight-decay`` is
  L2: decay × θ is added to the gradient before the moments (so Adam rescales it too).
- ``adamw``: ``torch.optim.AdamW``, the same β and ε. ``--weight-decay`` (default 0.01) is
  decoupled: each update first multiplies the weights by 1 − lr × decay, then takes Adam's step.
- ``sgd``: ``torch.optim.SGD``, ``--momentum`` (default 0.9: v ← μ·v + g, θ ← θ − lr·v; no
  dampening), ``--nesterov``; ``--weight-decay`` is L2.
- ``rmsprop``: ``torch.optim.RMSprop``, α = 0.99, ε = 1e-8, not centred; ``--momentum`` (default 0);
  ``--weight-decay`` is L2.

``charlm task`` builds its optimizers here too (``optimizer_named``), with ``adagrad`` besides
(``torch.optim.Adagrad``, its defaults) and neither decay nor momentum.

Decay applies to every weight (biases, embeddings and gates alike). Each is one of torch's own
optimizers, so the learning-rate schedules (which set ``param_groups[i]["lr"]``) and the checkpoint
(``state_dict``) work the same for all of them.
"""

from __future__ import annotations

import torch

from charlm.config import TrainConfig

ADAM_BETAS = (0.9, 0.999)


def build_optimizer(parameters, config: TrainConfig) -> torch.optim.Optimizer:
    """``config.optimizer`` over ``parameters``, at ``config.lr``, with its decay and momentum."""
    momentum = config.effective_momentum  # None for adam and adamw, which have none
    return optimizer_named(
        config.optimizer,
        parameters,
        config.lr,
        weight_decay=config.effective_weight_decay,
        momentum=0 if momentum is None else momentum,
        nesterov=config.nesterov,
    )


def optimizer_named(
    name: str, parameters, lr: float, *, weight_decay: float = 0, momentum: float = 0, nesterov: bool = False
) -> torch.optim.Optimizer:
    """The optimizer ``name`` over ``parameters`` at ``lr``; ``momentum`` only for sgd and rmsprop.
    The defaults are torch's own, so an optimizer built without them saves the same ``state_dict``."""
    if name == "adam":
        return torch.optim.Adam(parameters, lr=lr, betas=ADAM_BETAS, weight_decay=weight_decay)
    if name == "adamw":
        return torch.optim.AdamW(parameters, lr=lr, betas=ADAM_BETAS, weight_decay=weight_decay)
    if name == "sgd":
        return torch.optim.SGD(parameters, lr=lr, momentum=momentum, nesterov=nesterov, weight_decay=weight_decay)
    if name == "rmsprop":
        return torch.optim.RMSprop(parameters, lr=lr, momentum=momentum, weight_decay=weight_decay)
    if name == "adagrad":  # charlm task's (the parity task's default)
        return torch.optim.Adagrad(parameters, lr=lr, weight_decay=weight_decay)
    raise ValueError(f"unknown optimizer {name!r}")  # TrainConfig and TaskConfig validate name against their choices
