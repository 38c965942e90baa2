"""Long short-term memory (Hochreiter & Schmidhuber 1997; forget gate: Gers et al. 2000)."""

from __future__ import annotations

import dataclasses

import torch
from torch import Tensor, nn

from charlm.cells.base import InferenceStep, RecurrentCell, State, glorot_uniform_, library_rnn
from charlm.settings import setting


PEEPHOLE_FORMS = ("none", "diagonal", "full")


def peephole_form(value):
    """``none``, ``diagonal`` or ``full`` in any case; true/false (charlm before 0.3, and a bool on the
    command line) mean diagonal/none. Any other value is left as it is, for the declared choices to refuse."""
    word = str(value).strip().lower()
    if value is True or word in ("true", "yes", "on", "1"):
        return "diagonal"
    if value is False or value is None or word in ("false", "no", "off", "0"):
        return "none"
    return word if word in PEEPHOLE_FORMS else value


@dataclasses.dataclass
class LSTMConfig:
    peephole: str = setting(
        "none",
        "i and f also see the previous memory c_(t−1), o the new one c_t, through a weight per unit (diagonal: "
        "p ⊙ c, 3n, Gers et al. 2002) or a full matrix (full: P c, 3n², as Graves 2013 is counted in the Delta-RNN "
        "paper's Table 2).",
        choices=PEEPHOLE_FORMS,
    )

    def __post_init__(self):
        self.peephole = peephole_form(self.peephole)  # the spellings of charlm before 0.3


class LSTM(RecurrentCell):
    r"""Long short-term memory.

        i, f, o = σ(W_* x_t + U_* h_{t−1} + b_*)
        g       = tanh(W_g x_t + U_g h_{t−1} + b_g)
        c_t     = f ⊙ c_{t−1} + i ⊙ g
        h_t     = o ⊙ tanh(c_t)

    With ``peephole=diagonal``: i, f add p_i ⊙ c_{t−1}, p_f ⊙ c_{t−1}; o adds p_o ⊙ c_t.
    With ``peephole=full``: i, f add P_i c_{t−1}, P_f c_{t−1}; o adds P_o c_t (P_* ∈ R^{n×n}).
    Gate rows are stored in PyTorch's order (i, f, g, o) so that, without peepholes, the fused
    library kernel computes exactly this function with these weights. Forget bias starts at +1.
    """

    name = "lstm"
    recurrent_weights = ("weight_hidden",)
    activation_factor = 15
    description = "Long short-term memory (forget bias +1; option: peepholes, diagonal or full)"
    paper = "Hochreiter & Schmidhuber 1997; Gers et al. 2000"
    formula = "4(dn + n² + n) (+3n diagonal peepholes, +3n² full)"
    Config = LSTMConfig
    folds_embedding = True

    def __init__(self, input_size: int, hidden_size: int, config: LSTMConfig | None = None):
        super().__init__(input_size, hidden_size, config)
        n = hidden_size
        self.weight_input = nn.Parameter(torch.empty(4 * n, input_size))
        self.weight_hidden = nn.Parameter(torch.empty(4 * n, n))
        self.bias = nn.Parameter(torch.empty(4 * n))
        if self.config.peephole == "diagonal":
            self.peephole = nn.Parameter(torch.zeros(3, n))
        elif self.config.peephole == "full":
            self.peephole = nn.Parameter(torch.zeros(3, n, n))
        self.reset_parameters()

    def reset_parameters(self):
        n = self.hidden_size
        glorot_uniform_(self.weight_input, blocks=4)
        glorot_uniform_(self.weight_hidden, blocks=4)
        with torch.no_grad():
            self.bias.zero_()
            self.bias[n : 2 * n].fill_(1.0)
            if self.config.peephole != "none":
                self.peephole.zero_()

    def initial_state(self, batch_size, device=None, dtype=None) -> State:
        return (self._zeros(batch_size, device, dtype), self._zeros(batch_size, device, dtype))

    def step(self, x: Tensor, state: State) -> tuple[Tensor, State]:
        h, c = state
        pre = x @ self.weight_input.T + h @ self.weight_hidden.T + self.bias
        return self._gates_to_output(pre, c)

    def _gates_to_output(self, pre: Tensor, c: Tensor) -> tuple[Tensor, State]:
        i, f, g, o = pre.chunk(4, dim=-1)
        if self.config.peephole != "none":
            i = i + self._peep(0, c)
            f = f + self._peep(1, c)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        if self.config.peephole != "none":
            o = o + self._peep(2, c)
        h = torch.sigmoid(o) * torch.tanh(c)
        return h, (h, c)

    def _peep(self, gate: int, c: Tensor) -> Tensor:
        """What gate ``gate`` (0 i, 1 f, 2 o) sees of the memory: p ⊙ c, or P c."""
        if self.config.peephole == "full":
            return c @ self.peephole[gate].T
        return self.peephole[gate] * c

    def inference_step(self) -> "LSTMInference":
        return LSTMInference(self)

    def forward(self, inputs: Tensor, state: State, lookup=None) -> tuple[Tensor, State]:
        if self.config.peephole == "none" and not self.prefers_python_loop(inputs, lookup):
            return self._fused_forward(inputs, state)
        pre_input = self.input_product(inputs, self.weight_input, self.bias, lookup)
        h, c = state
        outputs = []
        for pre_t in pre_input:
            h, (h, c) = self._gates_to_output(pre_t + h @ self.weight_hidden.T, c)
            outputs.append(h)
        return torch.stack(outputs), (h, c)

    def _fused_forward(self, inputs: Tensor, state: State) -> tuple[Tensor, State]:
        h, c = state
        no_second_bias = torch.zeros_like(self.bias)
        weights = [self.weight_input, self.weight_hidden, self.bias, no_second_bias]
        outputs, h_n, c_n = library_rnn(torch.lstm, inputs, (h.unsqueeze(0), c.unsqueeze(0)), weights, self.training)
        return outputs, (h_n.squeeze(0), c_n.squeeze(0))


def lstm_memory_(pre: Tensor, memory: Tensor, blocks: str = "ifgo") -> tuple[Tensor, Tensor]:
    """The output gate σ(o) and the new memory σ(f) ⊙ m + σ(i) ⊙ tanh(g), from pre-activations
    whose row blocks are in the order ``blocks``; overwrites them with activations."""
    n = memory.shape[-1]
    candidate = torch.tanh(pre.narrow(-1, blocks.index("g") * n, n))
    gates = dict(zip(blocks, pre.sigmoid_().unflatten(-1, (4, n)).unbind(-2)))  # g's block too, unused
    return gates["o"], torch.addcmul(gates["f"] * memory, gates["i"], candidate)


class LSTMInference(InferenceStep):
    """The LSTM step for sampling: W x + b taken ahead, one product U h, the gates in place."""

    reads_input = False

    def __init__(self, cell: LSTM):
        super().__init__(cell)
        self.weight_input, self.weight_hidden, self.bias = cell.weight_input.T, cell.weight_hidden.T, cell.bias
        self.peephole = cell.peephole if cell.config.peephole != "none" else None
        self.full = cell.config.peephole == "full"

    def project(self, x: Tensor) -> Tensor:
        return torch.addmm(self.bias, x, self.weight_input)

    def gates(self, projected: Tensor, h: Tensor) -> Tensor:
        """The pre-activations, rows (i, f, g, o)."""
        return torch.addmm(projected, h, self.weight_hidden)

    def advance(self, projected: Tensor, x: Tensor | None, state: State) -> tuple[Tensor, State]:
        h, c = state
        pre = self.gates(projected, h)
        if self.peephole is not None:
            return self._advance_with_peepholes(pre, c)
        o, c = lstm_memory_(pre, c)
        h = o * torch.tanh(c)
        return h, (h, c)

    def _advance_with_peepholes(self, pre: Tensor, c: Tensor) -> tuple[Tensor, State]:
        i, f, g, o = pre.unflatten(-1, (4, c.shape[-1])).unbind(-2)
        p_i, p_f, p_o = self.peephole
        if self.full:
            c = torch.sigmoid(torch.addmm(f, c, p_f.T)) * c + torch.sigmoid(torch.addmm(i, c, p_i.T)) * torch.tanh(g)
            h = torch.sigmoid(torch.addmm(o, c, p_o.T)) * torch.tanh(c)
            return h, (h, c)
        c = torch.sigmoid(torch.addcmul(f, p_f, c)) * c + torch.sigmoid(torch.addcmul(i, p_i, c)) * torch.tanh(g)
        h = torch.sigmoid(torch.addcmul(o, p_o, c)) * torch.tanh(c)
        return h, (h, c)
