"""Training a network on an algorithmic task until it solves it or runs out of samples.

Every batch is drawn fresh from the training stream (a ``torch.Generator`` seeded by ``seed``, its
state saved with the weights, so a resumed run draws exactly the samples it would have drawn). Every
``eval_every`` samples the network is scored on ``eval_samples`` held-out samples (drawn once from a
second stream, seed + 1,000,003, never trained on for the sequence tasks); the first sample count at
which the held-out per-symbol accuracy exceeds 50%, 80% and 99%, and reaches 100% (the paper's
criterion: training stops there), is recorded.

A run directory like any other: ``config.json``, ``provenance.json``, ``metrics.jsonl`` (``start``,
``task_eval`` and ``task_end`` records), ``train.log`` and ``last.pt`` (weights-only).
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from charlm.runtime.seeds import torch_seed
from charlm.settings import flag_of
from charlm.checkpoint import TrainingState, read_task_payload, task_payload, torch_file
from charlm.errors import CharlmError
from charlm.files import atomic_write_bytes
from charlm.model import count_parameters
from charlm.runs import provenance as provenance_of
from charlm.runs.directory import Run
from charlm.runtime.devices import resolve_device
from charlm.runtime.memory import check_fits
from charlm.tasks.config import TaskConfig  # its home has no torch (`charlm task --help`); its callers find it here too
from charlm.tasks.models import build_task_model, check_wavefront, estimate_task_memory
from charlm.training.control import StopReason, StopRequest, TrainingDiverged, TrainingInterrupted
from charlm.training.optimizers import optimizer_named

THRESHOLDS = (0.5, 0.8, 0.99, 1.0)  # held-out per-symbol accuracy: exceeded (or, for 1.0, reached)
EVAL_STREAM = 1_000_003  # the held-out samples' seed is the run's seed plus this


@dataclasses.dataclass
class TaskProgress:
    """Where a run stands: what ``last.pt`` carries besides the weights and the optimizer."""

    samples: int = 0
    steps: int = 0
    reached: dict = dataclasses.field(default_factory=dict)  # "0.5" → samples when first exceeded
    accuracy: float | None = None  # the last held-out figures
    sequence_accuracy: float | None = None
    seconds: float = 0.0


def score(model: nn.Module, batch, chunk: int = 100) -> dict:
    """Loss (nats per target), per-symbol and per-sequence accuracy of ``model`` on ``batch``."""
    loss = correct = counted = whole = 0.0
    for start in range(0, batch.inputs.shape[0], chunk):
        inputs, targets, mask = (tensor[start : start + chunk] for tensor in (batch.inputs, batch.targets, batch.mask))
        logits = model(inputs)
        losses = F.cross_entropy(logits.transpose(1, 2), targets, reduction="none")
        right = (logits.argmax(dim=-1) == targets) | ~mask
        loss += float(losses[mask].sum())
        correct += float((right & mask).sum())
        counted += float(mask.sum())
        whole += float(right.all(dim=1).sum())
    return {"loss": loss / counted, "accuracy": correct / counted, "sequence_accuracy": whole / batch.inputs.shape[0]}


def masked_loss(logits, batch):
    """Mean cross-entropy over the positions where the target counts."""
    losses = F.cross_entropy(logits.transpose(1, 2), batch.targets, reduction="none")
    return losses[batch.mask].mean()


TASK_FLAGS = {"memorization": "--length", "addition": "--digits", "parity": "--bits"}  # what sizes a sample


def check_task_fits(
    config: TaskConfig, task, device: torch.device, available: int | None = None, resumed: bool = False
) -> None:
    """Refuse, before the network is built or the run directory made, a run that ``device`` cannot hold
    (``estimate_task_memory``), naming the options to change: those of the larger part first."""
    estimate = estimate_task_memory(
        task,
        config.cell,
        config.hidden_size,
        config.layers,
        config.tied,
        config.cell_options,
        config.batch_size,
        config.eval_samples,
    )
    network = f"a smaller {flag_of(TaskConfig, 'hidden_size')} or fewer --layers"
    samples = f"a smaller --batch-size, {TASK_FLAGS[task.name]} or --eval-samples"
    first, second = (network, samples) if estimate.state_bytes >= estimate.total_bytes / 2 else (samples, network)
    advice = "resume it where more memory is free" if resumed else f"use {first}, or {second}"
    check_fits(estimate, device, available, advice=advice)


def update_thresholds(progress: TaskProgress, accuracy: float) -> list[float]:
    """Record the thresholds that ``accuracy`` crosses for the first time; returns them."""
    crossed = []
    for threshold in THRESHOLDS:
        key = str(threshold)
        if key not in progress.reached and (accuracy >= 1.0 if threshold == 1.0 else accuracy > threshold):
            progress.reached[key] = progress.samples
            crossed.append(threshold)
    return crossed


def save_checkpoint(path: Path, config: TaskConfig, model, optimizer, generator, progress: TaskProgress) -> None:
    """``last.pt``: the charlm checkpoint format, of kind "task" (``charlm.checkpoint.task_payload``)."""
    training = TrainingState(
        optimizer.state_dict(), None, {"torch": generator.get_state()}, dataclasses.asdict(progress), None
    )
    payload = task_payload(config.to_dict(), model.state_dict(), training)
    atomic_write_bytes(path, torch_file(payload))


class _Saver:
    """``Run.save_last`` wants an object with ``save(path)``."""

    def __init__(self, *parts):
        self.parts = parts

    def save(self, path):
        save_checkpoint(Path(path), *self.parts)


def train_task(
    config: TaskConfig | None = None,
    *,
    run_dir: str | Path,
    resume: bool = False,
    max_samples: int | None = None,
    progress_every: float = 10.0,
) -> dict:
    """Train (or, with ``resume``, continue) the run in ``run_dir``; returns the ``task_end`` fields.

    On resume the saved config is used (``max_samples`` may raise the budget).
    """
    if resume:
        run = Run.resume(run_dir)
        if not run.last.exists():
            run.release()
            raise CharlmError(f"{run.path} has no last.pt to resume")
        payload = read_task_payload(run.last)
        config = TaskConfig.from_dict(payload["task_config"])
        if max_samples is not None:
            config.max_samples = max_samples
        config = config.resolved()
        state = TaskProgress(**payload["training"]["progress"])
        if "1.0" in state.reached:
            run.release()
            raise CharlmError(
                f"{run.path} is solved already (100% at {state.reached['1.0']:,} samples): nothing to resume"
            )
        if state.samples >= config.max_samples:
            run.release()
            raise CharlmError(f"{run.path} has used its {config.max_samples:,} samples: pass a larger --max-samples")
    else:
        if config is None:
            raise CharlmError("a new task run needs its TaskConfig")
        config = config.resolved()
        payload, state = None, TaskProgress()
    task = config.make_task()
    try:
        device = resolve_device(config.device)
        check_task_fits(config, task, device, resumed=resume)  # before anything is allocated or written
    except CharlmError:
        if resume:
            run.release()
        raise
    torch.manual_seed(torch_seed(config.seed))  # the initial weights
    model = build_task_model(task, config.cell, config.hidden_size, config.layers, config.tied, config.cell_options)
    model.to(device)
    optimizer = optimizer_named(config.optimizer, model.parameters(), config.lr)  # torch's defaults otherwise
    generator = torch.Generator().manual_seed(torch_seed(config.seed))
    if payload is not None:
        model.load_state_dict(payload["weights"])
        optimizer.load_state_dict(payload["training"]["optimizer"])
        generator.set_state(payload["training"]["rng"]["torch"])
    else:
        record = {
            "task": {"name": task.name, **dataclasses.asdict(task)},
            "model": {
                "cell": config.cell,
                "layers": config.layers,
                "hidden_size": config.hidden_size,
                "tied": config.tied,
            },
            "train": {"corpus": task.name, **config.to_dict()},
        }
        run = Run.create(run_dir, record, provenance_of.collect(device))
    held_out = task.sample(
        torch.Generator().manual_seed(torch_seed(config.seed + EVAL_STREAM)), config.eval_samples
    ).to(device)
    parameters = count_parameters(model)
    run.record(
        "start",
        parameters=parameters,
        hidden_size=config.hidden_size,
        device=str(device),
        resumed_at={"samples": state.samples} if resume else None,
    )
    if getattr(model, "use_wavefront", False) and not config.wavefront:
        model.use_wavefront = False
    if getattr(model, "use_wavefront", False):
        check = check_wavefront(model, held_out.inputs[:16])
        run.record("fast_path", **check)
        if not check["active"]:
            run.log(f"warning: the wavefront {check['failure']}: running layer by layer")
    run.mark_running()
    run.log(
        f"{task.name}: {config.cell} {config.layers}×{config.hidden_size}"
        f"{' tied' if config.tied else ''}, {parameters:,} parameters, {config.max_samples:,} samples at most"
    )
    saver = _Saver(config, model, optimizer, generator, state)
    stopped_by, started, last_print = None, time.perf_counter(), time.perf_counter()
    samples_before = state.samples
    seconds_before = state.seconds
    next_eval = (state.samples // config.eval_every + 1) * config.eval_every
    with StopRequest() as stop:
        while stopped_by is None:
            model.train()
            batch = task.sample(generator, config.batch_size).to(device)
            loss = masked_loss(model(batch.inputs), batch)
            if not torch.isfinite(loss):
                run.record("diverged", epoch=0, step=state.steps, loss=float(loss))
                run.mark_stopped()
                raise TrainingDiverged(
                    f"the loss is {float(loss)} at {state.samples:,} samples: training stopped "
                    f"({run.path}/last.pt holds the last good weights)"
                )
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if config.clip is not None:
                nn.utils.clip_grad_norm_(model.parameters(), config.clip)
            optimizer.step()
            state.samples += config.batch_size
            state.steps += 1
            state.seconds = seconds_before + time.perf_counter() - started
            if stop.requested:
                run.save_last(saver)
                run.record("interrupted", epoch=0, window=0, step=state.steps)
                run.mark_stopped()
                raise TrainingInterrupted(
                    f"interrupted at {state.samples:,} samples; resume with charlm task --resume {run.path}"
                )
            if state.samples < next_eval and state.samples < config.max_samples:
                continue
            next_eval += config.eval_every
            model.eval()
            with torch.no_grad():
                figures = score(model, held_out)
            state.accuracy, state.sequence_accuracy = figures["accuracy"], figures["sequence_accuracy"]
            crossed = update_thresholds(state, figures["accuracy"])
            run.record(
                "task_eval",
                samples=state.samples,
                steps=state.steps,
                train_loss=float(loss.detach()),
                seconds=round(state.seconds, 3),
                **figures,
            )
            if "1.0" in state.reached:
                stopped_by = StopReason.SOLVED
            elif state.samples >= config.max_samples:
                stopped_by = StopReason.SAMPLES
            run.save_last(saver)
            now = time.perf_counter()
            if crossed or stopped_by or now - last_print >= progress_every:
                last_print = now
                rate = (state.samples - samples_before) / max(now - started, 1e-9)
                run.log(
                    f"{state.samples:>10,} samples  loss {figures['loss']:.4f}  accuracy {figures['accuracy']:.2%}  "
                    f"sequences {figures['sequence_accuracy']:.2%}  {rate:,.0f} samples/s"
                    + "".join(f"  >{t:.0%}" if t < 1 else "  solved" for t in crossed)
                )
    end = {
        "samples": state.samples,
        "stopped_by": stopped_by.value,
        "reached": dict(state.reached),
        "accuracy": state.accuracy,
        "sequence_accuracy": state.sequence_accuracy,
        "parameters": parameters,
        "seconds": round(state.seconds, 3),
        "run_dir": str(run.path),
    }
    run.record("task_end", **end)
    run.mark_stopped()
    return end
