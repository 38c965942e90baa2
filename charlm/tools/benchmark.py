"""Throughput of every cell relative to PyTorch's fused LSTM, measured in the same run.

Training throughput is characters per second through forward, backward and an Adam step at the
given batch and BPTT length; evaluation throughput is the forward pass alone (inference mode);
sampling is one symbol at a time at batch 1. The baseline is ``torch.nn.LSTM`` (the fused library
kernel) sized to the same parameter budget, so the ratio says how a cell's implementation compares
with the fastest recurrent layer PyTorch has on this machine.

A shared machine makes single timings worthless, so the contenders are interleaved: each round
times the baseline and then every cell, and a cell's ratio is the median over rounds of its rate
divided by the baseline's rate *in the same round*. Every figure comes with its spread over rounds.
Cells with many small kernels a step suffer most from other work on the machine (an rhn fell from
0.9× to 0.44× beside one small training, while the fused LSTM held), so :func:`disturbances` says
when the figures cannot be trusted: the machine was busy before the run, or a ratio varied across
rounds by more than ``SPREAD_LIMIT``.

Evaluation is timed the way ``charlm eval`` runs: on a GPU through a CUDA graph of the window,
checked against the eager forward first (``--no-cuda-graph``'s eager figure with
``CHARLM_NO_CUDA_GRAPHS=1``). Sampling is timed from its second symbol on, after the step's graph
is captured.

Cells do different amounts of arithmetic per character at the same parameter count (a tied or
high-order cell reuses weights), so a second ratio divides by the matrix-product FLOPs of the
cell's own equations: the multiply-adds of one ``step`` at batch 1, counted by PyTorch's
``FlopCounterMode``, times three for forward and backward, plus the softmax layer.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import time
import types
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from charlm.cells.base import RecurrentCell
from charlm.runtime.seeds import torch_seed
from charlm.runtime.compiling import CompiledForward
from charlm.config_inference import SampleConfig
from charlm.config_tools import BenchmarkConfig
from charlm.runtime.cuda_graphs import GraphedCall, failed_check
from charlm.runtime.training_graphs import GraphedWindow
from charlm.runtime.fast_path_check import graphs_disabled
from charlm.model import LanguageModel, ModelConfig, count_parameters, detach_state
from charlm.sizing import parse_budget, size_for_budget
from charlm.runtime.precision import autocast, float32_state, grad_scaler, layer_output_dtypes, wrong_layer_dtypes
from charlm.inference.sampling import generate

BASELINE_NAME = "torch.nn.LSTM (fused)"
SPREAD_LIMIT = 0.2  # a ratio whose half-range over rounds exceeds this fraction of its median is disturbed


@dataclass
class Spread:
    """One quantity measured once per round."""

    runs: list[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.runs)

    @property
    def relative_spread(self) -> float:
        """Half the range over rounds, as a fraction of the median."""
        return (max(self.runs) - min(self.runs)) / 2 / self.median if self.median else 0.0

    def to_dict(self) -> dict:
        return {"median": self.median, "min": min(self.runs), "max": max(self.runs), "runs": self.runs}


@dataclass
class Throughput:
    name: str
    hidden_size: int
    parameters: int
    flops_per_char: float  # forward + backward matrix-product FLOPs per character of training
    precision: str = "fp32"  # of the forward pass, as --precision
    train: Spread = field(default_factory=Spread)  # chars/s
    eval: Spread = field(default_factory=Spread)
    sample: Spread = field(default_factory=Spread)
    train_ratio: Spread = field(default_factory=Spread)  # against the baseline in the same round
    eval_ratio: Spread = field(default_factory=Spread)
    loop_train_ratio: Spread = field(default_factory=Spread)  # a parallel_form cell against its own step loop
    loop_eval_ratio: Spread = field(default_factory=Spread)
    compile_seconds: float | None = None  # with --compile: the warm-up step, compilation included
    capture_seconds: float | None = None  # with --cuda-graph: the warm-up step, graph capture included
    eval_path: str = "eager"  # "cuda graph" where evaluation replays a checked graph, as `charlm eval` does
    train_path: str = "eager"  # "cuda graph" or "compiled" where training ran through them, else why not
    layer_dtypes: list[str] = field(default_factory=list)  # each layer's output type in a training forward

    def to_dict(self, baseline: "Throughput") -> dict:
        flop_scale = self.flops_per_char / baseline.flops_per_char
        values = {
            "name": self.name,
            "hidden_size": self.hidden_size,
            "parameters": self.parameters,
            "precision": self.precision,
            "flops_per_char": self.flops_per_char,
            "train_chars_per_second": self.train.to_dict(),
            "eval_chars_per_second": self.eval.to_dict(),
            "train_ratio": self.train_ratio.median,
            "eval_ratio": self.eval_ratio.median,
            "train_ratio_flop_normalised": self.train_ratio.median * flop_scale,
            "eval_ratio_flop_normalised": self.eval_ratio.median * flop_scale,
            "eval_over_train": self.eval.median / self.train.median,
            "eval_path": self.eval_path,
            "train_path": self.train_path,
        }
        if self.loop_train_ratio.runs:
            values["train_over_own_loop"] = self.loop_train_ratio.median
            values["eval_over_own_loop"] = self.loop_eval_ratio.median
        if self.layer_dtypes:
            values["layer_dtypes"] = self.layer_dtypes
        if self.sample.runs:
            values["sample_chars_per_second"] = self.sample.to_dict()
        if self.compile_seconds is not None:
            values["compile_seconds"] = self.compile_seconds
        if self.capture_seconds is not None:
            values["capture_seconds"] = self.capture_seconds
        return values


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


def fused_lstm_runs_in(precision: str, device: torch.device) -> bool:
    """Whether ``torch.nn.LSTM`` has a kernel for ``precision`` on ``device`` (oneDNN's bfloat16 LSTM
    needs bf16 instructions that many CPUs lack)."""
    lstm = nn.LSTM(2, 2).to(device)
    try:
        with autocast(precision, device):
            lstm(torch.zeros(1, 1, 2, device=device))
    except RuntimeError:
        return False
    return True


def baseline_size(config: BenchmarkConfig) -> int:
    def total(hidden_size):
        with torch.device("meta"):
            return count_parameters(FusedLSTMBaseline(config.vocab_size, hidden_size, config.layers))

    budget = parse_budget(config.params)
    low, high = 1, 16384
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if total(middle) < budget else (low, middle)
    return min((low, high), key=lambda hidden_size: abs(total(hidden_size) - budget))


def training_flops_per_char(model: LanguageModel) -> float:
    """Matrix-product FLOPs of one character of training: 3 × those of one forward ``step``."""
    counter = FlopCounterMode(display=False)
    with torch.no_grad(), counter:
        model.step(torch.zeros(1, dtype=torch.long), model.initial_state(1))
    return 3.0 * counter.get_total_flops()


def _synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Contender:
    """A model with its synthetic data, optimiser and carried state, timed a round at a time."""

    def __init__(
        self,
        name: str,
        model: nn.Module,
        config: BenchmarkConfig,
        device,
        flops_per_char: float,
        initial_state=None,
        compiled: bool = False,
        graphed: bool = False,
    ):
        """``initial_state``: where the carried state comes from when ``model`` is a wrapper (DDP);
        ``compiled``: train through ``torch.compile`` (the warm-up step compiles); ``graphed``: through
        captured CUDA graphs (the warm-up step captures)."""
        self.model, self.config, self.device = model, config, device
        self.train_forward = model
        if compiled:
            self.train_forward = CompiledForward(model, device)
        elif graphed:
            self.train_forward = GraphedWindow(model, device)
        self.scaler = grad_scaler(config.precision, device)
        generator = torch.Generator().manual_seed(torch_seed(config.seed))
        shape = (config.batch_size, config.bptt)
        self.inputs = torch.randint(config.vocab_size, shape, generator=generator).to(device)
        self.targets = torch.randint(config.vocab_size, shape, generator=generator).to(device)
        self.optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        self.state = (initial_state or model.initial_state)(config.batch_size, device=device)
        inner = getattr(model, "module", model)
        self.result = Throughput(
            name,
            getattr(inner, "hidden_size", 0) or inner.config.hidden_size,
            count_parameters(inner),
            flops_per_char,
            config.precision,
        )
        started = time.perf_counter()
        self._train_step()  # warm-up: allocations, kernel selection, compilation
        _synchronize(device)
        if compiled:
            self.result.compile_seconds = time.perf_counter() - started
        if graphed:
            self.result.capture_seconds = time.perf_counter() - started
        if compiled or graphed:
            fast = self.train_forward
            self.result.train_path = (
                ("compiled" if compiled else "cuda graph") if fast.active else f"eager ({fast.failure})"
            )
        self.eval_forward = self.model
        with torch.inference_mode(), autocast(config.precision, device):
            self.model.eval()
            self.model(self.inputs, self.state)
            if device.type == "cuda" and not graphs_disabled() and isinstance(model, LanguageModel):
                self._graph_evaluation()
        _synchronize(device)

    def _graph_evaluation(self) -> None:
        """Evaluate through a CUDA graph of the window, checked against eager, as ``charlm eval`` does."""
        try:
            self.eval_forward = GraphedCall(self.model, self.inputs, self.state, path="scoring graph")
            self.result.eval_path = "cuda graph"
        except Exception as error:  # the same fallback as scoring's
            self.result.eval_path = f"eager ({failed_check('scoring graph', error).failure})"

    def _train_step(self):
        self.model.train()
        with autocast(self.config.precision, self.device):
            logits, state = self.train_forward(self.inputs, self.state)
        logits = logits.float()  # the loss in float32, as in training
        loss = nn.functional.cross_entropy(logits.reshape(-1, self.config.vocab_size), self.targets.reshape(-1))
        self.optimizer.zero_grad(set_to_none=True)
        if self.scaler is None:
            loss.backward()
            self.optimizer.step()
        else:
            self.scaler.scale(loss).backward()
            self.scaler.step(self.optimizer)
            self.scaler.update()
        self.state = float32_state(detach_state(state))

    def time_training(self) -> float:
        _synchronize(self.device)
        start = time.perf_counter()
        for _ in range(self.config.steps):
            self._train_step()
        _synchronize(self.device)
        return self.config.steps * self.inputs.numel() / (time.perf_counter() - start)

    def time_evaluation(self) -> float:
        self.model.eval()
        state = self.state
        with torch.inference_mode(), autocast(self.config.precision, self.device):
            _synchronize(self.device)
            start = time.perf_counter()
            for _ in range(self.config.steps):
                _, state = self.eval_forward(self.inputs, state)
            _synchronize(self.device)
        return self.config.steps * self.inputs.numel() / (time.perf_counter() - start)

    def time_sampling(self) -> float:
        """Symbols a second, from the second symbol on: the first is drawn from the prime's forward
        pass, and the step (on a GPU, its graph) is made before the second; neither is sampling speed."""
        self.model.eval()
        sample_config = SampleConfig(length=self.config.sample_length, seed=self.config.seed)
        symbols = generate(self.model, [0], sample_config)
        for _ in zip(range(2), symbols):
            pass
        _synchronize(self.device)
        start = time.perf_counter()
        drawn = sum(1 for _ in symbols)
        _synchronize(self.device)
        return drawn / (time.perf_counter() - start)


def cell_model(cell: str, config: BenchmarkConfig) -> LanguageModel:
    model_config = ModelConfig(cell, vocab_size=config.vocab_size, hidden_size=1, layers=config.layers)
    hidden_size, _ = size_for_budget(model_config, parse_budget(config.params))
    return LanguageModel(dataclasses.replace(model_config, hidden_size=hidden_size))


def own_loop(model: LanguageModel) -> LanguageModel:
    """A copy of ``model`` whose layers run one time step at a time: in training their ``step`` (the
    base class's ``forward``), in evaluation their sampling step (``inference_forward``: the input's
    share for the whole window, then ``advance`` step by step). The reference a cell's parallel form
    (``RecurrentCell.parallel_form``) is timed against."""
    loop = LanguageModel(model.config)
    loop.load_state_dict(model.state_dict())
    for layer in loop.layers:
        layer.forward = types.MethodType(RecurrentCell.forward, layer)  # the base class's: step after step
        layer.folds_embedding, layer.evaluates_through_step = False, True
    return loop


LOOP_SUFFIX = " (own step loop)"


def benchmark_cells(cells: list[str], config: BenchmarkConfig, progress=None) -> list[Throughput]:
    """The fused-LSTM baseline first, then every cell, each sized to the same parameter budget,
    timed in ``config.repeat`` interleaved rounds; after a cell with a ``parallel_form``, the same
    model through its own step loop. ``progress(text)`` is told each round."""
    device = torch.device(config.device)
    torch.manual_seed(torch_seed(config.seed))
    baseline_model = FusedLSTMBaseline(config.vocab_size, baseline_size(config), config.layers).to(device)
    # The fused baseline computes exactly the equations of charlm's `lstm` cell at the same size.
    reference = LanguageModel(ModelConfig("lstm", config.vocab_size, baseline_model.hidden_size, config.layers))
    # Where the fused kernel has no form in the asked precision, the baseline is its float32 form.
    baseline_config = (
        config if fused_lstm_runs_in(config.precision, device) else dataclasses.replace(config, precision="fp32")
    )
    contenders = [Contender(BASELINE_NAME, baseline_model, baseline_config, device, training_flops_per_char(reference))]
    for cell in cells:
        model = cell_model(cell, config)
        flops = training_flops_per_char(model)
        contenders.append(
            Contender(cell, model.to(device), config, device, flops, compiled=config.compile, graphed=config.cuda_graph)
        )
        dtypes = layer_output_dtypes(model, config.precision, device)
        contenders[-1].result.layer_dtypes = [str(dtype).removeprefix("torch.") for dtype in dtypes]
        if type(model.layers[0]).parallel_form:
            contenders.append(Contender(cell + LOOP_SUFFIX, own_loop(model).to(device), config, device, flops))
    baseline = contenders[0].result
    for round_index in range(config.repeat):
        if progress:
            progress(f"round {round_index + 1}/{config.repeat}")
        for contender in contenders:
            result = contender.result
            result.train.runs.append(contender.time_training())
            result.eval.runs.append(contender.time_evaluation())
            if contender is not contenders[0]:
                result.sample.runs.append(contender.time_sampling())
            result.train_ratio.runs.append(result.train.runs[-1] / baseline.train.runs[-1])
            result.eval_ratio.runs.append(result.eval.runs[-1] / baseline.eval.runs[-1])
        for parallel, loop in zip(contenders, contenders[1:]):
            if loop.result.name == parallel.result.name + LOOP_SUFFIX:
                parallel.result.loop_train_ratio.runs.append(
                    parallel.result.train.runs[-1] / loop.result.train.runs[-1]
                )
                parallel.result.loop_eval_ratio.runs.append(parallel.result.eval.runs[-1] / loop.result.eval.runs[-1])
    return [contender.result for contender in contenders]


def disturbances(results: list[Throughput], load_before: float | None, cores: int | None = None) -> list[str]:
    """Why the figures of a benchmark cannot be trusted, one phrase a reason (none: they can): the
    machine busy before the run, a ratio that varied across rounds, a layer in the wrong precision."""
    reasons = []
    cores = cores or os.cpu_count() or 1
    if load_before is not None and load_before > max(0.5, 0.25 * cores):
        reasons.append(f"the machine was busy before the run (load {load_before:.2f} on {cores} cores)")
    for result in results:
        for what, ratio in (("training", result.train_ratio), ("evaluation", result.eval_ratio)):
            if len(ratio.runs) > 1 and ratio.relative_spread > SPREAD_LIMIT:
                reasons.append(f"{result.name}'s {what} ratio varied ±{ratio.relative_spread:.0%} across rounds")
        wrong = wrong_layer_dtypes(result.layer_dtypes, result.precision)
        if wrong:
            reasons.append(f"{result.name} ran layers in {', '.join(wrong)} under {result.precision}")
    return reasons


def machine_load() -> float | None:
    """The one-minute load average, where the system reports one."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None
