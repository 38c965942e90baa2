"""The Linear Recurrent Unit (Orvieto et al. 2023): a complex diagonal linear recurrence, computed as real pairs."""

from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from charlm.cells.base import InferenceStep, RecurrentCell, State
from charlm.cells.scan import SCAN_METHODS

_ACTIVATIONS = {"gelu": F.gelu, "tanh": torch.tanh, "identity": lambda y: y}
# The ways this cell computes its recurrence over a window ("log" needs positive coefficients: not complex ones).
LINEAR_RU_SCANS = tuple(method for method in SCAN_METHODS if method != "log")


@dataclasses.dataclass
class LinearRUConfig:
    r_min: float = 0.9  # |λ| is drawn uniformly on the ring r_min ≤ |λ| ≤ r_max of the complex plane
    r_max: float = 0.999
    max_phase: float = 2 * math.pi  # arg λ uniform in [0, max_phase]; the paper's PathFinder/PathX runs used π/10
    state_size: int = 0  # N, the number of complex state units; 0: the hidden size n
    activation: str = "gelu"  # applied to y_k: "gelu" (the paper's block applies GELU to the LRU's output), "identity"
    scan: str = "auto"  # how forward computes the recurrence: "loop", "doubling", "chunked"; "auto": see LinearRU

    def __post_init__(self):
        if not 0.0 <= self.r_min < self.r_max <= 1.0:
            raise ValueError(f"need 0 ≤ r_min < r_max ≤ 1, not r_min={self.r_min}, r_max={self.r_max}")
        if not 0.0 < self.max_phase <= 2 * math.pi:
            raise ValueError(f"max_phase must be in (0, 2π], not {self.max_phase}")
        if self.state_size < 0:
            raise ValueError(f"state_size must be 0 (the hidden size) or positive, not {self.state_size}")
        if self.activation not in _ACTIVATIONS:
            raise ValueError(f"activation must be one of {', '.join(_ACTIVATIONS)}, not {self.activation!r}")
        if self.scan not in LINEAR_RU_SCANS:
            raise ValueError(f"scan must be one of {', '.join(LINEAR_RU_SCANS)}, not {self.scan!r}")


class LinearRU(RecurrentCell):
    r"""Orvieto et al.'s Linear Recurrent Unit (2023), "Resurrecting Recurrent Neural Networks for
    Long Sequences". Not charlm's ``lru``, ``rg-lru`` or ``ps-lru``, which are Ahuja & Morency's
    Lattice Recurrent Units (2017).

    A complex diagonal linear recurrence with a state of N complex units, read out linearly:

        Λ = diag(exp(−exp(ν) + i exp(θ)))                 (ν, θ ∈ R^N: the exponential parametrisation)
        x_k = Λ x_{k−1} + exp(γ^log) ⊙ (B u_k)             (B ∈ C^{N×H}, γ^log ∈ R^N)
        y_k = Re(C x_k) + D ⊙ u_k                          (C ∈ C^{H×N}, D ∈ R^H)

    and then ``activation`` (default GELU) on y_k. The paper's layer ends at y_k, but its block goes
    on with GELU and a GLU; a charlm stack has nothing between its layers, and a stack of purely
    linear recurrences is one linear map of the input sequence, so the block's GELU is applied here
    (``activation=identity`` gives the bare layer). D ⊙ u needs the input as wide as the output, as in
    the paper (H = input = output width): the cell takes d = n. The state is N = n complex units by
    default (``state_size``).

    Initialisation as published: |λ| uniform on the ring [r_min, r_max] (|λ|² uniform in
    [r_min², r_max²]), ν = log(−log |λ|); the phase uniform in [0, max_phase], θ = log(phase);
    γ^log = log √(1 − |λ|²), the normalisation that keeps E|x_k|² at the input's scale; B's real and
    imaginary parts N(0, 1/(2H)), C's N(0, 1/N), D N(0, 1).

    The complex numbers are kept as real pairs (x = x_re + i x_im; multiplying by λ is a rotation
    and a scaling of the pair), so every tensor is real: float64 and bfloat16 autocast run as for
    any cell. Λ does not depend on the input, so the window's recurrence is x_k = Σ_{s≤k} Λ^{k−s}
    b_s + Λ^k x_0 with Λ^j in closed form. ``scan``: "loop" steps through time; "doubling"
    (Hillis–Steele: log₂ T passes adding Λ^{2^j} times the sum shifted by 2^j); "chunked" (within
    chunks of 16 steps one batched product with the Toeplitz matrix of Λ's powers, between chunks a
    loop). "auto" is the loop on a CPU, where it measured fastest (one layer, n = 512, batch 32 ×
    window 256, one thread, forward + backward: loop 0.67 s, chunked 0.99 s, doubling 1.78 s; the
    other two read the whole window many times over) and chunked elsewhere (fewest dependent steps;
    not measured on a GPU).
    """

    name = "linear-ru"
    parallel_form = "scan"
    # Measured as for the built-in cells (peak resident memory, batch 128 × bptt 50, 2 layers of 256): 12.4
    # with the loop (auto on the CPU), 25.3 chunked (auto elsewhere), 33.2 doubling; chunked's, rounded up a quarter.
    activation_factor = 32
    folds_embedding = True
    description = "Linear Recurrent Unit (Orvieto et al.): complex diagonal linear recurrence, ring init (d = n)"
    paper = "Orvieto et al. 2023, Resurrecting Recurrent Neural Networks for Long Sequences"
    formula = "4n² + 4n (d = n); state_size N: 2N(d + n) + 3N + n"
    Config = LinearRUConfig

    def __init__(self, input_size: int, hidden_size: int, config: LinearRUConfig | None = None):
        super().__init__(input_size, hidden_size, config)
        if input_size != hidden_size:
            raise ValueError(f"linear-ru needs input size = hidden size (D ⊙ u), got {input_size} and {hidden_size}")
        n = hidden_size
        N = self.state_size = self.config.state_size or n
        self.nu_log = nn.Parameter(torch.empty(N))
        self.theta_log = nn.Parameter(torch.empty(N))
        self.gamma_log = nn.Parameter(torch.empty(N))
        self.B_re = nn.Parameter(torch.empty(N, input_size))
        self.B_im = nn.Parameter(torch.empty(N, input_size))
        self.C_re = nn.Parameter(torch.empty(n, N))
        self.C_im = nn.Parameter(torch.empty(n, N))
        self.D = nn.Parameter(torch.empty(n))
        self.reset_parameters()

    @classmethod
    def required_input_size(cls, hidden_size, config):
        return hidden_size

    def reset_parameters(self):
        config = self.config
        with torch.no_grad():
            u = torch.rand_like(self.nu_log)
            modulus_squared = u * (config.r_max**2 - config.r_min**2) + config.r_min**2  # uniform on the ring
            self.nu_log.copy_(torch.log(-0.5 * torch.log(modulus_squared)))  # exp(−exp(ν)) = |λ|
            phase = config.max_phase * torch.rand_like(self.theta_log)
            self.theta_log.copy_(torch.log(phase.clamp(min=1e-12)))  # θ = log(phase): exp(θ) > 0
            self.gamma_log.copy_(0.5 * torch.log1p(-modulus_squared))  # γ = √(1 − |λ|²)
            self.B_re.normal_(0.0, 1.0 / math.sqrt(2 * self.input_size))
            self.B_im.normal_(0.0, 1.0 / math.sqrt(2 * self.input_size))
            self.C_re.normal_(0.0, 1.0 / math.sqrt(self.state_size))
            self.C_im.normal_(0.0, 1.0 / math.sqrt(self.state_size))
            self.D.normal_(0.0, 1.0)

    def initial_state(self, batch_size, device=None, dtype=None) -> State:
        N = self.state_size
        return (self._zeros(batch_size, device, dtype, N), self._zeros(batch_size, device, dtype, N))

    def lambda_pair(self) -> tuple[Tensor, Tensor]:
        """(Re λ, Im λ) of the diagonal of Λ, ``[N]`` each."""
        modulus = torch.exp(-torch.exp(self.nu_log))
        phase = torch.exp(self.theta_log)
        return modulus * torch.cos(phase), modulus * torch.sin(phase)

    def lambda_powers(self, exponents: Tensor) -> tuple[Tensor, Tensor]:
        """(Re, Im) of λ^j for every exponent j in ``exponents`` (any shape): ``[*exponents.shape, N]``."""
        j = exponents.unsqueeze(-1)
        modulus = torch.exp(-j * torch.exp(self.nu_log))
        phase = j * torch.exp(self.theta_log)
        return modulus * torch.cos(phase), modulus * torch.sin(phase)

    def step(self, u: Tensor, state: State) -> tuple[Tensor, State]:
        x_re, x_im = state
        lam_re, lam_im = self.lambda_pair()  # λ = exp(−exp(ν) + i exp(θ))
        gamma = torch.exp(self.gamma_log)  # the normalisation γ
        bu_re = gamma * (u @ self.B_re.T)  # Re(γ ⊙ B u_k)
        bu_im = gamma * (u @ self.B_im.T)  # Im(γ ⊙ B u_k)
        x_re, x_im = (
            lam_re * x_re - lam_im * x_im + bu_re,  # Re(x_k) = Re(λ x_{k−1}) + Re(γ ⊙ B u_k)
            lam_re * x_im + lam_im * x_re + bu_im,  # Im(x_k) = Im(λ x_{k−1}) + Im(γ ⊙ B u_k)
        )
        y = x_re @ self.C_re.T - x_im @ self.C_im.T + self.D * u  # y_k = Re(C x_k) + D ⊙ u_k
        return _ACTIVATIONS[self.config.activation](y), (x_re, x_im)

    def inference_step(self) -> "LinearRUInference":
        return LinearRUInference(self)

    def _input_weight(self) -> Tensor:
        """γ ⊙ B as one real matrix, rows Re then Im: ``[2N, d]``."""
        gamma = torch.exp(self.gamma_log).unsqueeze(-1)
        return torch.cat([gamma * self.B_re, gamma * self.B_im])

    def _readout_weight(self) -> Tensor:
        """Re(C x) = [C_re, −C_im] [x_re; x_im]: ``[n, 2N]``."""
        return torch.cat([self.C_re, -self.C_im], dim=1)

    def forward(self, inputs: Tensor, state: State, lookup=None) -> tuple[Tensor, State]:
        N = self.state_size
        bu = self.input_product(inputs, self._input_weight(), None, lookup)  # [T, B, 2N]: γ ⊙ B u_k for every k
        x_re, x_im = state
        bu = bu.to(torch.promote_types(bu.dtype, x_re.dtype))  # the recurrence in the state's precision at least
        method = self.config.scan
        if method == "auto":
            method = "loop" if inputs.device.type == "cpu" else "chunked"
        scan = {"loop": self._scan_loop, "doubling": self._scan_doubling, "chunked": self._scan_chunked}[method]
        all_re, all_im = scan(bu[..., :N], bu[..., N:], x_re, x_im)
        y = torch.cat([all_re, all_im], dim=-1) @ self._readout_weight().T + self.D * inputs
        return _ACTIVATIONS[self.config.activation](y), (all_re[-1], all_im[-1])

    def _scan_loop(self, b_re, b_im, x_re, x_im):
        lam_re, lam_im = self.lambda_pair()
        outputs_re, outputs_im = [], []
        for b_re_t, b_im_t in zip(b_re, b_im):
            x_re, x_im = (
                torch.addcmul(torch.addcmul(b_re_t, lam_re, x_re), lam_im, x_im, value=-1),
                torch.addcmul(torch.addcmul(b_im_t, lam_re, x_im), lam_im, x_re),
            )
            outputs_re.append(x_re)
            outputs_im.append(x_im)
        return torch.stack(outputs_re), torch.stack(outputs_im)

    def _from_start(self, steps: int, x_re: Tensor, x_im: Tensor, like: Tensor) -> tuple[Tensor, Tensor]:
        """Λ^k x_0 for k = 1..steps: ``[steps, B, N]`` each."""
        k = torch.arange(1, steps + 1, device=like.device, dtype=like.dtype)
        power_re, power_im = self.lambda_powers(k)
        power_re, power_im = power_re.unsqueeze(1), power_im.unsqueeze(1)
        return power_re * x_re - power_im * x_im, power_re * x_im + power_im * x_re

    def _scan_doubling(self, b_re, b_im, x_re, x_im):
        steps = b_re.shape[0]
        shift = 1
        while shift < steps:  # after the pass for shift s, each position holds the sum of its last 2s terms
            p_re, p_im = self.lambda_powers(torch.tensor(float(shift), device=b_re.device, dtype=b_re.dtype))
            early_re, early_im = b_re[:-shift], b_im[:-shift]
            b_re, b_im = (
                torch.cat([b_re[:shift], b_re[shift:] + p_re * early_re - p_im * early_im]),
                torch.cat([b_im[:shift], b_im[shift:] + p_re * early_im + p_im * early_re]),
            )
            shift *= 2
        start_re, start_im = self._from_start(steps, x_re, x_im, b_re)
        return b_re + start_re, b_im + start_im

    def _scan_chunked(self, b_re, b_im, x_re, x_im, chunk: int = 16):
        steps, batch, N = b_re.shape
        chunk = min(chunk, steps)
        chunks = -(-steps // chunk)
        padding = chunks * chunk - steps
        if padding:
            b_re, b_im = F.pad(b_re, (0, 0, 0, 0, 0, padding)), F.pad(b_im, (0, 0, 0, 0, 0, padding))
        # Within a chunk: local_i = Σ_{j≤i} λ^{i−j} b_j, one real 2C × 2C matrix per unit.
        index = torch.arange(chunk, device=b_re.device)
        lag = index.unsqueeze(1) - index.unsqueeze(0)
        causal = (lag >= 0).to(b_re.dtype).unsqueeze(-1)
        k_re, k_im = self.lambda_powers(lag.clamp(min=0).to(b_re.dtype))
        k_re, k_im = k_re * causal, k_im * causal  # [C, C, N]
        toeplitz = torch.cat([torch.cat([k_re, -k_im], 1), torch.cat([k_im, k_re], 1)]).permute(2, 0, 1)
        pairs = torch.cat([b_re.view(chunks, chunk, batch, N), b_im.view(chunks, chunk, batch, N)], dim=1)
        columns = pairs.permute(3, 1, 0, 2).reshape(N, 2 * chunk, chunks * batch)
        with torch.autocast(columns.device.type, enabled=False):  # the recurrence in the state's precision
            local = torch.bmm(toeplitz.to(columns.dtype), columns)
        local = local.view(N, 2 * chunk, chunks, batch).permute(2, 1, 3, 0)  # [K, 2C, B, N]
        # Between chunks: x at chunk position i = local_i + λ^{i+1} x_(end of the chunk before).
        p_re, p_im = self.lambda_powers(torch.arange(1, chunk + 1, device=b_re.device, dtype=b_re.dtype))
        p_re, p_im = p_re.unsqueeze(1), p_im.unsqueeze(1)
        outputs_re, outputs_im = [], []
        for local_k in local:
            block_re = local_k[:chunk] + p_re * x_re - p_im * x_im
            block_im = local_k[chunk:] + p_re * x_im + p_im * x_re
            outputs_re.append(block_re)
            outputs_im.append(block_im)
            x_re, x_im = block_re[-1], block_im[-1]
        return torch.cat(outputs_re)[:steps], torch.cat(outputs_im)[:steps]


class LinearRUInference(InferenceStep):
    """The step for sampling: γ ⊙ B u taken ahead as one product; then the rotation-scaling by λ and
    one product with [C_re, −C_im]."""

    def __init__(self, cell: LinearRU):
        super().__init__(cell)
        self.state_size = cell.state_size
        self.input_weight = cell._input_weight().T.contiguous()
        self.readout = cell._readout_weight().T.contiguous()
        self.lam_re, self.lam_im = cell.lambda_pair()
        self.D = cell.D
        self.activation = _ACTIVATIONS[cell.config.activation]

    def project(self, x: Tensor) -> Tensor:
        return x @ self.input_weight

    def advance(self, projected: Tensor, x: Tensor, state: State) -> tuple[Tensor, State]:
        x_re, x_im = state
        N = self.state_size
        bu_re, bu_im = projected[..., :N], projected[..., N:]
        x_re, x_im = (
            self.lam_re * x_re - self.lam_im * x_im + bu_re,
            self.lam_re * x_im + self.lam_im * x_re + bu_im,
        )
        y = torch.addcmul(torch.cat([x_re, x_im], dim=-1) @ self.readout, self.D, x)
        return self.activation(y), (x_re, x_im)
