"""Every fast path checks itself against the eager code it stands in for, the first time it is used.

A CUDA graph (scoring, sampling, the training window) or a compiled step computes what the model
computes only if nothing went wrong that torch does not report: a graph captured on another
device's stream replays nothing, a cell that hands state between slots reads an overwritten input,
a compiler bug. So the first time charlm uses one, it also runs the eager code on the same input
and compares. The fast path's outputs are filled with NaN before its first replay, so a replay
that does nothing cannot pass for one that worked. Where the two differ by more than the
precision allows, or the fast path raises, charlm says so in one line and continues eagerly.

The outcome (:class:`FastPathCheck`) goes into the run's metrics.jsonl and provenance, and into
``charlm eval``'s and ``charlm score``'s JSON. ``CHARLM_NO_CUDA_GRAPHS=1`` turns every CUDA graph
off (training, scoring, sampling, the benchmark), so a user can bisect.
"""

from __future__ import annotations

import dataclasses
import math
import os

import torch
from torch import Tensor

ENVIRONMENT_SWITCH = "CHARLM_NO_CUDA_GRAPHS"

# Largest difference allowed, as |fast − eager| / (1 + |eager|) over every output, by the type the
# matrix products run in. Both sides run the same kernels in the same order, so float32 differs by
# rounding only; under autocast a fused kernel may accumulate in another order.
TOLERANCES = {torch.float64: 1e-9, torch.float32: 1e-4, torch.bfloat16: 5e-2, torch.float16: 5e-3}
TF32_TOLERANCE = 5e-3  # float32 products on TensorFloat-32 units (a 10-bit mantissa)


class FastPathMismatch(RuntimeError):
    """The fast path's result is not the eager result (``check``: the comparison)."""

    def __init__(self, message: str, check: "FastPathCheck | None" = None):
        super().__init__(message)
        self.check = check


def graphs_disabled() -> bool:
    """Whether the environment turns every CUDA graph off (``CHARLM_NO_CUDA_GRAPHS`` set, not 0)."""
    return os.environ.get(ENVIRONMENT_SWITCH, "").strip() not in ("", "0")


def compute_dtype(device: torch.device, dtype: torch.dtype = torch.float32) -> torch.dtype:
    """The type the matrix products run in on ``device``: autocast's, else ``dtype`` (the weights')."""
    if dtype == torch.float32 and torch.is_autocast_enabled(device.type):
        return torch.get_autocast_dtype(device.type)
    return dtype


def tolerance_for(device: torch.device, dtype: torch.dtype = torch.float32) -> float:
    """How far a fast path may be from the eager code on ``device`` (see ``TOLERANCES``)."""
    computed = compute_dtype(device, dtype)
    if computed == torch.float32 and device.type == "cuda" and torch.backends.cuda.matmul.allow_tf32:
        return TF32_TOLERANCE
    return TOLERANCES.get(computed, TOLERANCES[torch.float32])


def largest_difference(actual, expected) -> float:
    """max |a − e| / (1 + |e|) over the pairs of tensors; infinite where a shape differs or the fast
    path gave a NaN or an infinity the eager code did not (a replay that wrote nothing)."""
    worst = 0.0
    for got, wanted in zip(actual, expected, strict=True):
        if got is None or wanted is None:
            if got is not wanted:
                return math.inf
            continue
        if got.shape != wanted.shape:
            return math.inf
        got, wanted = got.detach().double().cpu(), wanted.detach().double().cpu()
        if not torch.equal(torch.isfinite(got), torch.isfinite(wanted)):
            return math.inf
        finite = torch.isfinite(wanted)
        if finite.any():
            difference = ((got[finite] - wanted[finite]).abs() / (1 + wanted[finite].abs())).max().item()
            worst = max(worst, difference)
    return worst


def poison_(tensors) -> None:
    """Fill every floating-point tensor with NaN (before a first replay: one that writes nothing shows)."""
    with torch.no_grad():
        for tensor in tensors:
            if tensor is not None and tensor.is_floating_point():
                tensor.fill_(math.nan)


@dataclasses.dataclass
class FastPathCheck:
    """What the first-use check of one fast path found.

    ``checked``: compared with the eager code (False where it could not be: see ``failure``);
    ``active``: the fast path is used from now on; ``failure``: why not, or why unchecked.
    """

    path: str  # "scoring graph", "sampling graph", "training graph", "compiled step"
    checked: bool = False
    active: bool = False
    max_difference: float | None = None
    tolerance: float | None = None
    failure: str | None = None
    seconds: float = 0.0  # the eager run and the comparison: what the check cost

    def passed(self, difference: float, tolerance: float) -> bool:
        """Record a comparison; whether it is within the tolerance."""
        self.checked, self.max_difference, self.tolerance = True, float(difference), float(tolerance)
        return difference <= tolerance

    def fields(self) -> dict:
        """The record's fields (JSON-ready: an infinite difference is written as None)."""
        fields = dataclasses.asdict(self)
        if fields["max_difference"] is not None and not math.isfinite(fields["max_difference"]):
            fields["max_difference"] = None
        fields["seconds"] = round(self.seconds, 4)
        return fields

    def summary(self) -> str:
        """One line: ``scoring graph: replayed (checked against eager: 3.1e-07 ≤ 0.0001)``."""
        if self.checked and self.max_difference is not None and math.isfinite(self.max_difference):
            comparison = (
                f"{self.max_difference:.2g} {'≤' if self.max_difference <= self.tolerance else '>'} {self.tolerance:g}"
            )
        elif self.checked:
            comparison = "a replay that wrote nothing, or a shape that differs"
        else:
            comparison = "not compared"
        state = "in use" if self.active else f"not used ({self.failure})"
        if self.active and self.failure:
            state += f"; {self.failure}"
        return f"{self.path}: {state} (checked against eager: {comparison})"

    def mismatch(self) -> FastPathMismatch:
        if self.max_difference is None or not math.isfinite(self.max_difference):
            detail = "its outputs are not the eager outputs (NaN left by a replay that ran nothing, or another shape)"
        else:
            detail = f"it differs from eager by {self.max_difference:.3g} (tolerance {self.tolerance:g})"
        return FastPathMismatch(detail, self)


def random_state(device: torch.device):
    """The generator state the fast path and the eager code must both start from (dropout)."""
    if device.type == "cuda":
        return torch.cuda.get_rng_state(device)
    return torch.get_rng_state()


def set_random_state(device: torch.device, state) -> None:
    if device.type == "cuda":
        torch.cuda.set_rng_state(state, device)
    else:
        torch.set_rng_state(state)


def probe_loss(logits: Tensor) -> Tensor:
    """A scalar of the logits whose gradient reaches every weight: mean of squares, in float32."""
    return logits.float().square().mean()


def detached_copies(tensors) -> list:
    return [None if tensor is None else tensor.detach().clone() for tensor in tensors]
