"""The structurally constrained recurrent network (Mikolov, Joulin, Chopra, Mathieu & Ranzato 2015)."""

from __future__ import annotations

import dataclasses

import torch
from torch import Tensor, nn

from charlm.cells.base import InferenceStep, RecurrentCell, State, glorot_uniform_
from charlm.settings import setting


@dataclasses.dataclass
class SCRNConfig:
    context_size: int | None = setting(None, "c, the slow context state; none: max(1, n // 10).", min=1)
    alpha: float = setting(0.95, "How much of the context is kept each step.", min=0, max=1)
    learnable_alpha: bool = setting(False, "Learn one α per context unit, starting at `alpha`.")
    bias: bool = setting(False, "Add a bias b to the hidden pre-activation (+n parameters).")

    def context_for(self, hidden_size: int) -> int:
        return self.context_size if self.context_size is not None else max(1, hidden_size // 10)


class SCRN(RecurrentCell):
    r"""Structurally constrained recurrent network: a fast hidden state and a slow context state.

        s_t = (1 − α) B x_t + α s_{t−1}            s ∈ R^c
        h_t = σ(P s_t + A x_t + R h_{t−1} [+ b])   h ∈ R^n

    The depth output is [h_t; s_t] (the paper's softmax sees both), so ``output_size`` is n + c.
    α is fixed (0.95) unless ``learnable_alpha``, which learns one α per context unit. The context
    never depends on h, so ``forward`` runs the (elementwise) context recurrence first and then
    applies P to the whole window in one product.
    """

    name = "scrn"
    recurrent_weights = ("R",)
    activation_factor = 8
    folds_embedding = True
    evaluates_through_step = True  # measured faster without gradients (see RecurrentCell)
    description = (
        "Structurally constrained RNN: sigmoid hidden state plus a slow context; depth output h and s concatenated"
    )
    paper = "Mikolov et al. 2015, Learning longer memory in recurrent neural networks"
    formula = "dc + dn + cn + n² (c = max(1, n // 10); +c learnable α, +n bias)"
    Config = SCRNConfig

    def __init__(self, input_size: int, hidden_size: int, config: SCRNConfig | None = None):
        super().__init__(input_size, hidden_size, config)
        n, c = hidden_size, self.config.context_for(hidden_size)
        self.context_size = c
        self.B = nn.Parameter(torch.empty(c, input_size))
        self.A = nn.Parameter(torch.empty(n, input_size))
        self.P = nn.Parameter(torch.empty(n, c))
        self.R = nn.Parameter(torch.empty(n, n))
        if self.config.learnable_alpha:
            self.alpha = nn.Parameter(torch.empty(c))
        if self.config.bias:
            self.bias = nn.Parameter(torch.empty(n))
        self.reset_parameters()

    def reset_parameters(self):
        for weight in (self.B, self.A, self.P, self.R):
            glorot_uniform_(weight)
        with torch.no_grad():
            if self.config.learnable_alpha:
                self.alpha.fill_(self.config.alpha)
            if self.config.bias:
                self.bias.zero_()

    @property
    def output_size(self) -> int:
        return self.hidden_size + self.context_size

    def _alpha(self):
        return self.alpha if self.config.learnable_alpha else self.config.alpha

    def _hidden_bias(self):
        return self.bias if self.config.bias else 0.0

    def initial_state(self, batch_size, device=None, dtype=None) -> State:
        return (self._zeros(batch_size, device, dtype), self._zeros(batch_size, device, dtype, width=self.context_size))

    def step(self, x: Tensor, state: State) -> tuple[Tensor, State]:
        h, s = state
        alpha = self._alpha()
        s = (1 - alpha) * (x @ self.B.T) + alpha * s
        h = torch.sigmoid(s @ self.P.T + x @ self.A.T + h @ self.R.T + self._hidden_bias())
        return torch.cat([h, s], dim=-1), (h, s)

    def inference_step(self) -> "SCRNInference":
        return SCRNInference(self)

    def forward(self, inputs: Tensor, state: State, lookup=None) -> tuple[Tensor, State]:
        c, alpha, bias = self.context_size, self._alpha(), self._hidden_bias()
        weight = torch.cat([self.B, self.A])
        # (1 − α) B x and A x + b for every position; with a lookup, on the V rows, then spread
        if lookup is None:
            projected = self.input_product(inputs, weight)
            context_drive, hidden_drive = (1 - alpha) * projected[..., :c], projected[..., c:] + bias
        else:
            rows = lookup.rows(weight)
            drives = lookup.spread(torch.cat([(1 - alpha) * rows[:, :c], rows[:, c:] + bias], dim=-1))
            context_drive, hidden_drive = drives.split([c, self.hidden_size], dim=-1)
        h, s = state
        contexts = []
        for drive_t in context_drive:
            s = drive_t + alpha * s
            contexts.append(s)
        contexts = torch.stack(contexts)
        pre_hidden = contexts @ self.P.T + hidden_drive
        outputs = []
        for pre_t in pre_hidden:
            h = torch.sigmoid(pre_t + h @ self.R.T)
            outputs.append(h)
        return torch.cat([torch.stack(outputs), contexts], dim=-1), (h, s)


class SCRNInference(InferenceStep):
    """The SCRN step for sampling: (1 − α) B x and A x (+ b) taken ahead, then the context's
    update and two products for h."""

    reads_input = False

    def __init__(self, cell: SCRN):
        super().__init__(cell)
        self.context_size, self.alpha = cell.context_size, cell._alpha()
        self.B, self.A = cell.B.T, cell.A.T
        self.hidden_bias = cell._hidden_bias()
        self.P, self.R = cell.P.T, cell.R.T

    def project(self, x: Tensor) -> Tensor:
        return torch.cat([(1 - self.alpha) * (x @ self.B), x @ self.A + self.hidden_bias], dim=-1)

    def advance(self, projected: Tensor, x: Tensor | None, state: State) -> tuple[Tensor, State]:
        h, s = state
        c = self.context_size
        s = projected.narrow(-1, 0, c) + self.alpha * s
        h = torch.addmm(torch.addmm(projected.narrow(-1, c, h.shape[-1]), s, self.P), h, self.R).sigmoid_()
        return torch.cat([h, s], dim=-1), (h, s)
