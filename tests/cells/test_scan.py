"""The forms of the linear scan h_t = a_t ⊙ h_{t−1} + b_t (charlm.cells.scan), each held to a plain
loop in float64, in value and in gradient, with a carried state and windows of odd lengths."""

import pytest
import torch

from charlm.cells.scan import SCAN_METHODS, ScanConfig, choose_method, linear_scan, log_scan, scan_chunked, scan_loop
from charlm.errors import CharlmError

LENGTHS = [1, 2, 7, 50, 257]
FORMS = [method for method in SCAN_METHODS if method != "loop"]


def naive(a, b, h0):
    """The recurrence as written, independent of the module."""
    h, outputs = h0, []
    for t in range(a.shape[0]):
        h = a[t] * h + b[t]
        outputs.append(h)
    return torch.stack(outputs)


def coefficients(steps, batch=3, width=4, positive_b=False, seed=0):
    generator = torch.Generator().manual_seed(seed)
    a = 0.05 + 0.9 * torch.rand(steps, batch, width, generator=generator, dtype=torch.float64)
    b = torch.randn(steps, batch, width, generator=generator, dtype=torch.float64)
    if positive_b:
        b = b.abs() + 0.01
    h0 = torch.randn(batch, width, generator=generator, dtype=torch.float64)
    return a, b, h0


@pytest.mark.parametrize("steps", LENGTHS)
def test_loop_is_the_recurrence(steps):
    a, b, h0 = coefficients(steps)
    torch.testing.assert_close(scan_loop(a, b, h0), naive(a, b, h0))
    with torch.no_grad():  # the loop's in-place path
        torch.testing.assert_close(scan_loop(a, b, h0), naive(a, b, h0))


@pytest.mark.parametrize("positive_b", [True, False], ids=["b>0", "b of either sign"])
@pytest.mark.parametrize("steps", LENGTHS)
@pytest.mark.parametrize("method", FORMS)
def test_every_form_agrees_with_the_loop_in_value_and_gradient(method, steps, positive_b):
    a, b, h0 = (t.requires_grad_() for t in coefficients(steps, positive_b=positive_b))
    fast, reference = linear_scan(a, b, h0, method), naive(a, b, h0)
    torch.testing.assert_close(fast, reference)
    weights = torch.randn_like(fast)
    fast_grads = torch.autograd.grad((fast * weights).sum(), [a, b, h0])
    ref_grads = torch.autograd.grad((reference * weights).sum(), [a, b, h0])
    for got, expected in zip(fast_grads, ref_grads):
        torch.testing.assert_close(got, expected)


@pytest.mark.parametrize("method", SCAN_METHODS)
def test_gradcheck(method):
    a, b, h0 = coefficients(9, batch=2, width=2, positive_b=True)
    inputs = tuple(t.requires_grad_() for t in (a, b, h0))
    assert torch.autograd.gradcheck(lambda a, b, h0: linear_scan(a, b, h0, method), inputs)


@pytest.mark.parametrize("steps", [7, 50])
@pytest.mark.parametrize("method", SCAN_METHODS)
def test_two_windows_with_the_carried_state_equal_one_long_window(method, steps):
    a, b, h0 = coefficients(2 * steps + 1, positive_b=True)
    whole = linear_scan(a, b, h0, method)
    first = linear_scan(a[:steps], b[:steps], h0, method)
    second = linear_scan(a[steps:], b[steps:], first[-1], method)
    torch.testing.assert_close(torch.cat([first, second]), whole)


@pytest.mark.parametrize("chunk", [1, 3, 8, 64])
def test_chunked_any_chunk_size(chunk):
    a, b, h0 = coefficients(50)
    torch.testing.assert_close(scan_chunked(a, b, h0, chunk), naive(a, b, h0))


def test_chunked_survives_products_that_underflow():
    """cumprod of small a underflows to 0 within a chunk: the true product, no division by it."""
    a, b, h0 = coefficients(257, positive_b=True)
    a = a * 1e-30
    torch.testing.assert_close(linear_scan(a, b, h0, "chunked"), naive(a, b, h0))
    torch.testing.assert_close(linear_scan(a.float(), b.float(), h0.float(), "chunked"), naive(a, b, h0).float())


def test_log_scan_from_log_coefficients_with_zero_or_negative_state():
    a, b, h0 = coefficients(50, positive_b=True)
    for state in (h0, -h0.abs(), torch.zeros_like(h0)):
        torch.testing.assert_close(log_scan(a.log(), b.log(), state), naive(a, b, state))
    torch.testing.assert_close(log_scan(a.log(), b.log()), naive(a, b, torch.zeros_like(h0)))


def test_log_scan_has_finite_gradients_from_a_zero_state():
    a, b, h0 = coefficients(20, positive_b=True)
    log_a, log_b = a.log().requires_grad_(), b.log().requires_grad_()
    h = log_scan(log_a, log_b, torch.zeros_like(h0))
    grads = torch.autograd.grad(h.sum(), [log_a, log_b])
    assert all(torch.isfinite(g).all() for g in grads)


def test_log_form_refuses_a_that_is_not_positive():
    a, b, h0 = coefficients(5)
    a[2, 0, 0] = -0.5
    with pytest.raises(CharlmError, match="a > 0"):
        linear_scan(a, b, h0, "log")


def test_a_bad_method_name_is_a_clear_error():
    a, b, h0 = coefficients(5)
    with pytest.raises(CharlmError, match="unknown scan method 'fast'.*loop"):
        linear_scan(a, b, h0, "fast")
    from charlm.cells import CELLS

    with pytest.raises(CharlmError, match="bad option for cell 'mingru': scan must be one of"):
        CELLS.get("mingru")(2, 3, ScanConfig(scan="fast"))  # a config built in Python, checked as the cell is


def test_auto_runs_the_loop_for_short_windows_and_a_form_for_every_length():
    assert choose_method(1) == "loop" and choose_method(257) == "loop"  # the CPU: measured
    for steps in LENGTHS + [1000]:
        assert choose_method(steps) in SCAN_METHODS
        assert choose_method(steps, "cuda") in SCAN_METHODS


def test_float32_forms_stay_close_to_the_float64_loop():
    a, b, h0 = coefficients(257, batch=4, width=8, positive_b=True)
    reference = naive(a, b, h0).float()
    for method in SCAN_METHODS:
        torch.testing.assert_close(
            linear_scan(a.float(), b.float(), h0.float(), method), reference, rtol=1e-4, atol=1e-4
        )


@pytest.mark.parametrize("method", SCAN_METHODS)
def test_coefficients_given_as_logarithms_give_the_same_window(method):
    a, b, h0 = coefficients(50, positive_b=True)
    torch.testing.assert_close(linear_scan(a.log(), b.log(), -h0, method, logs=True), naive(a, b, -h0))


@pytest.mark.parametrize("method", [method for method in SCAN_METHODS if method != "log"])
def test_complex_coefficients_with_a_broadcast_over_the_batch(method):
    """The Linear RU's scan: a complex a_t, the same for every stream ([T, 1, n]), in value and gradient."""
    (a_re, b_re, h_re), (a_im, b_im, h_im) = coefficients(37), coefficients(37, seed=1)
    a = torch.complex(a_re[:, :1], 0.3 * a_im[:, :1]).requires_grad_()
    b, h0 = torch.complex(b_re, b_im).requires_grad_(), torch.complex(h_re, h_im).requires_grad_()
    fast, reference = linear_scan(a, b, h0, method), naive(a, b, h0)
    torch.testing.assert_close(fast, reference)
    weights = torch.randn_like(fast)
    fast_grads = torch.autograd.grad((fast * weights).real.sum(), [a, b, h0])
    ref_grads = torch.autograd.grad((reference * weights).real.sum(), [a, b, h0])
    for got, expected in zip(fast_grads, ref_grads):
        torch.testing.assert_close(got, expected)
