"""One symbol at a time on a GPU, replayed from a CUDA graph.

Sampling runs ``LanguageModel.step`` at batch 1: a few dozen small kernels a symbol, each of
which costs more to launch than to run. The shapes never change, so the step is captured once as
a CUDA graph and replayed: one launch a symbol. The graph reads its inputs from, and writes its
outputs to, fixed ("static") tensors; a call copies the token and the carried state into the
static inputs, replays, and hands back the static outputs, which the next call copies in again.

The buffer handling is the same whatever does the capturing, and the test suite checks it on the
CPU with :class:`ReplayByCalling` standing in for the CUDA graph (no GPU was available to measure
the real one).
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from charlm.logs import get_logger


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


class GraphedStep:
    """``model.step(tokens, state)`` at a fixed batch size, replayed from a captured graph."""

    def __init__(self, model, state: list, graph=None):
        first = state[0][0]
        self.static_tokens = torch.zeros(first.shape[0], dtype=torch.long, device=first.device)
        self.static_state = [tuple(tensor.clone() for tensor in layer) for layer in state]
        self._layout = [len(layer) for layer in state]
        self.graph = graph or CudaGraph(first.device)

        def run() -> list[Tensor]:
            logits, new_state = model.step(self.static_tokens, self.static_state)
            return [logits, *(tensor for layer in new_state for tensor in layer)]

        outputs = self.graph.capture(run)
        self.static_logits, flat = outputs[0], outputs[1:]
        self.static_new_state, start = [], 0
        for width in self._layout:
            self.static_new_state.append(tuple(flat[start:start + width]))
            start += width

    def __call__(self, tokens: Tensor, state: list) -> tuple[Tensor, list]:
        """The logits and the new state; both are the graph's own tensors, valid until the next call."""
        self.static_tokens.copy_(tokens.reshape(-1))
        for static_layer, layer in zip(self.static_state, state):
            for static, given in zip(static_layer, layer):
                if static is not given:
                    static.copy_(given)
        self.graph.replay()
        return self.static_logits, self.static_new_state


def graphed_step(model, state: list):
    """A :class:`GraphedStep` of ``model`` on a CUDA device, else (or where capture fails, with a
    one-line warning) ``model.step`` itself."""
    device = state[0][0].device
    if device.type != "cuda":
        return model.step
    try:
        return GraphedStep(model, state)
    except Exception as error:  # a cell that synchronises with the CPU, an old driver
        message = " ".join(str(error).split())[:160]
        get_logger().warning(f"warning: sampling without a CUDA graph ({type(error).__name__}: {message})")
        return model.step
