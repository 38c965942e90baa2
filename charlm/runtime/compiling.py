"""``--compile``: the training forward pass through ``torch.compile``, never required.

``torch.compile`` traces the model's forward (the time loop unrolled: the window's shape is fixed)
and generates fused kernels for it: C++ on the CPU, Triton on a GPU. The first step of each window
shape pays the compilation; charlm reports that time. Evaluation and sampling stay eager (their
batch sizes differ, and each shape would compile again).

Compilation needs a working toolchain (a C++ compiler for the CPU, Triton for CUDA) and a Python
that TorchDynamo supports. Where it fails, charlm says so in one line and trains eagerly: the model
computes the same function either way, so a run never depends on the compiler.
"""

from __future__ import annotations

import time

import torch

from charlm.logs import get_logger

BACKEND = "inductor"  # torch.compile's default code generator


class CompiledForward:
    """Calls ``torch.compile(network)``, or ``network`` itself where compiling fails.

    Before tracing the model it compiles a tiny function forward and backward, which finds a
    missing C++ compiler or Triton at once; a failure on the model's own first call also falls
    back. The model is compiled for the shape of the first window; a window of another shape (the
    shorter last one of an epoch) runs eagerly rather than compile again. ``compile_seconds`` is
    the probe and the first call, as measured (so it includes that step's own work).
    """

    def __init__(self, network: torch.nn.Module, device: torch.device, backend=None, window_shape=None):
        self.network = network
        self.window_shape = None if window_shape is None else tuple(window_shape)  # compile at this shape only
        self.backend = backend or BACKEND
        self.compile_seconds = 0.0
        self.failure: str | None = None
        self._shape = None  # the window shape compiled for
        self._compiled = None
        started = time.monotonic()
        try:
            _probe(device, self.backend)
            self._compiled = torch.compile(network, backend=self.backend, dynamic=False)
        except Exception as error:  # no compiler, no Triton, a Python TorchDynamo does not support
            self._fall_back(error)
        self.compile_seconds = time.monotonic() - started

    @property
    def active(self) -> bool:
        return self.failure is None

    @property
    def backend_name(self) -> str:
        return self.backend if isinstance(self.backend, str) else getattr(self.backend, "__name__", "custom")

    @property
    def settled(self) -> bool:
        """Compiled, or fallen back: what ``active`` says is final."""
        return self.failure is not None or self._shape is not None

    def __call__(self, inputs, state):
        wanted = self._shape or self.window_shape
        if self.failure is not None or (wanted is not None and tuple(inputs.shape) != tuple(wanted)):
            return self.network(inputs, state)  # an epoch's last, shorter window: not worth compiling for
        if self._shape is not None:
            return self._compiled(inputs, state)
        started = time.monotonic()
        try:
            result = self._compiled(inputs, state)
        except Exception as error:
            self._fall_back(error)
            return self.network(inputs, state)
        self._shape = inputs.shape
        self.compile_seconds += time.monotonic() - started
        return result

    def _fall_back(self, error: BaseException) -> None:
        reason = _root_cause(error)
        self.failure = reason
        get_logger().warning(f"warning: --compile: torch.compile does not work here ({reason}); "
                             "training continues without it (the same results at eager speed)")


def _probe(device: torch.device, backend) -> None:
    """Compile and run a tiny function forward and backward on ``device``; raises what compiling raises."""
    def function(x):
        return torch.sigmoid(x) * x + 1

    x = torch.ones(4, device=device, requires_grad=True)
    torch.compile(function, backend=backend, dynamic=False)(x).sum().backward()


def _root_cause(error: BaseException) -> str:
    """``Type: first line`` of the innermost exception (TorchDynamo wraps a backend's error in its
    own, with several paragraphs of advice)."""
    while True:
        inner = getattr(error, "inner_exception", None) or error.__cause__
        if inner is None:
            break
        error = inner
    lines = str(error).strip().splitlines()
    message = lines[0] if lines else ""
    if len(message) > 160:
        message = message[:157] + "..."
    return f"{type(error).__name__}: {message}" if message else type(error).__name__
