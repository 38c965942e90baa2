"""Time each form of charlm.cells.scan.linear_scan, forward + backward of a random loss.

    PYTHONPATH=. python3 benchmarks/scan_forms.py [--threads 1] [--repeats 10]   (from the repository root)

Prints milliseconds (the fastest of the repeats, the forms interleaved, so that other load on the
machine blurs them alike) per form and shape; no assertion, a measurement.
"""

from __future__ import annotations

import argparse
import time

import torch

from charlm.cells.scan import linear_scan

SHAPES = [(256, 32, 300), (50, 250, 300), (50, 32, 300), (16, 32, 300), (10, 32, 300), (4, 32, 300)]
FORMS = ["loop", "log", "doubling", "chunked"]


def inputs(steps: int, batch: int, width: int, grad: bool):
    torch.manual_seed(0)
    a = torch.rand(steps, batch, width).mul_(0.5).add_(0.45).requires_grad_(grad)
    b = torch.randn(steps, batch, width).abs_().add_(0.01).requires_grad_(grad)
    h0 = torch.randn(batch, width).requires_grad_(grad)
    return a, b, h0, torch.randn(steps, batch, width)


def run_once(method: str, a, b, h0, weights, grad: bool) -> float:
    start = time.perf_counter()
    if grad:
        h = linear_scan(a, b, h0, method)
        (h * weights).sum().backward()
    else:
        with torch.no_grad():
            linear_scan(a, b, h0, method)
    return time.perf_counter() - start


def time_forms(shape, repeats: int, grad: bool = True) -> list[float]:
    tensors = inputs(*shape, grad)
    times = {form: [] for form in FORMS}
    for round in range(repeats + 1):  # the first round warms up
        for form in FORMS:
            elapsed = run_once(form, *tensors, grad)
            if round:
                times[form].append(elapsed)
    return [1000 * min(times[form]) for form in FORMS]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--no-grad", action="store_true", help="forward only, without autograd")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} thread(s), {'forward' if args.no_grad else 'forward + backward'}")
    print(f"{'T × B × n':>16} " + " ".join(f"{form:>9}" for form in FORMS))
    for steps, batch, width in SHAPES:
        row = time_forms((steps, batch, width), args.repeats, not args.no_grad)
        print(f"{f'{steps} × {batch} × {width}':>16} " + " ".join(f"{ms:9.1f}" for ms in row))


if __name__ == "__main__":
    main()
