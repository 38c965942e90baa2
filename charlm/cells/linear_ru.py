"""The Linear Recurrent Unit (Orvieto et al. 2023): a complex diagonal linear recurrence, computed as real pairs."""

from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from charlm.cells.base import State
from charlm.cells.scan import SCAN_METHODS
from charlm.cells.scan_cell import ScanCell
from charlm.settings import setting

_ACTIVATIONS = {"gelu": F.gelu, "tanh": torch.tanh, "identity": lambda y: y}
# The ways this cell computes its recurrence over a window ("log" needs positive coefficients: not complex ones).
LINEAR_RU_SCANS = tuple(method for method in SCAN_METHODS if method != "log")


@dataclasses.dataclass
class LinearRUConfig:
    r_min: float = setting(
        0.9, "|λ| is drawn uniformly on the ring r_min ≤ |λ| ≤ r_max of the complex plane.", min=0, max=1
    )
    r_max: float = setting(0.999, "See r_min.", min=0, max=1)
    max_phase: float = setting(
        2 * math.pi,
        "arg λ uniform in [0, max_phase], at most 2π; the paper's PathFinder/PathX runs used π/10.",
        min=0,
        min_open=True,
        max=2 * math.pi,
    )
    state_size: int = setting(0, "N, the number of complex state units; 0: the hidden size n.", min=0)
    activation: str = setting(
        "gelu",
        "Applied to y_k (the paper's block applies GELU to the LRU's output).",
        choices=tuple(_ACTIVATIONS),
    )
    scan: str = setting("auto", "How forward computes the recurrence (auto: see LinearRU).", choices=LINEAR_RU_SCANS)

    def __post_init__(self):
        if not self.r_min < self.r_max:
            raise ValueError(f"need r_min < r_max, not r_min={self.r_min}, r_max={self.r_max}")


class LinearRU(ScanCell):
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

    The parameters, the carried state and ``step`` keep the complex numbers as real pairs (x = x_re +
    i x_im; multiplying by λ is a rotation and a scaling of the pair), so the step exports as any
    cell's (ONNX has no complex numbers) and float64 and bfloat16 autocast run as for any cell. The
    window's recurrence, x_k = λ ⊙ x_{k−1} + γ ⊙ B u_k, is a linear scan with a_k = λ at every step,
    run by :func:`charlm.cells.scan.linear_scan` in complex numbers (float32 at least) in the form
    ``scan`` picks, ``auto`` choosing as for the other cells; it has no log form (a is not positive).
    """

    name = "linear-ru"
    # Measured as for the built-in cells (peak resident memory, batch 128 × bptt 50, 2 layers of 256): 14.9
    # with the loop (auto on the CPU), 35.0 doubling (auto on a GPU past 16 steps), 29.7 chunked; doubling's,
    # rounded up by a quarter.
    activation_factor = 44
    per_symbol = False  # λ is the same at every step: the input map is gathered, the coefficients formed after
    reads_input = True  # D ⊙ u
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

    def _input_weight(self) -> Tensor:
        """γ ⊙ B as one real matrix whose rows pair Re and Im of each unit, as torch lays out complex numbers:
        ``[2N, d]``."""
        gamma = torch.exp(self.gamma_log).unsqueeze(-1)
        return torch.stack([gamma * self.B_re, gamma * self.B_im], dim=1).flatten(0, 1)

    def input_map(self) -> tuple[Tensor, None]:
        return self._input_weight(), None

    def coefficients(self, p: Tensor) -> tuple[Tensor, Tensor]:
        """(λ at every step, broadcast over the streams; γ ⊙ B u_k) as complex numbers, from the input map
        ``p`` = γ ⊙ B u_k as real pairs (Re, Im), in float32 at least (there is no complex bfloat16)."""
        p = p.to(torch.promote_types(p.dtype, torch.float32)).contiguous()
        b = torch.view_as_complex(p.unflatten(-1, (-1, 2)))
        lam = torch.polar(torch.exp(-torch.exp(self.nu_log)), torch.exp(self.theta_log)).to(b.dtype)
        return lam.expand(*b.shape[:-2], 1, -1), b

    def scan_state(self, state: State) -> Tensor:
        return torch.complex(*state)

    def output(self, x: Tensor, u: Tensor, *extras: Tensor) -> Tensor:
        y = x.real @ self.C_re.T - x.imag @ self.C_im.T + self.D * u  # y_k = Re(C x_k) + D ⊙ u_k
        return _ACTIVATIONS[self.config.activation](y)

    def carried(self, x: Tensor, u: Tensor) -> State:
        return x.real.contiguous(), x.imag.contiguous()
