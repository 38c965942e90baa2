"""``--compile``: the training forward pass through ``torch.compile``, never required.

``torch.compile`` traces the model's forward (the time loop unrolled: the window's shape is fixed)
and generates fused kernels for it: C++ on the CPU, Triton on a GPU. The first step of each window
shape pays the compilation; charlm reports that time. Evaluation and sampling stay eager (their
batch sizes differ, and each shape would compile again).

Compilation needs a working toolchain (a C++ compiler for the CPU, Triton for CUDA) and a Python
that TorchDynamo supports. Where it fails, charlm says so in one line and trains eagerly: the model
computes the same function either way, so a run never depends on the compiler.

The first compiled window is checked against the eager forward on the same window (its logits and
new state, ``charlm.runtime.fast_path_check``); a difference beyond the precision's tolerance falls
back the same way. With dropout the two draw different masks (inductor generates its own random
numbers), so the check says it could not compare rather than pass.
"""

from __future__ import annotations

import time

import torch

from charlm.logs import get_logger
from charlm.runtime.fast_path_check import (
    FastPathCheck,
    largest_difference,
    random_state,
    set_random_state,
    tolerance_for,
)

BACKEND = "inductor"  # torch.compile's default code generator


class CompiledForward:
    """Calls ``torch.compile(network)``, or ``network`` itself where compiling fails.

    Before tracing the model it compiles a tiny function forward and backward, which finds a
    missing C++ compiler or Triton at once; a failure on the model's own first call also falls
    back. The model is compiled for the shape of the first window; a window of another shape (the
    shorter last one of an epoch) runs eagerly rather than compile again. ``probe_seconds`` is the
    probe (before training); ``compile_seconds`` is the probe and the first call, as measured (so it
    includes that step's own work, which a run's training time also counts).

    It is a fast training forward pass as ``charlm.training.reporting.FastForward`` describes.
    """

    record = "compile"  # the record its first-use report goes under

    def __init__(self, network: torch.nn.Module, device: torch.device, backend=None, window_shape=None):
        self.network = network
        self.window_shape = None if window_shape is None else tuple(window_shape)  # compile at this shape only
        self.backend = backend or BACKEND
        self.compile_seconds = self.probe_seconds = 0.0
        self.failure: str | None = None
        self.check = FastPathCheck("compiled step")
        self._shape = None  # the window shape compiled for
        self._compiled = None
        started = time.monotonic()
        try:
            _probe(device, self.backend)
            self._compiled = torch.compile(network, backend=self.backend, dynamic=False)
        except Exception as error:  # no compiler, no Triton, a Python TorchDynamo does not support
            self._fall_back(error)
        self.probe_seconds = self.compile_seconds = time.monotonic() - started

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

    @property
    def before_training(self) -> dict[str, float]:
        """The run's wall-clock parts spent before training began: the compiler's probe."""
        return {"compile": self.probe_seconds}

    def report_fields(self) -> dict:
        """The ``compile`` record's own fields (the check's are added to them)."""
        return {
            "active": self.active,
            "seconds": round(self.compile_seconds, 3),
            "backend": self.backend_name,
            "failure": self.failure,
        }

    def report_line(self) -> str | None:
        """The log line once settled: where the compile time went and what the check found."""
        if not self.active:
            return None
        first_step = self.compile_seconds - self.probe_seconds
        return (
            f"torch.compile ({self.backend_name}): {self.compile_seconds:.1f} s in all: "
            f"{self.probe_seconds:.1f} s probing the compiler before training (wall time 'compile'), "
            f"{first_step:.1f} s in the first step, compilation included (counted in the train time); "
            f"{self.check.summary()}"
        )

    def __call__(self, inputs, state):
        wanted = self._shape or self.window_shape
        if self.failure is not None or (wanted is not None and tuple(inputs.shape) != tuple(wanted)):
            return self.network(inputs, state)  # an epoch's last, shorter window: not worth compiling for
        if self._shape is not None:
            return self._compiled(inputs, state)
        started = time.monotonic()
        randomness = random_state(inputs.device)
        try:
            result = self._compiled(inputs, state)
        except Exception as error:
            self._fall_back(error)
            set_random_state(inputs.device, randomness)
            return self.network(inputs, state)
        self._shape = inputs.shape
        self.compile_seconds += time.monotonic() - started
        if not self._compare(inputs, state, result, randomness):
            return self.network(inputs, state)
        return result

    def _compare(self, inputs, state, result, randomness) -> bool:
        """Check the first compiled result against the eager forward on the same window; False
        (fallen back, the random state as it was) where they differ."""
        started = time.monotonic()
        check = self.check
        if has_active_dropout(self.network):
            check.active, check.failure = True, "not compared: dropout (the compiled code draws its own masks)"
            return True
        after = random_state(inputs.device)
        with torch.no_grad():
            logits, new_state = self.network(inputs, state)
        set_random_state(inputs.device, after)
        expected = [logits, *(tensor for layer in new_state for tensor in layer)]
        got = [result[0], *(tensor for layer in result[1] for tensor in layer)]
        passed = check.passed(largest_difference(got, expected), tolerance_for(inputs.device, logits.dtype))
        check.seconds = time.monotonic() - started
        if passed:
            check.active = True
            return True
        self._fall_back(check.mismatch())
        set_random_state(inputs.device, randomness)
        return False

    def _fall_back(self, error: BaseException) -> None:
        reason = _root_cause(error)
        self.failure = reason
        self.check.active, self.check.failure = False, reason
        get_logger().warning(
            f"warning: --compile: torch.compile does not work here ({reason}); "
            "training continues without it (the same results at eager speed)"
        )


def has_active_dropout(network: torch.nn.Module) -> bool:
    """Whether a forward pass of ``network`` draws dropout masks (its own, or a model's regularisers')."""
    return any(
        module.training
        and (
            (isinstance(module, torch.nn.modules.dropout._DropoutNd) and module.p > 0)
            or getattr(getattr(module, "regularisers", None), "active", False)
        )
        for module in network.modules()
    )


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
