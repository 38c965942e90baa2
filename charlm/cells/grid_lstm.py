"""Two-dimensional Grid LSTM over time × depth (Kalchbrenner, Danihelka & Graves 2016)."""

from __future__ import annotations

import dataclasses

import torch
from torch import Tensor, nn

from charlm.cells.base import InferenceStep, RecurrentCell, State, glorot_uniform_
from charlm.cells.lstm import lstm_memory_
from charlm.settings import setting

_DEPTH_ACTIVATIONS = {"tanh": torch.tanh, "identity": lambda pre: pre}


@dataclasses.dataclass
class GridLSTMConfig:
    tied: bool = setting(True, "Every layer's block shares the same two transforms (the paper's character model).")
    output: str = setting(
        "paper", "paper: h′ = tanh(g^o ⊙ m′); standard: h′ = g^o ⊙ tanh(m′).", choices=("paper", "standard")
    )
    depth: str = setting(
        "lstm",
        "lstm; tanh or identity: a non-LSTM depth dimension h′ = act(V H′ + b).",
        choices=("lstm", *_DEPTH_ACTIVATIONS),
    )


class GridLSTM(RecurrentCell):
    r"""One block of a 2-D Grid LSTM: an LSTM transform along time, then one along depth.

    The block reads (h_time, m_time) from the left (this layer at t − 1, the carried state) and
    (h_depth, m_depth) from below (the layer's input x_t = [h_depth; m_depth], width 2n). Each
    dimension has its own LSTM transform, gate rows stored in the order (u, f, o, c):

        g^u, g^f, g^o = σ(W^· H + b^·),  g^c = tanh(W^c H + b^c)
        m′ = g^f ⊙ m + g^u ⊙ g^c
        h′ = tanh(g^o ⊙ m′)                (paper; option output=standard: h′ = g^o ⊙ tanh(m′))

    Priority to depth: the time transform runs first on H = [h_time; h_depth], giving
    (h_time′, m_time′); the depth transform then runs on H′ = [h_time′; h_depth] with the depth
    memory, giving (h_depth′, m_depth′). The depth output [h_depth′; m_depth′] goes up (and, on
    the top layer, to the softmax); (h_time′, m_time′) is carried to t + 1. At the bottom the
    embedding (width 2n) is the paper's two V×n projections of the character into h_depth, m_depth.

    Option ``depth=tanh|identity``: the depth dimension is a plain layer h_depth′ = act(V H′ + b)
    (V ∈ R^{n×2n}) with no depth memory, so the depth stream is h_depth alone: input, output and
    embedding width n, and the softmax reads h_depth′.

    Option ``tied`` (default): every layer is the same block (one module repeated in the stack).
    Forget-gate biases start at +1, other biases at 0, weights Glorot uniform per gate.
    """

    name = "grid-lstm"
    activation_factor = 36
    recurrent_weights = ("time_weight",)  # its columns ..n multiply h_time
    folds_embedding = True
    evaluates_through_step = True  # measured faster without gradients (see RecurrentCell)
    description = "2-D Grid LSTM (time × depth), priority to depth, weights tied across depth by default"
    paper = "Kalchbrenner, Danihelka & Graves 2016, Grid Long Short-Term Memory"
    formula = "16n² + 8n per block (once if tied; d = 2n); depth=tanh|identity: 10n² + 5n (d = n)"
    Config = GridLSTMConfig

    def __init__(self, input_size: int, hidden_size: int, config: GridLSTMConfig | None = None):
        super().__init__(input_size, hidden_size, config)
        n = hidden_size
        width = self.required_input_size(n, self.config)
        if input_size != width:
            raise ValueError(
                f"grid-lstm's depth input is {self._stream} so its input size must be {width}, not {input_size}"
            )
        self.time_weight = nn.Parameter(torch.empty(4 * n, 2 * n))  # columns: h_time, then h_depth
        self.time_bias = nn.Parameter(torch.empty(4 * n))
        depth_rows = 4 * n if self.config.depth == "lstm" else n
        self.depth_weight = nn.Parameter(torch.empty(depth_rows, 2 * n))  # columns: h_time′, then h_depth
        self.depth_bias = nn.Parameter(torch.empty(depth_rows))
        self.reset_parameters()

    def recurrent_columns(self, name: str) -> slice:
        return slice(0, self.hidden_size)

    @property
    def _stream(self) -> str:
        return "[h_depth; m_depth]" if self.config.depth == "lstm" else "h_depth"

    @classmethod
    def required_input_size(cls, hidden_size, config):
        return 2 * hidden_size if config.depth == "lstm" else hidden_size

    @property
    def output_size(self) -> int:
        return self.required_input_size(self.hidden_size, self.config)

    @classmethod
    def make_stack(cls, input_size, hidden_size, num_layers, config):
        if not config.tied:
            return super().make_stack(input_size, hidden_size, num_layers, config)
        block = cls(input_size, hidden_size, config)
        return [block] * num_layers

    def reset_parameters(self):
        n = self.hidden_size
        lstm_depth = self.config.depth == "lstm"
        glorot_uniform_(self.time_weight, blocks=4)
        glorot_uniform_(self.depth_weight, blocks=4 if lstm_depth else 1)
        with torch.no_grad():
            self.time_bias.zero_()
            self.time_bias[n : 2 * n].fill_(1.0)
            self.depth_bias.zero_()
            if lstm_depth:
                self.depth_bias[n : 2 * n].fill_(1.0)

    def initial_state(self, batch_size, device=None, dtype=None) -> State:
        return (self._zeros(batch_size, device, dtype), self._zeros(batch_size, device, dtype))

    def _lstm_transform(self, pre: Tensor, memory: Tensor) -> tuple[Tensor, Tensor]:
        """(h′, m′) from the pre-activations W H + b (rows u, f, o, c) and the memory m."""
        u, f, o, c = pre.chunk(4, dim=-1)
        memory = torch.sigmoid(f) * memory + torch.sigmoid(u) * torch.tanh(c)
        if self.config.output == "paper":
            h = torch.tanh(torch.sigmoid(o) * memory)
        else:
            h = torch.sigmoid(o) * torch.tanh(memory)
        return h, memory

    def _depth_transform(self, pre: Tensor, depth_input: Tensor) -> Tensor:
        """The depth output from the depth pre-activations W H′ + b and the depth input."""
        if self.config.depth != "lstm":
            return _DEPTH_ACTIVATIONS[self.config.depth](pre)
        memory = depth_input[..., self.hidden_size :]
        return torch.cat(self._lstm_transform(pre, memory), dim=-1)

    def step(self, x: Tensor, state: State) -> tuple[Tensor, State]:
        h_time, m_time = state
        h_depth = x[:, : self.hidden_size]
        H = torch.cat([h_time, h_depth], dim=-1)
        h_time, m_time = self._lstm_transform(H @ self.time_weight.T + self.time_bias, m_time)
        H_prime = torch.cat([h_time, h_depth], dim=-1)
        output = self._depth_transform(H_prime @ self.depth_weight.T + self.depth_bias, x)
        return output, (h_time, m_time)

    def inference_step(self) -> "GridInference":
        return GridInference(self)

    def forward(self, inputs: Tensor, state: State, lookup=None) -> tuple[Tensor, State]:
        # Nothing in the time recurrence depends on the depth output, so only the time transform's
        # recurrent product runs step by step; h_depth's share of both transforms is one matrix
        # product for the window, and the rest of the depth transform one more once every h_time′
        # of the window is known.
        n = self.hidden_size
        h_depth = inputs[..., :n]
        if lookup is not None:  # h_depth is the first n columns of the table (one-hot inputs: not folded)
            lookup = lookup.narrowed(n) if lookup.table is not None else None
        time_rows = self.time_weight.shape[0]
        from_depth = self.input_product(
            h_depth,
            torch.cat([self.time_weight[:, n:], self.depth_weight[:, n:]]),
            torch.cat([self.time_bias, self.depth_bias]),
            lookup,
        )
        time_from_depth, depth_from_depth = from_depth[..., :time_rows], from_depth[..., time_rows:]
        recurrent_weight = self.time_weight[:, :n]
        h_time, m_time = state
        time_outputs = []
        for pre_t in time_from_depth:
            h_time, m_time = self._lstm_transform(pre_t + h_time @ recurrent_weight.T, m_time)
            time_outputs.append(h_time)
        depth_pre = torch.stack(time_outputs) @ self.depth_weight[:, :n].T + depth_from_depth
        outputs = self._depth_transform(depth_pre, inputs)
        return outputs, (h_time, m_time)


class GridInference(InferenceStep):
    """The block's step for sampling: h_depth's share of both transforms (and their biases) is
    taken ahead; then one product for the time transform and one for the depth transform, each
    LSTM transform's gates applied in place."""

    def __init__(self, cell: GridLSTM):
        super().__init__(cell)
        n = self.hidden_size = cell.hidden_size
        self.paper_output = cell.config.output == "paper"
        self.depth = cell.config.depth
        # Copies of the column blocks, transposed: views of them are slower operands at batch 1.
        self.from_depth = torch.cat([cell.time_weight[:, n:], cell.depth_weight[:, n:]]).T.contiguous()
        self.bias = torch.cat([cell.time_bias, cell.depth_bias])
        self.time_recurrent = cell.time_weight[:, :n].T.contiguous()
        self.depth_from_time = cell.depth_weight[:, :n].T.contiguous()

    def project(self, x: Tensor) -> Tensor:
        return torch.addmm(self.bias, x.narrow(-1, 0, self.hidden_size), self.from_depth)

    def _transform(self, pre: Tensor, memory: Tensor) -> tuple[Tensor, Tensor]:
        """(h′, m′) of an LSTM transform; overwrites ``pre``."""
        gate, memory = lstm_memory_(pre, memory, blocks="ifog")  # u, f, o, c
        h = torch.tanh(gate.mul_(memory)) if self.paper_output else gate * torch.tanh(memory)
        return h, memory

    def advance(self, projected: Tensor, x: Tensor, state: State) -> tuple[Tensor, State]:
        h_time, m_time = state
        n = self.hidden_size
        time_rows = 4 * n
        time_pre = torch.addmm(projected.narrow(-1, 0, time_rows), h_time, self.time_recurrent)
        h_time, m_time = self._transform(time_pre, m_time)
        depth_pre = torch.addmm(
            projected.narrow(-1, time_rows, self.depth_from_time.shape[1]), h_time, self.depth_from_time
        )
        if self.depth != "lstm":
            return _DEPTH_ACTIVATIONS[self.depth](depth_pre), (h_time, m_time)
        return torch.cat(self._transform(depth_pre, x.narrow(-1, n, n)), dim=-1), (h_time, m_time)
