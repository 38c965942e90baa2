"""The first-order linear recurrence ``h_t = a_t ⊙ h_{t−1} + b_t`` over a window, and ways to compute it.

Cells whose state enters its own update linearly, with coefficients that depend on the input alone
(those on :class:`charlm.cells.scan_cell.ScanCell`: minGRU, minLSTM, Griffin's RG-LRU, the QRNN, HGRN, the
Linear RU), compute ``a`` and ``b`` for the whole window in a few tensor operations and hand them to
:func:`linear_scan`, the one entry point. Every form below returns the same ``[T, B, n]`` of
every ``h_t`` from ``a``, ``b`` (``[T, B, n]``) and the carried state ``h0`` (``[B, n]``), and is
differentiable by autograd in ``a``, ``b`` and ``h0``; the tests hold each to :func:`scan_loop`.

- ``loop``: one fused multiply-add per step (:func:`scan_loop`), the reference. T dependent steps.
- ``log``: Heinsen's log-space form (:func:`log_scan`): with ``a*_t = Σ_{k≤t} log a_k``,
  ``h_t = e^{a*_t} h0 + exp(a*_t + logcumsumexp_k(log b_k − a*_k))``: two cumulative operations
  over time. Needs ``a > 0``; ``b`` is written as the difference of two positive parts when it has
  either sign. Cells that compute in log space (minGRU, minLSTM) give :func:`linear_scan` their
  log-coefficients (``logs=True``), which go to :func:`log_scan` directly. ``h0`` enters linearly,
  so it may be zero or negative.
- ``doubling``: Hillis–Steele. The pairs (A, B) of the affine maps ``h ↦ A h + B`` compose as
  ``(A₂, B₂)∘(A₁, B₁) = (A₂A₁, A₂B₁ + B₂)``; ⌈log₂ T⌉ rounds of whole-window multiply-adds, each
  composing every position with the one ``s = 1, 2, 4, …`` before it.
- ``chunked``: the window cut in chunks of C ≈ √T steps. The products within each chunk by one
  ``cumprod`` (no division by it, so a small ``a`` underflowing to 0 is harmless), the scan within
  every chunk from a zero state by a loop over the C positions run for all chunks at once, then the
  T/C states carried from chunk to chunk, then one multiply-add for the whole window: about 2√T
  dependent steps instead of T.
- ``auto``: by device and window length (:func:`choose_method`).

Measured on the CPU (2-core AMD EPYC, torch 2.13, float32, forward + backward of a random loss,
milliseconds, the fastest of 5 interleaved runs, ``benchmarks/scan_forms.py``; the machine was
shared with other jobs, so the numbers are noisy, but the order never changed):

    T × B × n        threads   loop     log   doubling   chunked
    256 × 32 × 300      1        29     498      413        80
    50 × 250 × 300      1        46     830      482       144
    256 × 32 × 300      2       124     960     1444       399
    50 × 250 × 300      2       250    1132     1688       427
    16 × 32 × 300       1       1.2    25.5      5.6       2.9

On the CPU the loop wins at every shape: each form that saves dependent steps pays in whole-window
passes (fresh allocations, autograd's copies), and the CPU has few operations to overlap. So
``auto`` runs the loop on the CPU. On a GPU, where every operation costs a launch, it runs the loop
for windows of up to ``LOOP_UP_TO`` steps and doubling (⌈log₂ T⌉ rounds) above; that choice is not
measured (no GPU was at hand).
"""

from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F
from torch import Tensor

from charlm.errors import CharlmError
from charlm.settings import setting

SCAN_METHODS = ("auto", "loop", "log", "doubling", "chunked")

LOOP_UP_TO = 16  # on a GPU, windows this short run the loop (on the CPU every window does: measured)


@dataclasses.dataclass
class ScanConfig:
    scan: str = setting(
        "auto",
        "How forward runs the recurrence over a window: auto (measured fastest), or forced: loop, log (log space, "
        "Heinsen), doubling (Hillis–Steele), chunked (in chunks of the window).",
        choices=SCAN_METHODS,
    )


def check_method(method: str) -> str:
    """``method`` if it names a form of the scan; a CharlmError saying which do otherwise."""
    if method not in SCAN_METHODS:
        raise CharlmError(f"unknown scan method {method!r}; the methods are {', '.join(SCAN_METHODS)}")
    return method


def choose_method(steps: int, device: torch.device | str = "cpu") -> str:
    """The form ``auto`` runs for a window of ``steps`` on ``device``: the loop on the CPU (measured,
    see the module's docstring); elsewhere the loop up to ``LOOP_UP_TO`` steps, doubling above."""
    if torch.device(device).type == "cpu" or steps <= LOOP_UP_TO:
        return "loop"
    return "doubling"


def scan_loop(a: Tensor, b: Tensor, h0: Tensor) -> Tensor:
    """The reference: one step at a time. ``a``, ``b`` are ``[T, B, n]``, ``h0`` is ``[B, n]``;
    returns every ``h_t``, ``[T, B, n]``."""
    if not torch.is_grad_enabled() or not any(t.requires_grad for t in (a, b, h0)):
        out = torch.empty(torch.broadcast_shapes(a.shape, b.shape), dtype=b.dtype, device=b.device)
        h = h0
        for t in range(a.shape[0]):
            h = torch.addcmul(b[t], a[t], h, out=out[t])  # h_t = a_t ⊙ h_{t−1} + b_t, written in place
        return out
    h = h0
    outputs = []
    for a_t, b_t in zip(a, b):
        h = torch.addcmul(b_t, a_t, h)  # h_t = a_t ⊙ h_{t−1} + b_t
        outputs.append(h)
    return torch.stack(outputs)


def log_scan(log_a: Tensor, log_b: Tensor, h0: Tensor | None = None) -> Tensor:
    """Heinsen's log-space scan: ``h_t = a_t ⊙ h_{t−1} + b_t`` from ``log a`` and ``log b``
    (``[T, B, n]``, so a > 0 and b > 0) and ``h0`` (``[B, n]``, any sign; None for zeros).
    Returns every ``h_t`` (not its log), ``[T, B, n]``.

    ``a*_t = Σ_{k≤t} log a_k``; ``h_t = e^{a*_t} h0 + exp(a*_t + logcumsumexp_k(log b_k − a*_k))``.
    The carried state enters through the first term, outside the logarithms, so that a zero state
    (the start of every sequence) or a negative one costs no log 0 and no complex numbers.
    """
    a_star = torch.cumsum(log_a, dim=0)
    h = torch.exp(a_star + torch.logcumsumexp(log_b - a_star, dim=0))
    if h0 is None:
        return h
    return torch.addcmul(h, torch.exp(a_star), h0)


def scan_log(a: Tensor, b: Tensor, h0: Tensor) -> Tensor:
    """:func:`log_scan` from ``a`` (> 0) and ``b`` of any sign: a ``b`` that is not positive
    everywhere is split into ``p − q`` with ``p = relu(b) + m``, ``q = relu(−b) + m``,
    ``m = |b| + tiny`` (both positive), and the two scans subtracted (the recurrence is linear in b)."""
    if a.is_complex() or not bool((a > 0).all()):
        raise CharlmError("the log-space scan needs a > 0 everywhere (use another scan method)")
    log_a = torch.log(a)
    if bool((b > 0).all()):
        return log_scan(log_a, torch.log(b), h0)
    margin = b.abs() + torch.finfo(b.dtype).tiny
    positive = log_scan(log_a, torch.log(torch.relu(b) + margin), h0)
    return positive - log_scan(log_a, torch.log(torch.relu(-b) + margin))


def scan_doubling(a: Tensor, b: Tensor, h0: Tensor) -> Tensor:
    """Hillis–Steele: after the round of offset s every position holds the composition of the maps
    of the 2s positions up to it; ⌈log₂ T⌉ rounds. ``h0`` is folded into the first map's offset."""
    steps = a.shape[0]
    B = torch.cat([torch.addcmul(b[:1], a[:1], h0.unsqueeze(0)), b[1:]])  # B_1 = a_1 h0 + b_1
    A = a
    offset = 1
    while offset < steps:
        # (A_t, B_t) ← (A_t, B_t) ∘ (A_{t−s}, B_{t−s}), from the previous round's values; the maps
        # before the window are the identity (A = 1, B = 0), so positions t < s keep theirs
        earlier = (0, 0) * (B.dim() - 1) + (offset, 0)  # pads the time dimension at its start
        shifted_B = F.pad(B[:-offset], earlier)
        if 2 * offset < steps:  # the last round's products are never read
            A, B = A * F.pad(A[:-offset], earlier, value=1.0), torch.addcmul(B, A, shifted_B)
        else:
            B = torch.addcmul(B, A, shifted_B)
        offset *= 2
    return B


def scan_chunked(a: Tensor, b: Tensor, h0: Tensor, chunk: int | None = None) -> Tensor:
    """The window in chunks of ``chunk`` steps (default ⌈√T⌉): within-chunk scans from a zero state,
    all chunks at once; the chunks' end states carried one chunk at a time; one multiply-add."""
    steps = a.shape[0]
    size = chunk or max(1, math.ceil(math.sqrt(steps)))
    chunks = -(-steps // size)
    shape = torch.broadcast_shapes(a.shape, b.shape)[1:]
    a, b = a.expand(steps, *shape), b.expand(steps, *shape)
    pad = chunks * size - steps
    if pad:  # a = 1, b = 0 after the window: the padded steps change nothing before them
        a = torch.cat([a, a.new_ones(pad, *shape)])
        b = torch.cat([b, b.new_zeros(pad, *shape)])
    a = a.view(chunks, size, *shape)
    b = b.view(chunks, size, *shape)
    products = torch.cumprod(a, dim=1)  # ∏ a within the chunk up to each step
    a_steps, b_steps = a.unbind(1), b.unbind(1)  # unbound, not indexed: one gradient copy, not one per step
    local = [b_steps[0]]
    for a_j, b_j in zip(a_steps[1:], b_steps[1:]):  # the scan within every chunk from a zero state, all at once
        local.append(torch.addcmul(b_j, a_j, local[-1]))
    ends, end_products = local[-1].unbind(0), products.select(1, -1).unbind(0)
    carried = [h0]
    for end, product in zip(ends[:-1], end_products[:-1]):  # the state entering each following chunk
        carried.append(torch.addcmul(end, product, carried[-1]))
    entering = torch.stack(carried).unsqueeze(1)  # [chunks, 1, ...]
    h = torch.addcmul(torch.stack(local, dim=1), products, entering)  # (∏ a) ⊙ state entering + local scan
    return h.reshape(chunks * size, *shape)[:steps]


_FORMS = {"loop": scan_loop, "log": scan_log, "doubling": scan_doubling, "chunked": scan_chunked}


def linear_scan(a: Tensor, b: Tensor, h0: Tensor, method: str = "auto", logs: bool = False) -> Tensor:
    """``h_t = a_t ⊙ h_{t−1} + b_t`` for t = 1..T from ``h0``: ``[T, B, n]`` of every ``h_t``.

    ``method`` is one of ``SCAN_METHODS``; ``auto`` picks by window length and device
    (:func:`choose_method`). ``log`` needs real ``a > 0``. ``a`` may be broadcast over the batch
    (``[T, 1, n]``), and every tensor complex except in the log form. ``logs``: ``a`` and ``b`` are
    given as their logarithms, as a cell computes them where a and b would underflow (minGRU, minLSTM).
    """
    check_method(method)
    if logs:
        return log_scan(a, b, h0) if method == "log" else linear_scan(a.exp(), b.exp(), h0, method)
    if method == "auto":
        method = choose_method(a.shape[0], a.device)
    return _FORMS[method](a, b, h0)
