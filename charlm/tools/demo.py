"""The main job on the embedded default: prepare `pydoc`, size a small LRU to this machine, train
it for the time budget, evaluate, sample.

Sizing happens inside the budget: the demo times a few training steps, largest hidden size first,
and keeps the largest size of ``DemoConfig.sizes`` that can train, in the time left, the
characters its sample needs to read as words. When none can, it trains the size that gets there
soonest and says how many minutes would do. On a CPU it also times one thread against torch's
default: on a busy machine the threads of a small model wait on each other and one runs faster.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import time

import torch

from charlm.api import load, train
from charlm.corpora.streams import TokenStreams
from charlm.cells import CELLS
from charlm.config import TrainConfig
from charlm.config_tools import DemoConfig
from charlm.corpora import prepare_corpus
from charlm.runtime.devices import resolve_device
from charlm.logs import info
from charlm.model import LanguageModel, detach_state
from charlm.runs.directory import default_run_dir
from charlm.training.setup import check_model_fits, model_config_for


@dataclasses.dataclass(frozen=True)
class Sizing:
    """The demo's choice of hidden size, and what the measurement says it can train in the budget."""

    hidden_size: int
    threads: int
    chars_per_second: float
    seconds_left: float  # of the budget, after the measurement
    seconds_spent: float  # on the measurement
    chars_needed: int  # for readable text at this size
    measured: dict = dataclasses.field(default_factory=dict)  # hidden size → characters per second

    @property
    def chars_in_budget(self) -> int:
        return int(self.chars_per_second * max(self.seconds_left, 0.0))

    @property
    def enough(self) -> bool:
        return self.chars_in_budget >= self.chars_needed

    @property
    def minutes_needed(self) -> int:
        """Whole minutes of budget, the measurement included, that would reach readable text."""
        return max(1, math.ceil((self.seconds_spent + self.chars_needed / self.chars_per_second) / 60))


def choose_size(
    throughput: dict[int, float],
    sizes: dict[int, int],
    *,
    seconds_left: float,
    seconds_spent: float = 0.0,
    threads: int = 1,
) -> Sizing:
    """The largest measured size whose characters per second train its ``sizes`` need within
    ``seconds_left``; when none does, the measured size that would get there soonest."""
    fitting = [size for size, rate in throughput.items() if rate * seconds_left >= sizes[size]]
    if fitting:
        hidden_size = max(fitting)
    else:
        hidden_size = min(throughput, key=lambda size: (sizes[size] / throughput[size], -size))
    return Sizing(
        hidden_size=hidden_size,
        threads=threads,
        chars_per_second=throughput[hidden_size],
        seconds_left=seconds_left,
        seconds_spent=seconds_spent,
        chars_needed=sizes[hidden_size],
        measured=dict(throughput),
    )


def faster_threads(throughput: dict[int, float]) -> int:
    """The thread count with the highest measured throughput (the larger one on a tie)."""
    return max(throughput, key=lambda threads: (throughput[threads], threads))


def about(number: float) -> str:
    """``number`` to two significant figures, with thousands separators: 17,477 → ``17,000``."""
    if number < 1:
        return f"{number:.2g}"
    return f"{round(number, 1 - int(math.floor(math.log10(number)))):,.0f}"


def describe(sizing: Sizing) -> list[str]:
    """The lines the demo prints about its choice before training."""
    threads = f"{sizing.threads} thread{'s' if sizing.threads != 1 else ''}"
    if sizing.seconds_left > 0:
        budget = f"~{about(sizing.chars_in_budget)} characters in the {sizing.seconds_left / 60:.3g} min left"
    else:
        budget = "the measurement took the whole budget"
    lines = [
        f"sizing: hidden {sizing.hidden_size} on {threads}, ~{about(sizing.chars_per_second)} chars/s measured: "
        f"{budget} (readable text needs ~{about(sizing.chars_needed)})"
    ]
    if not sizing.enough:
        lines.append(
            f"this machine trains about {about(sizing.chars_per_second)} chars/s now; readable text needs "
            f"about {about(sizing.chars_needed)} characters: try --minutes {sizing.minutes_needed}"
        )
    return lines


def demo_config(config: DemoConfig, hidden_size: int, minutes: float, data_dir=None, run_dir=None) -> TrainConfig:
    """The training run of the demo at one hidden size."""
    return TrainConfig(
        corpus="pydoc",
        cell=config.cell,
        hidden_size=hidden_size,
        layers=config.layers,
        batch_size=config.batch_size,
        bptt=config.bptt,
        lr=config.lr,
        epochs=100,
        patience=2,  # the budget often outlasts what the corpus teaches this size: stop when validation stops improving
        max_minutes=minutes,
        seed=config.seed,
        data_dir=None if data_dir is None else str(data_dir),
        run_dir=None if run_dir is None else str(run_dir),
    )


def measure_throughput(config: TrainConfig, corpus, device, steps: int, give_up_after: float = math.inf) -> float:
    """Training characters per second of ``config``'s model over ``steps`` steps like the trainer's,
    after one warm-up step; it stops early once the timed steps have taken ``give_up_after`` seconds."""
    cell_class = CELLS.get(config.cell)
    model_config = model_config_for(config, corpus.vocab_size, cell_class)
    check_model_fits(model_config, config, device, cell_class)  # as every training model is, before it is built
    model = LanguageModel(model_config, cell_class).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=config.lr)
    streams = TokenStreams(corpus.split("train"), config.batch_size, config.bptt)
    state = model.initial_state(config.batch_size, device=device)
    windows = streams.windows(device=device)
    started, characters = None, 0
    for window in itertools.islice(windows, steps + 1):
        logits, state = model(window.inputs, state)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), window.targets.reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.clip)
        optimizer.step()
        state = detach_state(state)
        loss.item()
        if started is None:
            started = time.monotonic()
            continue
        characters += window.targets.numel()
        if time.monotonic() - started >= give_up_after:
            break
    return characters / max(time.monotonic() - started, 1e-9)


def measure_threads(config: TrainConfig, corpus, device, steps: int) -> tuple[int, float]:
    """The faster of one thread and torch's default on a CPU, and its throughput; the default
    is given up on as soon as it is slower than one thread."""
    default = torch.get_num_threads()
    if device.type != "cpu" or default == 1:
        return default, measure_throughput(config, corpus, device, steps)
    throughput = {}
    try:
        torch.set_num_threads(1)
        started = time.monotonic()
        throughput[1] = measure_throughput(config, corpus, device, steps)
        one_thread_seconds = time.monotonic() - started
        torch.set_num_threads(default)
        throughput[default] = measure_throughput(config, corpus, device, steps, give_up_after=one_thread_seconds)
    finally:
        torch.set_num_threads(default)
    threads = faster_threads(throughput)
    return threads, throughput[threads]


def size_for_machine(config: DemoConfig, corpus) -> Sizing:
    """Measure the sizes of ``config.sizes`` from the largest down until one can reach readable
    text in what is left of the budget (see ``choose_size``). Sets torch's thread count to the
    faster one; the caller restores it."""
    started = time.monotonic()
    budget = config.minutes * 60
    ladder = sorted(config.sizes, reverse=True)
    throughput = {}
    threads = torch.get_num_threads()
    for hidden_size in ladder:
        train_config = demo_config(config, hidden_size, config.minutes)
        device = resolve_device(train_config.device)
        if not throughput:
            threads, throughput[hidden_size] = measure_threads(train_config, corpus, device, config.calibration_steps)
            torch.set_num_threads(threads)
        else:
            throughput[hidden_size] = measure_throughput(train_config, corpus, device, config.calibration_steps)
        spent = time.monotonic() - started
        sizing = choose_size(
            throughput, config.sizes, seconds_left=budget - spent, seconds_spent=spent, threads=threads
        )
        if sizing.enough:
            break
    return sizing


def run_demo(config: DemoConfig, data_dir=None, run_dir=None, write=print, log=info) -> dict:
    """Returns the training summary (with the ``sizing``); writes the sample through ``write`` as
    it is drawn and the sizing lines through ``log``."""
    corpus = prepare_corpus("pydoc", data_dir=data_dir)
    threads = torch.get_num_threads()
    try:
        sizing = size_for_machine(config, corpus)
        for line in describe(sizing):
            log(line)
        minutes_left = float(f"{max(sizing.seconds_left, 0.06) / 60:.3g}")  # a used-up budget still trains a window
        run_dir = run_dir or default_run_dir("pydoc", f"{config.cell}-demo")
        summary = train(demo_config(config, sizing.hidden_size, minutes_left, data_dir, run_dir))
        summary["sizing"] = {**dataclasses.asdict(sizing), "enough": sizing.enough}
        summary["sample"] = _write_sample(config, summary["run_dir"], write)
    finally:
        torch.set_num_threads(threads)
    return summary


def _write_sample(config: DemoConfig, run_dir: str, write) -> str:
    model = load(run_dir)
    write(
        f"sample ({config.sample_length} characters after the prime, temperature "
        f"{config.temperature:g}):\n{config.prime}"
    )
    pieces = []
    for piece in model.stream(config.prime, config.sample_length, config.temperature, seed=config.seed):
        write(piece)
        pieces.append(piece)
    return config.prime + "".join(pieces)
