"""CUDA graphs: sampling's step, training's and scoring's windows, captured once and replayed.

**Sampling** runs ``LanguageModel.step`` at batch 1: a few dozen small kernels a symbol, each of
which costs more to launch than to run. The shapes never change, so the step is captured once as
a CUDA graph and replayed: one launch a symbol. The graph reads its inputs from, and writes its
outputs to, fixed ("static") tensors; a call copies the token and the carried state into the
static inputs, replays, and hands back the static outputs, which the next call copies in again.

**Training** (``charlm train --cuda-graph``) runs a window of T steps through a Python loop: on a
GPU about a dozen kernels a step, forward and backward, each waiting on its launch. A full window
always has the same shape, so :class:`GraphedWindow` captures the network's forward and backward
once with ``torch.cuda.make_graphed_callables`` and replays them for every full window; the loss,
the gradient clipping and Adam's step stay as they are (a few launches a window). The shorter last
window of an epoch runs eagerly, as it does under ``--compile``.

**Scoring** a split runs the forward pass window after window under ``inference_mode``; on a GPU
:class:`ScoringForward` captures it on the first full window and replays it for the others.

The buffer handling is the same whatever does the capturing, and the test suite checks it on the
CPU with stand-ins (:class:`ReplayByCalling` for the graphs of sampling and scoring, one that
keeps the contract of ``make_graphed_callables`` for training); no GPU was available to measure
the real graphs.
"""

from __future__ import annotations

import time
from typing import Callable

import torch
from torch import Tensor, nn
from torch.cuda import make_graphed_callables

from charlm.logs import get_logger
from charlm.runtime.precision import without_autocast_cache


def flatten_state(state: list) -> tuple[list[Tensor], list[int]]:
    """The carried state as one list of tensors, and how many of them each layer has."""
    return [tensor for layer in state for tensor in layer], [len(layer) for layer in state]


def unflatten_state(flat, layout: list[int]) -> list[tuple[Tensor, ...]]:
    """The inverse of :func:`flatten_state`."""
    state, start = [], 0
    for width in layout:
        state.append(tuple(flat[start:start + width]))
        start += width
    return state


def unaliased(outputs, inputs) -> list[Tensor]:
    """``outputs`` with a copy in place of any tensor that shares memory with one of ``inputs`` or
    with an earlier output. A graph's outputs must be tensors of their own: a cell whose new state
    hands one input state on into another slot would otherwise have that slot overwritten when the
    next call copies the state into the graph's inputs."""
    seen = {tensor.untyped_storage().data_ptr() for tensor in inputs}
    fresh = []
    for tensor in outputs:
        address = tensor.untyped_storage().data_ptr()
        fresh.append(tensor.clone() if address in seen else tensor)
        seen.add(fresh[-1].untyped_storage().data_ptr())
    return fresh


def one_line(error: BaseException) -> str:
    """``Type: message`` of an error on one line, cut to 160 characters."""
    message = " ".join(str(error).split())
    return f"{type(error).__name__}: {message[:157] + '...' if len(message) > 160 else message}"


class ReplayByCalling:
    """What a CUDA graph does, done by calling the function again: ``capture`` runs it and keeps
    its outputs as the static outputs; ``replay`` runs it again on the static inputs and copies the
    results into those same tensors."""

    def capture(self, function: Callable[[], list[Tensor]]) -> list[Tensor]:
        self.function = function
        self.outputs = function()
        return self.outputs

    def replay(self) -> None:
        for static, fresh in zip(self.outputs, self.function()):
            static.copy_(fresh)


class CudaGraph:
    """``torch.cuda.CUDAGraph`` behind the same two calls, with the warm-up capture needs."""

    def __init__(self, device: torch.device, warmup: int = 3):
        self.device, self.warmup = device, warmup

    def capture(self, function: Callable[[], list[Tensor]]) -> list[Tensor]:
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):  # kernel selection and workspace allocation, outside the graph
            for _ in range(self.warmup):
                function()
        torch.cuda.current_stream(self.device).wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            outputs = function()
        return outputs

    def replay(self) -> None:
        self.graph.replay()


class GraphedCall:
    """``function(tokens, state)`` at the shapes of the ``tokens`` and ``state`` given, replayed from
    a captured graph."""

    def __init__(self, function: Callable, tokens: Tensor, state: list, graph=None):
        self.static_tokens = tokens.clone()
        self.static_state = [tuple(tensor.clone() for tensor in layer) for layer in state]
        self.graph = graph or CudaGraph(tokens.device)

        def run() -> list[Tensor]:
            logits, new_state = function(self.static_tokens, self.static_state)
            inputs = [self.static_tokens, *flatten_state(self.static_state)[0]]
            return unaliased([logits, *flatten_state(new_state)[0]], inputs)

        with without_autocast_cache(tokens.device):
            outputs = self.graph.capture(run)
        self.static_logits = outputs[0]
        self.static_new_state = unflatten_state(outputs[1:], [len(layer) for layer in state])

    def __call__(self, tokens: Tensor, state: list) -> tuple[Tensor, list]:
        """The logits and the new state; both are the graph's own tensors, valid until the next call."""
        self.static_tokens.copy_(tokens.reshape(self.static_tokens.shape))
        for static_layer, layer in zip(self.static_state, state):
            for static, given in zip(static_layer, layer):
                if static is not given:
                    static.copy_(given)
        self.graph.replay()
        return self.static_logits, self.static_new_state


class GraphedStep(GraphedCall):
    """``model.step(tokens, state)`` at a fixed batch size, replayed from a captured graph."""

    def __init__(self, model, state: list, graph=None):
        first = state[0][0]
        tokens = torch.zeros(first.shape[0], dtype=torch.long, device=first.device)
        super().__init__(model.step, tokens, state, graph)


def graphed_step(model, state: list):
    """A :class:`GraphedStep` of ``model`` on a CUDA device, else (or where capture fails, with a
    one-line warning) ``model.step`` itself."""
    device = state[0][0].device
    if device.type != "cuda":
        return model.step
    try:
        return GraphedStep(model, state)
    except Exception as error:  # a cell that synchronises with the CPU, an old driver
        get_logger().warning(f"warning: sampling without a CUDA graph ({one_line(error)})")
        return model.step


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
    logits and copies the state before then). A window of another shape runs eagerly. Where
    capturing fails (a cell that reads a value back to the CPU mid-window, an old driver) charlm
    says so in one line and trains eagerly: the same function, so a run never depends on it.

    ``graph_callables``: what captures (``torch.cuda.make_graphed_callables``; tests pass a stand-in).
    """

    def __init__(self, network: nn.Module, device: torch.device, graph_callables=None, window_shape=None):
        self.network, self.device = network, device
        self.graph_callables = graph_callables or make_graphed_callables
        self.window_shape = None if window_shape is None else tuple(window_shape)  # capture at this shape only
        self.capture_seconds = 0.0
        self.failure: str | None = None
        self._shape = None  # the window shape captured for
        self._graphed = None

    @property
    def active(self) -> bool:
        return self.failure is None

    @property
    def settled(self) -> bool:
        """Captured, or fallen back: what ``active`` says is final."""
        return self.failure is not None or self._graphed is not None

    def __call__(self, tokens: Tensor, state: list) -> tuple[Tensor, list]:
        wanted = self._shape or self.window_shape
        if self.failure is not None or (wanted is not None and tuple(tokens.shape) != tuple(wanted)):
            return self.network(tokens, state)  # an epoch's last, shorter window
        flat, layout = flatten_state(state)
        if self._graphed is None:
            started = time.monotonic()
            try:
                self._capture(tokens, flat, layout)
            except Exception as error:  # a cell that synchronises with the CPU, an old driver
                self._fall_back(error)
                return self.network(tokens, state)
            self.capture_seconds = time.monotonic() - started
        logits, *new_flat = self._graphed(tokens, *flat)
        return logits, unflatten_state(new_flat, layout)

    def _capture(self, tokens: Tensor, flat: list[Tensor], layout: list[int]) -> None:
        window = FlatWindow(self.network, layout)
        sample = (tokens.clone(), *(tensor.detach().clone() for tensor in flat))
        with without_autocast_cache(self.device):
            self._graphed = self.graph_callables(window, sample, allow_unused_input=True)
        self._shape = tokens.shape

    def _fall_back(self, error: BaseException) -> None:
        self.failure = one_line(error)
        get_logger().warning(f"warning: --cuda-graph: capturing the training window failed ({self.failure}); "
                             "training continues without it (the same results at eager speed)")


def graphed_window(network: nn.Module, device: torch.device, distributed: bool, window_shape=None):
    """What ``--cuda-graph`` trains through: a :class:`GraphedWindow`, or under torchrun (whose
    DistributedDataParallel hooks into the backward pass, which a captured graph skips), with a
    one-line warning, ``network`` itself."""
    if distributed:
        get_logger().warning("warning: --cuda-graph is not used under torchrun (DistributedDataParallel's "
                             "gradient hooks cannot run inside a captured backward); training eagerly")
        return network
    return GraphedWindow(network, device, window_shape=window_shape)


class ScoringForward:
    """``model(tokens, state)`` for scoring a split window by window (no gradients).

    On a CUDA device, when there are at least ``MIN_WINDOWS`` full windows to score, the first of
    them captures the forward pass as a graph, and every window of that shape replays it; the
    shorter last window calls the model. Where capture fails, a one-line warning, and the model is
    called for every window. ``graph`` (tests) stands in for the CUDA graph, on any device.
    """

    MIN_WINDOWS = 8  # below this, the warm-up and capture cost more than replaying saves

    def __init__(self, model, device: torch.device, windows: int, graph=None):
        self.model, self.graph = model, graph
        self.wanted = (graph is not None or device.type == "cuda") and windows >= self.MIN_WINDOWS
        self._graphed: GraphedCall | None = None

    def __call__(self, tokens: Tensor, state: list) -> tuple[Tensor, list]:
        if self._graphed is None and self.wanted:
            self.wanted = False
            try:
                self._graphed = GraphedCall(self.model, tokens, state, self.graph)
            except Exception as error:  # a cell that synchronises with the CPU, an old driver
                get_logger().warning(f"warning: scoring without a CUDA graph ({one_line(error)})")
        if self._graphed is not None and tokens.shape == self._graphed.static_tokens.shape:
            return self._graphed(tokens, state)
        return self.model(tokens, state)
