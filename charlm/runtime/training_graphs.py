"""CUDA graphs for training (``charlm train --cuda-graph``): a window's forward and backward,
captured once and replayed.

Training runs a window of T steps through a Python loop: on a GPU about a dozen kernels a step,
forward and backward, each waiting on its launch. A full window always has the same shape, so
:class:`GraphedWindow` captures the network's forward and backward once with
``torch.cuda.make_graphed_callables`` and replays them for every full window; the loss, the
gradient clipping and Adam's step stay as they are (a few launches a window). The shorter last
window of an epoch runs eagerly, as it does under ``--compile``. The buffer handling and the
first-use check are those of ``charlm.runtime.cuda_graphs``; the CUDA side is untested on a GPU.
"""

from __future__ import annotations

import time

import torch
from torch import Tensor, nn
from torch.cuda import make_graphed_callables

from charlm.logs import get_logger
from charlm.runtime.cuda_graphs import (
    flatten_state,
    generator_kept_on_failure,
    on_device,
    one_line,
    synchronisation_errors,
    unaliased,
    unflatten_state,
)
from charlm.runtime.fast_path_check import (
    ENVIRONMENT_SWITCH,
    FastPathCheck,
    detached_copies,
    graphs_disabled,
    largest_difference,
    poison_,
    probe_loss,
    random_state,
    set_random_state,
    tolerance_for,
)
from charlm.runtime.precision import without_autocast_cache


class FlatWindow(nn.Module):
    """``network(tokens, state)`` in the form ``make_graphed_callables`` takes: tensors in (the
    state flattened), tensors out (the logits, then the new state, detached: the next window reads
    it as an input, gradients never flow back through it)."""

    def __init__(self, network: nn.Module, layout: list[int]):
        super().__init__()
        self.network, self.layout = network, layout

    def forward(self, tokens: Tensor, *flat_state: Tensor) -> tuple[Tensor, ...]:
        logits, new_state = self.network(tokens, unflatten_state(flat_state, self.layout))
        detached = [tensor.detach() for layer in new_state for tensor in layer]
        return (logits, *unaliased(detached, [tokens, *flat_state, logits]))


class GraphedWindow:
    """Calls ``network(tokens, state)`` for training, its forward and backward replayed from CUDA
    graphs captured on the first full window.

    The graphs read the parameters where they are (Adam updates them in place) and copy the tokens
    and the carried state into their static inputs; the logits and the new state they return are
    their own static tensors, overwritten by the next replay (training computes the loss from the
    logits and copies the state before then). A window of another shape runs eagerly.

    The first full window is run eagerly first, forward and backward, with synchronisation errors
    on: a cell that reads a value back to the CPU fails there, before anything is captured. After
    capturing, the graphs run that window from the same random state (dropout draws the same masks)
    with their outputs poisoned with NaN, and their logits, new state and weight gradients are
    compared with the eager ones (``check``). Where capturing fails or the results differ, charlm
    says so in one line and trains eagerly: the same function, so a run never depends on it.

    ``graph_callables``: what captures (``torch.cuda.make_graphed_callables``; tests pass a stand-in).

    It is a fast training forward pass as ``charlm.training.reporting.FastForward`` describes.
    """

    record = "cuda_graph"  # the record its first-use report goes under

    def __init__(self, network: nn.Module, device: torch.device, graph_callables=None, window_shape=None):
        self.network, self.device = network, device
        self.graph_callables = graph_callables or make_graphed_callables
        self.window_shape = None if window_shape is None else tuple(window_shape)  # capture at this shape only
        self.capture_seconds = 0.0
        self.check = FastPathCheck("training graph")
        self._shape = None  # the window shape captured for
        self.first_failure = None  # why a first capture failed, where the second was tried
        self._graphed = None

    @property
    def active(self) -> bool:
        return self.check.failure is None

    @property
    def failure(self) -> str | None:
        return self.check.failure

    @property
    def settled(self) -> bool:
        """Captured and checked, or fallen back: what ``active`` says is final."""
        return self.check.failure is not None or self._graphed is not None

    @property
    def before_training(self) -> dict[str, float]:
        """The run's wall-clock parts spent before training began: none (capturing is in the first step)."""
        return {}

    def report_fields(self) -> dict:
        """The ``cuda_graph`` record's own fields (the check's are added to them)."""
        return {"active": self.active, "seconds": round(self.capture_seconds, 3), "failure": self.failure}

    def report_line(self) -> str | None:
        """The log line once settled: how long capturing took and what the check found."""
        if not (self.active and self.capture_seconds):
            return None
        return f"CUDA graphs of the training window captured in {self.capture_seconds:.1f} s; {self.check.summary()}"

    def __call__(self, tokens: Tensor, state: list) -> tuple[Tensor, list]:
        wanted = self._shape or self.window_shape
        if self.check.failure is not None or (wanted is not None and tuple(tokens.shape) != tuple(wanted)):
            return self.network(tokens, state)  # an epoch's last, shorter window
        flat, layout = flatten_state(state)
        if self._graphed is None:
            started = time.monotonic()
            randomness = random_state(self.device)
            try:
                window = FlatWindow(self.network, layout)
                expected = self._eager_outputs_and_gradients(window, tokens, flat)
                self._capture(window, tokens, flat)
                self.capture_seconds = time.monotonic() - started
                self._compare(tokens, flat, expected, randomness)
            except Exception as error:  # a cell that synchronises with the CPU, an old driver, a replay that differs
                self._graphed = None
                set_random_state(self.device, randomness)
                self._fall_back(error)
                return self.network(tokens, state)
            self.check.active = True
            set_random_state(self.device, randomness)  # the window as training would have drawn it
        logits, *new_flat = self._graphed(tokens, *flat)
        return logits, unflatten_state(new_flat, layout)

    def _parameters(self) -> list[nn.Parameter]:
        return [parameter for parameter in self.network.parameters() if parameter.requires_grad]

    def _outputs_and_gradients(self, call, tokens: Tensor, flat: list[Tensor]) -> list:
        """``call``'s logits and new state on this window, and the weights' gradients of
        :func:`probe_loss` (taken apart from ``.grad``), as copies."""
        outputs = call(tokens, *flat)
        gradients = torch.autograd.grad(probe_loss(outputs[0]), self._parameters(), allow_unused=True)
        return detached_copies([*outputs, *gradients])

    def _eager_outputs_and_gradients(self, window: FlatWindow, tokens: Tensor, flat: list[Tensor]) -> list:
        """The eager reference, with autocast's cache emptied and off: a cached cast of a weight
        keeps its autograd node alive, made on the default stream, and a capture whose backward
        meets such a node is invalidated (the first GPU run: rnn under bf16 on an H200)."""
        randomness = random_state(self.device)
        if torch.is_autocast_enabled(self.device.type):
            torch.clear_autocast_cache()
        with on_device(self.device), synchronisation_errors(self.device), without_autocast_cache(self.device):
            expected = self._outputs_and_gradients(window, tokens, flat)
        set_random_state(self.device, randomness)
        return expected

    def _capture(self, window: FlatWindow, tokens: Tensor, flat: list[Tensor]) -> None:
        """Captures, and where that fails, captures once more before giving up: on the first GPU
        run (an H200, torch 2.11) one cell's capture failed while the same cell's passed in another
        process, and the next cell's passed in the same one."""
        sample = (tokens.clone(), *(tensor.detach().clone() for tensor in flat))
        for attempt in (1, 2):
            try:
                with (
                    on_device(self.device),
                    without_autocast_cache(self.device),
                    generator_kept_on_failure(self.device),
                ):
                    self._graphed = self.graph_callables(window, sample, allow_unused_input=True)
                break
            except Exception as error:
                if attempt == 2:
                    raise
                self.first_failure = one_line(error)
                get_logger().warning(
                    f"warning: --cuda-graph: capturing the training window failed "
                    f"({self.first_failure}); trying once more"
                )
        self._shape = tokens.shape

    def _compare(self, tokens: Tensor, flat: list[Tensor], expected: list, randomness) -> None:
        started = time.monotonic()
        set_random_state(self.device, randomness)
        poison_(self._graphed(tokens, *flat))  # the static outputs: a replay that runs nothing leaves NaN
        set_random_state(self.device, randomness)
        got = self._outputs_and_gradients(self._graphed, tokens, flat)
        difference = largest_difference(got, expected)
        passed = self.check.passed(difference, tolerance_for(self.device))
        self.check.seconds = time.monotonic() - started
        if not passed:
            raise self.check.mismatch()

    def _fall_back(self, error: BaseException) -> None:
        self.check.active, self.check.failure = False, one_line(error)
        get_logger().warning(
            f"warning: --cuda-graph: the training window's graphs are not used ({self.check.failure}); "
            "training continues without them (the same results at eager speed)"
        )


def graphed_window(network: nn.Module, device: torch.device, distributed: bool, window_shape=None):
    """What ``--cuda-graph`` trains through: a :class:`GraphedWindow`, or under torchrun (whose
    DistributedDataParallel hooks into the backward pass, which a captured graph skips) or with
    ``CHARLM_NO_CUDA_GRAPHS`` set, with a one-line warning, ``network`` itself."""
    if graphs_disabled():
        get_logger().warning(f"warning: --cuda-graph is turned off by {ENVIRONMENT_SWITCH}; training eagerly")
        return network
    if distributed:
        get_logger().warning(
            "warning: --cuda-graph is not used under torchrun (DistributedDataParallel's "
            "gradient hooks cannot run inside a captured backward); training eagerly"
        )
        return network
    return GraphedWindow(network, device, window_shape=window_shape)
