"""How long each run of a sweep will take on this machine: what `charlm sweep --dry-run` shows.

Each distinct model (the settings that change a step's speed: corpus, cell, size, batch, window,
precision, fast paths, device; not the seed, the data fraction, the epochs or the schedule) is
measured once, now (``charlm.experiments.speed``), and its speeds serve every run that shares it.
A run's time is the tokens it has left to train over the training speed, plus the tokens it
scores (validation every epoch and every ``eval_every`` steps, the test split, the plan's static
evaluations) over the scoring speed, and a dynamic evaluation's over the speed of its segments;
its training and validation cut at ``max_minutes``. A task run's is its samples left over the
samples a second. Every epoch or sample the plan allows is counted: early stopping, or a task
solved, ends a run sooner.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import tempfile
from typing import Callable

from charlm.config import TrainConfig
from charlm.config_inference import DynamicOptions
from charlm.corpora import load_corpus, prepare_corpus
from charlm.errors import CharlmError
from charlm.experiments.plan import task_config
from charlm.experiments.speed import Speed, device_label, measure_speed, measure_task_speed
from charlm.runs.directory import Run
from charlm.training.reporting import duration, tokens_to_train
from charlm.training.setup import training_tokens
from charlm.training.windows import WindowLayout

EMBEDDED = "pydoc"  # the corpus the sweep prepares itself: prepared for a measurement in a temporary directory
SETTINGS_WITHOUT_SPEED = {  # a step takes as long whatever these are
    "seed",
    "train_fraction",
    "epochs",
    "patience",
    "max_tokens",
    "max_minutes",
    "lr",
    "lr_decay",
    "min_lr",
    "plateau_factor",
    "warmup_steps",
    "schedule",
    "eval_fraction",
    "eval_every",
    "log_every",
    "print_every",
    "save_every",
    "keep_checkpoints",
    "test_every_epoch",
    "init_from",
    "run_dir",
    "data_dir",
    "tensorboard",
    "wandb",
    "wandb_project",
    "dist_timeout",
}
TASK_SETTINGS_WITHOUT_SPEED = {"seed", "max_samples", "eval_every", "eval_samples"}
TO_TRAIN = ("new", "interrupted")  # the states of runs a sweep trains (the others it skips)


@dataclasses.dataclass(frozen=True)
class Work:
    """What a run has left to do, in tokens."""

    train: int  # to train
    validation: int  # scored during training (validation, and the test split where scored every epoch)
    scored: int  # scored after it: the test split with the best weights, the plan's static evaluations
    adapted: int = 0  # evaluated dynamically: a gradient step a segment
    statistics: int = 0  # rms dynamic evaluation: the training split's gradient statistics, a training pass


def run_work(config: TrainConfig, tokens_per_epoch: int, splits: dict, evals=(), done: int = 0) -> Work:
    """The work of a run of ``config`` that has trained ``done`` tokens: ``splits`` holds the
    splits' lengths in tokens, ``evals`` the plan's evaluation steps."""
    total = tokens_to_train(config.epochs, tokens_per_epoch, config.max_tokens)
    left = max(total - done, 0)
    epochs = max(math.ceil(total / tokens_per_epoch) - done // tokens_per_epoch, 0)  # a cut epoch is scored too
    valid = max(config.eval_batch_size + 1, int(splits["valid"] * config.eval_fraction))
    if config.eval_fraction >= 1.0:
        valid = splits["valid"]
    steps = left // (config.batch_size * config.bptt * config.accumulate)
    validations = epochs + (steps // config.eval_every if config.eval_every else 0)
    tested = epochs if config.test_every_epoch else 0
    scored = 0 if config.test_every_epoch else splits["test"]
    adapted = statistics = 0
    for step in evals:
        if step.dynamic is None:
            scored += splits[step.split]
            continue
        adapted += splits[step.split] + (splits[step.adapt_on] if step.adapt_on else 0)
        statistics += splits["train"] if step.dynamic == "rms" else 0
    return Work(left, validations * valid + tested * splits["test"], scored, adapted, statistics)


def run_seconds(work: Work, speed: Speed, max_minutes: float | None = None) -> float:
    """The seconds ``work`` takes at ``speed``: training and validation (cut at ``max_minutes``),
    then the test split and the evaluations (a dynamic one at the speed of its segments where measured)."""
    during = work.train / speed.train + work.validation / speed.score
    if max_minutes is not None:
        during = min(during, max_minutes * 60)
    after = work.scored / speed.score + work.statistics / speed.train
    return during + after + work.adapted / (speed.adapt or speed.train)


@dataclasses.dataclass(frozen=True)
class Job:
    """A run to estimate: what its speed depends on, how to measure it, its seconds at a speed."""

    key: str  # runs with the same key share one measurement
    device: str  # its device setting
    measure: Callable[[], Speed | float]
    seconds: Callable[[Speed | float], float]
    may_stop_early: bool  # early stopping, or a task solved, can end it before its budget


@dataclasses.dataclass
class Estimates:
    """A dry run's estimates: ``seconds`` of each run to train (by name); ``unknown``: why a run to
    train has none; the devices measured on and how many distinct models were measured."""

    seconds: dict = dataclasses.field(default_factory=dict)
    unknown: dict = dataclasses.field(default_factory=dict)
    devices: list = dataclasses.field(default_factory=list)
    models: int = 0
    may_stop_early: bool = False
    load: float | None = None  # the machine's load average when measuring began, where it was busy

    @property
    def total(self) -> float:
        return sum(self.seconds.values())

    def shown(self, run: str) -> str:
        """A run's cell of the table: its time, ``?`` where none could be made, ``-`` where it has
        nothing to train."""
        if run in self.seconds:
            return duration(self.seconds[run])
        return "?" if run in self.unknown else "-"

    def lines(self) -> list[str]:
        """The lines under the table: the total, and why runs have no estimate."""
        lines = []
        if self.seconds:
            devices = " and ".join(self.devices)
            lines.append(f"about {duration(self.total)} for {len(self.seconds)} run(s) on {devices}, measured now")
            if self.may_stop_early:
                lines.append("(at most: early stopping, or a task solved, ends a run sooner)")
            if self.load is not None:
                lines.append(
                    f"(the machine was busy when measuring, load {self.load:.1f} on {os.cpu_count()} cores: "
                    "the estimates may be long)"
                )
        reasons = {}
        for run, reason in self.unknown.items():
            reasons.setdefault(reason, []).append(run)
        lines += [f"(no estimate for {len(runs)} run(s): {reason})" for reason, runs in reasons.items()]
        return lines


def estimate_points(sweep, points, states: dict, log) -> Estimates:
    """The estimates of ``points`` (``states``: each point's state by name) on this machine; ``log``
    says what is measured before it is."""
    estimates = Estimates()
    with contextlib.ExitStack() as stack:
        corpora, jobs = _Corpora(stack), {}
        for point in points:
            if states[point.name] in TO_TRAIN:
                job = _task_job(sweep, point, states) if sweep.plan.task else _text_job(sweep, point, corpora, states)
                if isinstance(job, str):
                    estimates.unknown[point.name] = job
                else:
                    jobs[point.name] = job
        distinct = {}  # each distinct model, measured with the first run that has it
        for job in jobs.values():
            distinct.setdefault(job.key, job)
        if distinct:
            estimates.load = _busy()
            labels = ", ".join(sorted({_label(job.device) for job in distinct.values()}))
            log(f"estimating: timing {len(distinct)} model(s) on {labels}, a few seconds each (--no-estimate skips it)")
        speeds = {key: _measured(job, estimates) for key, job in distinct.items()}
        estimates.models = len(distinct)
        for name, job in jobs.items():
            speed = speeds[job.key]
            if isinstance(speed, str):
                estimates.unknown[name] = speed
            else:
                estimates.seconds[name] = job.seconds(speed)
                estimates.may_stop_early |= job.may_stop_early
    return estimates


def _measured(job: Job, estimates: Estimates) -> Speed | float | str:
    """``job``'s speed, or why it could not be measured."""
    try:
        speed = job.measure()
    except CharlmError as error:
        return str(error)
    except RuntimeError as error:  # out of memory on the device, a cell that cannot run there
        return f"measuring it failed ({(str(error).strip() or type(error).__name__).splitlines()[0][:120]})"
    if _label(job.device) not in estimates.devices:
        estimates.devices.append(_label(job.device))
    return speed


def _text_job(sweep, point, corpora, states: dict) -> Job | str:
    """A `charlm train` run's job, or why it has none (its corpus is not prepared)."""
    config, evals = sweep.config(point), sweep.plan.evals
    corpus = corpora.get(config.corpus, config.data_dir)
    if isinstance(corpus, str):
        return corpus
    dynamic = next((step for step in evals if step.dynamic is not None), None)
    adapt = None if dynamic is None else (dynamic.batch_size or DynamicOptions.batch_size, DynamicOptions.segment)
    done = _tokens_done(sweep, point) if states[point.name] == "interrupted" else 0
    splits = {split: len(corpus.split(split)) for split in ("train", "valid", "test")}
    work = run_work(config, tokens_per_epoch(corpus, config), splits, evals, done)
    return Job(
        key=speed_key(config, adapt),
        device=config.device,
        measure=lambda: measure_speed(config, corpus, adapt),
        seconds=lambda speed: run_seconds(work, speed, config.max_minutes),
        may_stop_early=config.patience < config.epochs,
    )


def _task_job(sweep, point, states: dict) -> Job:
    """A `charlm task` run's job: its samples left over the samples a second measured."""
    config = task_config(sweep.plan, point).resolved()
    done = _samples_done(sweep, point) if states[point.name] == "interrupted" else 0
    left = max(config.max_samples - done, 0)
    settings = {name: value for name, value in config.to_dict().items() if name not in TASK_SETTINGS_WITHOUT_SPEED}
    return Job(
        key=json.dumps({"task": sweep.plan.task, **settings}, sort_keys=True, default=str),
        device=config.device,
        measure=lambda: measure_task_speed(config),
        seconds=lambda speed: left / speed,
        may_stop_early=True,
    )


def speed_key(config: TrainConfig, adapt: tuple | None = None) -> str:
    """What a run's speed depends on: its settings less ``SETTINGS_WITHOUT_SPEED``, and the shape of
    the dynamic evaluation measured with it."""
    settings = {name: value for name, value in config.to_dict().items() if name not in SETTINGS_WITHOUT_SPEED}
    return json.dumps({**settings, "adapt": adapt}, sort_keys=True, default=str)


def tokens_per_epoch(corpus, config: TrainConfig) -> int:
    """The tokens an epoch of ``config`` trains on ``corpus`` (its first epoch's windows)."""
    used = corpus.split("train")[: training_tokens(corpus, config)]
    layout = WindowLayout(used, config.batch_size, config.bptt, config.windows, config.vary_bptt, config.seed)
    return layout.epoch(0).tokens_scored


def _tokens_done(sweep, point) -> int:
    """The tokens an interrupted run trained up to its last epoch record (0 where it has none)."""
    try:
        epochs = Run(sweep.directory / point.name).history().epochs
    except CharlmError:
        return 0
    return max((record.tokens_seen or 0 for record in epochs), default=0)


def _samples_done(sweep, point) -> int:
    """The samples an interrupted task run trained up to its last evaluation (0 where it has none)."""
    try:
        scored = Run(sweep.directory / point.name).history().of("task_eval")
    except CharlmError:
        return 0
    return max((getattr(record, "samples", None) or 0 for record in scored), default=0)


def _busy() -> float | None:
    """The one-minute load average where other work keeps the machine busy (a quarter of its cores,
    as `charlm bench` judges it), else None."""
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        return None
    return load if load > max(0.5, 0.25 * (os.cpu_count() or 1)) else None


def _label(device: str) -> str:
    try:
        return device_label(device)
    except CharlmError:
        return device


class _Corpora:
    """The prepared corpora of a dry run, each loaded once; the embedded corpus, where it is not
    prepared yet, prepared in a temporary directory (the dry run writes nothing of its own)."""

    def __init__(self, stack: contextlib.ExitStack):
        self.stack, self.loaded = stack, {}

    def get(self, name: str, data_dir):
        """The corpus, or why it cannot be had (a string)."""
        if name not in self.loaded:
            try:
                self.loaded[name] = load_corpus(name, data_dir)
            except CharlmError:
                self.loaded[name] = f"corpus {name} is not prepared"
            if name == EMBEDDED and isinstance(self.loaded[name], str):
                directory = self.stack.enter_context(tempfile.TemporaryDirectory(prefix="charlm-estimate-"))
                prepare_corpus(EMBEDDED, data_dir=directory, progress=False, log=lambda *_: None)
                self.loaded[name] = load_corpus(EMBEDDED, directory)
        return self.loaded[name]
