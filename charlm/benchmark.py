"""Throughput of every cell relative to PyTorch's fused LSTM, measured in the same run.

Training throughput is characters per second through forward, backward and an Adam step at the
given batch and BPTT length; evaluation throughput is the forward pass alone; sampling is one
symbol at a time at batch 1. The baseline is ``torch.nn.LSTM`` (the fused library kernel) sized
to the same parameter budget, so the ratio says how a cell's implementation compares with the
fastest recurrent layer PyTorch has on this machine.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

import torch
from torch import nn

from charlm.config import BenchmarkSettings
from charlm.model import LanguageModel, ModelConfig, count_parameters, detach_state, parse_budget, size_for_budget
from charlm.config import SampleConfig
from charlm.sampling import generate


@dataclass
class Throughput:
    name: str
    hidden_size: int
    parameters: int
    train_chars_per_second: float
    eval_chars_per_second: float
    sample_chars_per_second: float | None = None


class FusedLSTMBaseline(nn.Module):
    """Embedding → torch.nn.LSTM → linear: PyTorch's own fused recurrent layer."""

    def __init__(self, vocab_size: int, hidden_size: int, layers: int):
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, hidden_size)
        self.lstm = nn.LSTM(hidden_size, hidden_size, layers)
        self.head = nn.Linear(hidden_size, vocab_size)
        self.layers, self.hidden_size = layers, hidden_size

    def initial_state(self, batch_size, device=None):
        zeros = torch.zeros(self.layers, batch_size, self.hidden_size, device=device)
        return [(zeros, zeros.clone())]

    def forward(self, tokens, state):
        outputs, (h, c) = self.lstm(self.embedding(tokens.t()), state[0])
        return self.head(outputs).transpose(0, 1), [(h, c)]


def _baseline_size(settings: BenchmarkSettings) -> int:
    def total(hidden):
        with torch.device("meta"):
            return count_parameters(FusedLSTMBaseline(settings.vocab_size, hidden, settings.layers))

    return min(range(8, 4096), key=lambda hidden: abs(total(hidden) - parse_budget(settings.params)))


def _synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _measure(model: nn.Module, settings: BenchmarkSettings, device) -> tuple[float, float]:
    generator = torch.Generator().manual_seed(settings.seed)
    shape = (settings.batch_size, settings.bptt)
    inputs = torch.randint(settings.vocab_size, shape, generator=generator).to(device)
    targets = torch.randint(settings.vocab_size, shape, generator=generator).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    state = model.initial_state(settings.batch_size, device=device)

    def train_step(state):
        logits, state = model(inputs, state)
        loss = nn.functional.cross_entropy(logits.reshape(-1, settings.vocab_size), targets.reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        return detach_state(state)

    model.train()
    state = train_step(state)
    _synchronize(device)
    start = time.perf_counter()
    for _ in range(settings.steps):
        state = train_step(state)
    _synchronize(device)
    train_rate = settings.steps * inputs.numel() / (time.perf_counter() - start)

    model.eval()
    with torch.no_grad():
        model(inputs, state)
        _synchronize(device)
        start = time.perf_counter()
        for _ in range(settings.steps):
            _, state = model(inputs, state)
        _synchronize(device)
    eval_rate = settings.steps * inputs.numel() / (time.perf_counter() - start)
    return train_rate, eval_rate


def benchmark_cells(cells: list[str], settings: BenchmarkSettings) -> list[Throughput]:
    """The fused-LSTM baseline first, then every cell, each sized to the same parameter budget."""
    device = torch.device(settings.device)
    torch.manual_seed(settings.seed)
    hidden = _baseline_size(settings)
    baseline = FusedLSTMBaseline(settings.vocab_size, hidden, settings.layers).to(device)
    results = [Throughput("torch.nn.LSTM (fused)", hidden, count_parameters(baseline), *_measure(baseline, settings, device))]
    for cell in cells:
        config = ModelConfig(cell, vocab_size=settings.vocab_size, hidden_size=1, layers=settings.layers)
        hidden, _ = size_for_budget(config, parse_budget(settings.params))
        model = LanguageModel(dataclasses.replace(config, hidden_size=hidden)).to(device)
        train_rate, eval_rate = _measure(model, settings, device)
        sample_rate = _sampling_rate(model, settings)
        results.append(Throughput(cell, hidden, count_parameters(model), train_rate, eval_rate, sample_rate))
    return results


def _sampling_rate(model: LanguageModel, settings: BenchmarkSettings) -> float:
    options = SampleConfig(length=settings.sample_length, seed=settings.seed)
    start = time.perf_counter()
    drawn = sum(1 for _ in generate(model, [0], options))
    return drawn / (time.perf_counter() - start)
