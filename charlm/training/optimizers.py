"""The optimizer a run trains with, by name (``--optimizer``); its defaults are in ``charlm.config``.

- ``adam`` (the default): ``torch.optim.Adam``, β = (0.9, 0.999) unless ``--adam-betas``, ε = 1e-8.
  ``--weight-decay`` is L2: decay × θ is added to the gradient before the moments (so Adam rescales
  it too).
- ``adamw``: ``torch.optim.AdamW``, the same β and ε. ``--weight-decay`` (default 0.01) is
  decoupled: each update first multiplies the weights by 1 − lr × decay, then takes Adam's step.
- ``sgd``: ``torch.optim.SGD``, ``--momentum`` (default 0.9: v ← μ·v + g, θ ← θ − lr·v; no
  dampening), ``--nesterov``; ``--weight-decay`` is L2.
- ``rmsprop``: ``torch.optim.RMSprop``, α = 0.99, ε = 1e-8, not centred; ``--momentum`` (default 0);
  ``--weight-decay`` is L2.

``charlm task`` builds its optimizers here too (``optimizer_named``), with ``adagrad`` besides
(``torch.optim.Adagrad``, its defaults) and neither decay nor momentum.

Decay applies to every weight (biases, embeddings and gates alike) with ``--decay-on all`` (one
parameter group). ``matrices`` (nanoGPT's) and ``matrices-no-embedding`` make two groups: first the
decayed parameters, every one of two or more dimensions (without the embedding table for the second),
then the rest at decay 0 (biases, norm gains, a cell's vectors and scalars). Each is one of torch's own
optimizers, so the learning-rate schedules (which set ``param_groups[i]["lr"]`` of every group) and the
checkpoint (``state_dict``) work the same for all of them.
"""

from __future__ import annotations

import torch

from torch import nn

from charlm.config import ADAM_BETAS, TrainConfig


def build_optimizer(parameters, config: TrainConfig) -> torch.optim.Optimizer:
    """``config.optimizer`` over ``parameters`` (or parameter groups: ``decay_groups``), at ``config.lr``,
    with its decay, momentum and betas."""
    momentum = config.effective_momentum  # None for adam and adamw, which have none
    return optimizer_named(
        config.optimizer,
        parameters,
        config.lr,
        weight_decay=config.effective_weight_decay,
        momentum=0 if momentum is None else momentum,
        nesterov=config.nesterov,
        betas=config.effective_adam_betas,
    )


def decay_groups(model: nn.Module, decay_on: str) -> list:
    """The parameters of ``model`` as ``--decay-on`` groups them: all of them (one group), or the
    decayed ones and a group of the rest at weight decay 0."""
    parameters = list(model.parameters())  # a tied table once
    if decay_on == "all":
        return parameters
    table = getattr(getattr(model, "embedding", None), "weight", None)
    excluded = table if decay_on == "matrices-no-embedding" else None
    decayed = [parameter for parameter in parameters if parameter.dim() >= 2 and parameter is not excluded]
    chosen = {id(parameter) for parameter in decayed}
    rest = [parameter for parameter in parameters if id(parameter) not in chosen]
    return [{"params": decayed}, {"params": rest, "weight_decay": 0.0}]


def optimizer_named(
    name: str,
    parameters,
    lr: float,
    *,
    weight_decay: float = 0,
    momentum: float = 0,
    nesterov: bool = False,
    betas: tuple[float, float] = ADAM_BETAS,
) -> torch.optim.Optimizer:
    """The optimizer ``name`` over ``parameters`` at ``lr``; ``momentum`` only for sgd and rmsprop,
    ``betas`` only for adam and adamw. The defaults are torch's own, so an optimizer built without them
    saves the same ``state_dict``."""
    if name == "adam":
        return torch.optim.Adam(parameters, lr=lr, betas=betas, weight_decay=weight_decay)
    if name == "adamw":
        return torch.optim.AdamW(parameters, lr=lr, betas=betas, weight_decay=weight_decay)
    if name == "sgd":
        return torch.optim.SGD(parameters, lr=lr, momentum=momentum, nesterov=nesterov, weight_decay=weight_decay)
    if name == "rmsprop":
        return torch.optim.RMSprop(parameters, lr=lr, momentum=momentum, weight_decay=weight_decay)
    if name == "adagrad":  # charlm task's (the parity task's default)
        return torch.optim.Adagrad(parameters, lr=lr, weight_decay=weight_decay)
    raise ValueError(f"unknown optimizer {name!r}")  # TrainConfig and TaskConfig validate name against their choices
