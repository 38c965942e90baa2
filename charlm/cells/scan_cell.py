"""The base of the cells whose state enters its update linearly, with coefficients from the input alone.

Such a cell is four steps; the cell gives the second (and the last, where its output is not h_t itself):

    p_t = x_t Wᵀ + c                         the input map (``input_map``): one product for the whole window
    (a_t, b_t, e_t…) = coefficients(p_t)     elementwise: the scan's coefficients, and what the output reads
    h_t = a_t ⊙ h_{t−1} + b_t                :func:`charlm.cells.scan.linear_scan`, in the form ``scan`` picks
    y_t = output(h_t, x_t, e_t…)             h_t itself unless the cell reads it out

:class:`ScanCell` runs a window and a sampling step from ``coefficients``; the cell writes its parameters, its
``step`` (its equations, one time step, to which the tests hold the window and the sampling step) and its
``coefficients``. minGRU and minLSTM, Griffin's RG-LRU, the QRNN, HGRN and the Linear RU (a complex h) are
written on it; docs/parallel-cells.md shows a new one.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import Tensor

from charlm.cells.base import EmbeddingLookup, InferenceStep, RecurrentCell, State
from charlm.cells.scan import ScanConfig, linear_scan


class ScanCell(RecurrentCell):
    """A cell whose window is one linear scan over coefficients computed from its input alone.

    A subclass gives ``step``, ``coefficients`` and, unless its input map is ``self.weight`` and
    ``self.bias``, ``input_map``; the other methods below are hooks with the defaults most cells need.
    """

    Config = ScanConfig  # a Config of one's own needs a `scan` field: the form of the scan (charlm.cells.scan)
    parallel_form = "scan"
    folds_embedding = True
    evaluates_through_step = False  # the scan is also evaluation's fastest path
    # Whether the coefficients of a step read that step's input map alone: then the bottom layer computes
    # them for the V symbols of the vocabulary and gathers them, and sampling takes them ahead.
    per_symbol: ClassVar[bool] = True
    reads_input: ClassVar[bool] = False  # whether output or carried read the input x itself

    def __init_subclass__(cls, **kwargs):
        """The sampling step is computed from ``coefficients``: a subclass that writes its own keeps it
        (RecurrentCell gives a subclass with its own ``step`` the plain one, see there)."""
        its_own = "inference_step" in cls.__dict__
        super().__init_subclass__(**kwargs)
        if "coefficients" in cls.__dict__ and not its_own:
            cls.inference_step = ScanCell.inference_step

    def input_map(self) -> tuple[Tensor, Tensor | None]:
        """W and c of the input map p_t = x_t Wᵀ + c (c may be None)."""
        return self.weight, self.bias

    def coefficients(self, p: Tensor) -> tuple[Tensor, ...]:
        """``(a, b, *extras)`` from the input map ``p`` (``[..., k]``): a and b for the scan, the extras
        for ``output``. With ``per_symbol``, every one as wide as the state."""
        raise NotImplementedError

    def log_coefficients(self, p: Tensor) -> tuple[Tensor, ...] | None:
        """``coefficients`` with a and b as their logarithms, computed in log space, for the log form of the
        scan (a, b > 0); None: that form takes the logarithms itself (b of either sign split in two)."""
        return None

    def output(self, h: Tensor, x: Tensor | None, *extras: Tensor) -> Tensor:
        """The depth output from the states ``h`` and the inputs ``x`` (a window or one step)."""
        return h

    def scan_state(self, state: State) -> Tensor:
        """The h_0 that the scan starts from, out of the carried state."""
        return state[0]

    def carried(self, h: Tensor, x: Tensor) -> State:
        """The state carried on from the last h and the last input."""
        return (h,)

    def window_input_map(self, inputs: Tensor, state: State, lookup: EmbeddingLookup | None) -> Tensor:
        """The input map of every step of the window, ``[T, B, k]``."""
        return self.input_product(inputs, *self.input_map(), lookup)

    def step_input_map(self, projected: Tensor, state: State) -> Tensor:
        """The input map of one step from ``x Wᵀ + c`` (what a cell that reads more than x adds to it)."""
        return projected

    def forward(self, inputs: Tensor, state: State, lookup: EmbeddingLookup | None = None) -> tuple[Tensor, State]:
        if lookup is not None and self.per_symbol:  # the coefficients for the V symbols, then a row per position
            coefficients, logs = self._scan_coefficients(lookup.rows(*self.input_map()))
            widths = [part.shape[-1] for part in coefficients]
            coefficients = lookup.spread(torch.cat(coefficients, dim=-1)).split(widths, dim=-1)
        else:
            coefficients, logs = self._scan_coefficients(self.window_input_map(inputs, state, lookup))
        a, b, *extras = coefficients
        h = linear_scan(a, b, self.scan_state(state), self.config.scan, logs=logs)
        return self.output(h, inputs, *extras), self.carried(h[-1], inputs[-1])

    def _scan_coefficients(self, p: Tensor) -> tuple[tuple[Tensor, ...], bool]:
        """The coefficients, as logarithms (True) where the scan's form is the log form and the cell has them."""
        if self.config.scan == "log":
            logs = self.log_coefficients(p)
            if logs is not None:
                return logs, True
        return self.coefficients(p), False

    def inference_step(self) -> "ScanInference":
        return ScanInference(self)


class ScanInference(InferenceStep):
    """A :class:`ScanCell`'s step for sampling: the input map taken ahead (and its coefficients, where they
    read it alone), then one multiply-add and the output."""

    def __init__(self, cell: ScanCell):
        super().__init__(cell)
        weight, self.bias = cell.input_map()
        self.weight = weight.T
        self.reads_input = cell.reads_input

    def project(self, x: Tensor) -> Tensor:
        p = x @ self.weight if self.bias is None else torch.addmm(self.bias, x, self.weight)
        return torch.cat(self.cell.coefficients(p), dim=-1) if self.cell.per_symbol else p

    def advance(self, projected: Tensor, x: Tensor | None, state: State) -> tuple[Tensor, State]:
        cell = self.cell
        h = cell.scan_state(state)
        if cell.per_symbol:
            a, b, *extras = projected.split(h.shape[-1], dim=-1)
        else:
            a, b, *extras = cell.coefficients(cell.step_input_map(projected, state))
        h = torch.addcmul(b, a, h)  # h_t = a_t ⊙ h_{t−1} + b_t
        return cell.output(h, x, *extras), cell.carried(h, x)
