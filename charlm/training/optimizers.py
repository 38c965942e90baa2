"""The optimizer a run trains with, by name (``--optimizer``); its defaults are in ``charlm.config``.

- ``adam`` (the default): ``torch.optim.Adam``, β = (0.9, 0.999), ε = 1e-8. ``--weight-decay`` is
  L2: decay × θ is added to the gradient before the moments (so Adam rescales it too).
- ``adamw``: ``torch.optim.AdamW``, the same β and ε. ``--weight-decay`` (default 0.01) is
  decoupled: each update first multiplies the weights by 1 − lr × decay, then takes Adam's step.
- ``sgd``: ``torch.optim.SGD``, ``--momentum`` (default 0.9: v ← μ·v + g, θ ← θ − lr·v; no
  dampening), ``--nesterov``; ``--weight-decay`` is L2.
- ``rmsprop``: ``torch.optim.RMSprop``, α = 0.99, ε = 1e-8, not centred; ``--momentum`` (default 0);
  ``--weight-decay`` is L2.

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
    decay = config.effective_weight_decay
    if config.optimizer == "adam":
        return torch.optim.Adam(parameters, lr=config.lr, betas=ADAM_BETAS, weight_decay=decay)
    if config.optimizer == "adamw":
        return torch.optim.AdamW(parameters, lr=config.lr, betas=ADAM_BETAS, weight_decay=decay)
    if config.optimizer == "sgd":
        return torch.optim.SGD(
            parameters, lr=config.lr, momentum=config.effective_momentum, nesterov=config.nesterov, weight_decay=decay
        )
    if config.optimizer == "rmsprop":
        return torch.optim.RMSprop(parameters, lr=config.lr, momentum=config.effective_momentum, weight_decay=decay)
    raise ValueError(f"unknown optimizer {config.optimizer!r}")  # TrainConfig.validate names the choices first
