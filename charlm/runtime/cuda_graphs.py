"""CUDA graphs: sampling's step and scoring's windows, captured once and replayed.

**Sampling** runs ``LanguageModel.step`` at batch 1: a few dozen small kernels a symbol, each of
which costs more to launch than to run. The shapes never change, so the step is captured once as
a CUDA graph and replayed: one launch a symbol. The graph reads its inputs from, and writes its
outputs to, fixed ("static") tensors; a call copies the token and the carried state into the
static inputs, replays, and hands back the static outputs, which the next call copies in again.

**Training** (``charlm train --cuda-graph``) replays the forward and backward of a training window:
``charlm.runtime.training_graphs``, which uses this module's buffer handling.

**Scoring** a split runs the forward pass window after window under ``inference_mode``; on a GPU
:class:`ScoringForward` captures it on the first full window and replays it for the others.

**Every graph is checked on first use** (``charlm.runtime.fast_path_check``): its outputs are
poisoned with NaN, it is replayed on the input it was captured with, and what it gives is compared
with the eager code's result on that input; a graph that differs is dropped with a one-line
warning. ``--no-cuda-graph`` (eval, score, sample) and ``CHARLM_NO_CUDA_GRAPHS=1`` (everything)
turn graphs off. Capture happens on a side stream of the model's own device, with that device made
current, so ``cuda:1`` never records onto ``cuda:0``'s stream.

The buffer handling and the check are the same whatever does the capturing, and the test suite
checks them on the CPU with stand-ins (:class:`ReplayByCalling` for the graphs of sampling and
scoring, one that keeps the contract of ``make_graphed_callables`` for training, and ones that
replay nothing or fail halfway); the CUDA side itself is untested on a GPU.
"""

from __future__ import annotations

import contextlib
import time
import warnings
from typing import Callable

import torch
from torch import Tensor

from charlm.logs import get_logger
from charlm.runtime.fast_path_check import (
    FastPathCheck,
    detached_copies,
    graphs_disabled,
    largest_difference,
    poison_,
    tolerance_for,
)
from charlm.runtime.precision import without_autocast_cache


def flatten_state(state: list) -> tuple[list[Tensor], list[int]]:
    """The carried state as one list of tensors, and how many of them each layer has."""
    return [tensor for layer in state for tensor in layer], [len(layer) for layer in state]


def unflatten_state(flat, layout: list[int]) -> list[tuple[Tensor, ...]]:
    """The inverse of :func:`flatten_state`."""
    state, start = [], 0
    for width in layout:
        state.append(tuple(flat[start : start + width]))
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


@contextlib.contextmanager
def synchronisation_errors(device: torch.device):
    """On a CUDA device, an operation that waits for the GPU (``.item()``, a copy to the CPU) raises
    instead of running: such an operation cannot be captured, and is better found before capturing."""
    if device.type != "cuda":
        yield
        return
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(previous)


def on_device(device: torch.device):
    """``device`` made the current CUDA device for the block (captures and their side streams
    belong to the current device; ``cuda:1`` must not capture on ``cuda:0``'s stream)."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


def default_generator(device: torch.device):
    """The default random generator of a CUDA ``device``, or None elsewhere (or on a torch without
    graph-safe generator states, before 2.4)."""
    if device.type != "cuda":
        return None
    generator = torch.cuda.default_generators[device.index if device.index is not None else torch.cuda.current_device()]
    return generator if hasattr(generator, "graphsafe_set_state") else None


@contextlib.contextmanager
def generator_kept_on_failure(device: torch.device):
    """Runs a capture; where it fails, the device's random generator is put back as it was.

    A capture that fails midway leaves the generator marked as capturing, and every later random
    draw on the device fails with "Offset increment outside graph capture encountered unexpectedly"
    (seen on the first GPU run, an H200 under torch 2.11: after one failed training capture the next
    cell's sampling and scoring failed). A copy of the generator's state is taken before and set back
    in its place after a failure, so the eager code that runs next draws as if nothing was tried."""
    generator = default_generator(device)
    saved = None if generator is None else generator.clone_state()
    try:
        yield
    except BaseException:
        if saved is not None:
            generator.graphsafe_set_state(saved)
        raise


class CudaCapture:
    """What :class:`CudaGraph` asks of CUDA, in one place (tests pass a stand-in that records the calls)."""

    def __init__(self, device: torch.device):
        self.device = device

    def side_stream(self):
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        return stream

    def on(self, stream):
        return torch.cuda.stream(stream)

    def join(self, stream) -> None:
        torch.cuda.current_stream(self.device).wait_stream(stream)

    def new_graph(self):
        return torch.cuda.CUDAGraph()

    def synchronize(self) -> None:
        torch.cuda.synchronize(self.device)

    def release(self) -> None:
        torch.cuda.empty_cache()


class CudaGraph:
    """``torch.cuda.CUDAGraph`` behind the same two calls, with the warm-up capture needs.

    The warm-up and the capture run on a side stream of ``device`` with ``device`` current, so
    the kernels are recorded whatever device was current before. The warm-up runs with
    synchronisation errors on (a function that reads a value back fails there, before capturing).
    Where capturing fails all the same, the stream capture is ended, the process is back on its own
    stream, the device is synchronised and the graph and its memory pool are dropped before the
    error goes on: the eager code that runs next runs as if nothing had been tried.
    """

    def __init__(self, device: torch.device, warmup: int = 3, cuda=None):
        self.device, self.warmup = device, warmup
        self.cuda = cuda or CudaCapture(device)
        self.graph = None

    def capture(self, function: Callable[[], list[Tensor]]) -> list[Tensor]:
        cuda = self.cuda
        with on_device(self.device), warnings.catch_warnings():
            # A backward on the side stream meets gradients kept on the main one: autograd warns once a run
            # that this "may incur unnecessary synchronization" (seen on an H200); the joins here are the
            # synchronisation, once, before the graph is replayed on the main stream.
            warnings.filterwarnings("ignore", message="The AccumulateGrad node's stream does not match")
            side = cuda.side_stream()
            with cuda.on(side), synchronisation_errors(self.device):  # kernel choice, workspaces: outside the graph
                for _ in range(self.warmup):
                    function()
            cuda.join(side)
            cuda.synchronize()
            graph = cuda.new_graph()
            try:
                with cuda.on(side), generator_kept_on_failure(self.device):
                    graph.capture_begin()
                    try:
                        outputs = function()
                    except BaseException:
                        with contextlib.suppress(Exception):
                            graph.capture_end()  # ends the stream capture; its own error adds nothing
                        raise
                    graph.capture_end()
            except BaseException:
                del graph
                cuda.synchronize()
                cuda.release()
                raise
            cuda.join(side)
        self.graph = graph
        return outputs

    def replay(self) -> None:
        self.graph.replay()


class GraphedCall:
    """``function(tokens, state)`` at the shapes of the ``tokens`` and ``state`` given, replayed from
    a captured graph, checked against ``function`` itself on those inputs before it is used.

    ``check`` says how the check went; where the replay does not give the eager outputs, building
    raises :class:`FastPathMismatch` (the caller falls back to ``function``).
    """

    def __init__(self, function: Callable, tokens: Tensor, state: list, graph=None, path: str = "graph"):
        self.static_tokens = tokens.clone()
        self.static_state = [tuple(tensor.clone() for tensor in layer) for layer in state]
        self.graph = graph or CudaGraph(tokens.device)
        self.check = FastPathCheck(path)

        def run() -> list[Tensor]:
            logits, new_state = function(self.static_tokens, self.static_state)
            inputs = [self.static_tokens, *flatten_state(self.static_state)[0]]
            return unaliased([logits, *flatten_state(new_state)[0]], inputs)

        with without_autocast_cache(tokens.device):
            outputs = self.graph.capture(run)
        self.static_logits = outputs[0]
        self.static_new_state = unflatten_state(outputs[1:], [len(layer) for layer in state])
        self._compare(function, tokens, state)

    def _compare(self, function: Callable, tokens: Tensor, state: list) -> None:
        started = time.monotonic()
        logits, new_state = function(tokens, state)
        expected = detached_copies([logits, *flatten_state(new_state)[0]])
        poison_([self.static_logits, *flatten_state(self.static_new_state)[0]])
        logits, new_state = self(tokens, state)
        difference = largest_difference([logits, *flatten_state(new_state)[0]], expected)
        passed = self.check.passed(difference, tolerance_for(tokens.device, expected[0].dtype))
        self.check.seconds = time.monotonic() - started
        if not passed:
            raise self.check.mismatch()
        self.check.active = True

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
        super().__init__(model.step, tokens, state, graph, path="sampling graph")


def failed_check(path: str, error: BaseException) -> FastPathCheck:
    """The outcome of a fast path that raised, or failed its check (a :class:`FastPathMismatch`
    carries the comparison)."""
    outcome = getattr(error, "check", None) or FastPathCheck(path)
    outcome.active, outcome.failure = False, one_line(error)
    return outcome


def graphed_step(model, state: list, enabled: bool = True, graph=None):
    """A :class:`GraphedStep` of ``model`` on a CUDA device (``graph``: a stand-in, on any device),
    else (or where capture or its check fails, with a one-line warning) ``model.step`` itself.
    ``enabled=False`` (``--no-cuda-graph``) or ``CHARLM_NO_CUDA_GRAPHS`` turns it off."""
    device = state[0][0].device
    if not enabled or graphs_disabled() or (device.type != "cuda" and graph is None):
        return model.step
    try:
        return GraphedStep(model, state, graph)
    except Exception as error:  # a cell that synchronises with the CPU, an old driver, a replay that differs
        get_logger().warning(f"warning: sampling without a CUDA graph ({one_line(error)})")
        return model.step


class ScoringForward:
    """``model(tokens, state)`` for scoring a split window by window (no gradients).

    On a CUDA device, when there are at least ``MIN_WINDOWS`` full windows to score, the first of
    them captures the forward pass as a graph, checks it against the model on that window
    (:class:`GraphedCall`), and every window of that shape replays it; the shorter last window calls
    the model. Where capture or the check fails, a one-line warning, and the model is called for
    every window. ``check`` says what happened (None: no graph was tried). ``enabled=False``
    (``--no-cuda-graph``) or ``CHARLM_NO_CUDA_GRAPHS`` turns the graph off. ``graph`` (tests) stands
    in for the CUDA graph, on any device.
    """

    MIN_WINDOWS = 8  # below this, the warm-up and capture cost more than replaying saves

    def __init__(self, model, device: torch.device, windows: int, graph=None, enabled: bool = True):
        self.model, self.graph = model, graph
        self.wanted = (
            enabled
            and not graphs_disabled()
            and (graph is not None or device.type == "cuda")
            and windows >= self.MIN_WINDOWS
        )
        self.check: FastPathCheck | None = None
        self._graphed: GraphedCall | None = None

    def __call__(self, tokens: Tensor, state: list) -> tuple[Tensor, list]:
        if self._graphed is None and self.wanted:
            self.wanted = False
            try:
                self._graphed = GraphedCall(self.model, tokens, state, self.graph, path="scoring graph")
                self.check = self._graphed.check
            except Exception as error:  # a cell that synchronises with the CPU, an old driver, a replay that differs
                self.check = failed_check("scoring graph", error)
                get_logger().warning(f"warning: scoring without a CUDA graph ({self.check.failure})")
        if self._graphed is not None and tokens.shape == self._graphed.static_tokens.shape:
            return self._graphed(tokens, state)
        return self.model(tokens, state)
