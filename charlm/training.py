"""Training: truncated BPTT with carried state, Adam with per-epoch decay, best/last checkpoints.

The protocol is the Lattice Recurrent Unit paper's fair comparison (see ``TrainConfig``). A run
can be interrupted (Ctrl-C, ``--max-minutes``) and resumed: the checkpoint holds the weights, the
optimizer, the RNG, the position in the epoch and the carried hidden state, so on the CPU a
resumed run ends with exactly the weights of an uninterrupted one.
"""

from __future__ import annotations

import dataclasses
import math
import signal
import threading
import time

import torch
from tqdm import tqdm

from charlm import __version__
from charlm.batching import TokenStreams
from charlm.cells import CELLS
from charlm.checkpoints import load_checkpoint, save_checkpoint
from charlm.config import TrainConfig
from charlm.corpora import load_corpus
from charlm.devices import resolve_device
from charlm.errors import CharlmError
from charlm.evaluation import LN2, characters_per_token, score_split
from charlm.model import LanguageModel, ModelConfig, count_parameters, detach_state, parse_budget, size_for_budget
from charlm.runs import RunDirectory, default_run_dir

DEFAULT_HIDDEN = 256


class TrainingDiverged(CharlmError):
    exit_code = 3


class TrainingInterrupted(CharlmError):
    exit_code = 130


@dataclasses.dataclass
class Progress:
    """Where training stands; everything here goes into the checkpoint."""

    epoch: int = 0  # epochs completed before the current one
    window: int = 0  # next window of the current epoch
    step: int = 0  # optimizer steps so far
    best_valid_bpc: float = math.inf
    best_epoch: int = 0
    epochs_without_improvement: int = 0
    train_nats: float = 0.0  # this epoch so far
    train_tokens: int = 0
    train_seconds: float = 0.0
    grad_norm_sums: dict = dataclasses.field(default_factory=dict)
    finished: bool = False


def build_model(config: TrainConfig, vocab_size: int) -> tuple[LanguageModel, ModelConfig]:
    model_config = ModelConfig(
        cell=config.cell,
        vocab_size=vocab_size,
        hidden_size=config.hidden or DEFAULT_HIDDEN,
        layers=config.layers,
        embed_size=config.embed_size,
        dropout=config.dropout,
        cell_options=dict(config.cell_options),
    )
    if config.params is not None:
        hidden, _ = size_for_budget(model_config, parse_budget(config.params))
        model_config = dataclasses.replace(model_config, hidden_size=hidden)
    return LanguageModel(model_config), model_config


class _StopRequest:
    """First Ctrl-C asks training to stop at the next window boundary; a second one aborts."""

    def __init__(self):
        self.requested = False
        self._previous = None

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def __exit__(self, *exc):
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)

    def _handle(self, signum, frame):
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True


class Trainer:
    def __init__(self, config: TrainConfig, *, resume: dict | None = None):
        config.validate()
        CELLS.get(config.cell)  # an unknown cell is reported before anything is loaded
        self.config = config
        self.device = resolve_device(config.device)
        self.corpus = load_corpus(config.corpus, config.data_dir)
        self.run = RunDirectory(config.run_dir or default_run_dir(config.corpus, config.cell))
        torch.manual_seed(config.seed)
        if resume is not None:
            self.model_config = ModelConfig.from_dict(resume["model_config"])
            self.model = LanguageModel(self.model_config)
        else:
            self.model, self.model_config = build_model(config, self.corpus.vocab_size)
        self.model.to(self.device)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=config.lr, betas=(0.9, 0.999))
        self.progress = Progress()
        train_tokens = self.corpus.split("train")
        used = max(2, int(len(train_tokens) * config.train_fraction))
        self.train_streams = TokenStreams(train_tokens[:used], config.batch_size, config.bptt)
        self.train_chars_per_token = characters_per_token(self.corpus, "train")
        self.hidden = None
        if resume is not None:
            self._restore(resume)
        else:
            if config.init_from:
                self._load_initial_weights(config.init_from)
            self.run.create()
            self.run.write_config({"train": config.to_dict(), "model": self.model_config.to_dict()})

    def _load_initial_weights(self, reference: str) -> None:
        payload = load_checkpoint(reference)
        if payload["model_config"] != self.model_config.to_dict():
            raise CharlmError(f"--init-from {reference}: its model ({payload['model_config']}) differs from this one ({self.model_config.to_dict()})")
        if payload["tokenizer"]["vocab"] != self.corpus.tokenizer.vocab:
            raise CharlmError(f"--init-from {reference}: its vocabulary differs from corpus {self.config.corpus!r}")
        self.model.load_state_dict(payload["model"])

    def _restore(self, payload: dict) -> None:
        self.model.load_state_dict(payload["model"])
        self.optimizer.load_state_dict(payload["optimizer"])
        torch.set_rng_state(payload["rng"]["torch"])
        self.progress = Progress(**payload["progress"])
        if payload.get("hidden") is not None:
            self.hidden = [tuple(t.to(self.device) for t in layer) for layer in payload["hidden"]]

    def _payload(self) -> dict:
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": {"lr": self._lr(self.progress.epoch), "lr_decay": self.config.lr_decay, "epoch": self.progress.epoch},
            "rng": {"torch": torch.get_rng_state()},
            "progress": dataclasses.asdict(self.progress),
            "hidden": None if self.hidden is None else [[t.detach().cpu() for t in layer] for layer in self.hidden],
            "config": self.config.to_dict(),
            "model_config": self.model_config.to_dict(),
            "tokenizer": self.corpus.tokenizer.to_state(),
            "corpus": {"name": self.corpus.name, "unit": self.corpus.unit, "vocab_size": self.corpus.vocab_size},
            "charlm_version": __version__,
        }

    def _lr(self, epoch: int) -> float:
        return self.config.lr * self.config.lr_decay**epoch

    def _evaluate(self, split: str):
        return score_split(self.model, self.corpus, split, batch_size=self.config.eval_batch_size, bptt=self.config.bptt, device=self.device)

    def fit(self) -> dict:
        config, progress, run = self.config, self.progress, self.run
        if progress.finished and progress.epoch >= config.epochs:
            run.log(f"run {run.path} is already complete ({progress.epoch} epochs); pass a larger --epochs to go on")
            return self.summary()
        progress.finished = False
        run.log(
            f"training {self.model_config.cell} ({self.model_config.layers}×{self.model_config.hidden_size}, "
            f"{count_parameters(self.model):,} parameters) on {config.corpus} [{self.device}] → {run.path}"
        )
        run.record("start", parameters=count_parameters(self.model), hidden_size=self.model_config.hidden_size,
                   resumed_at={"epoch": progress.epoch, "window": progress.window}, device=str(self.device))
        started = time.monotonic() - progress.train_seconds
        with _StopRequest() as stop:
            while progress.epoch < config.epochs:
                reason = self._train_epoch(stop, started)
                if reason == "interrupted":
                    save_checkpoint(run.last, self._payload())
                    run.record("interrupted", epoch=progress.epoch + 1, window=progress.window, step=progress.step)
                    raise TrainingInterrupted(f"interrupted: saved {run.last} at epoch {progress.epoch + 1}, step {progress.step}; continue with `charlm train --resume {run.path}`")
                partial = reason == "time"
                if self._end_epoch(partial) or partial:
                    break
        progress.finished = True
        save_checkpoint(run.last, self._payload())
        summary = self.summary()
        run.record("end", **summary)
        return summary

    def _train_epoch(self, stop: _StopRequest, started: float) -> str | None:
        config, progress = self.config, self.progress
        lr = self._lr(progress.epoch)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        if progress.window == 0 or self.hidden is None:
            self.hidden = self.model.initial_state(config.batch_size, device=self.device)
        self.model.train()
        groups = self.model.layer_groups()
        bar = tqdm(total=len(self.train_streams), initial=progress.window, desc=f"epoch {progress.epoch + 1}/{config.epochs}",
                   unit="win", leave=False, disable=None, dynamic_ncols=True)
        epoch_clock = time.monotonic()
        seconds_before = progress.train_seconds
        try:
            for window in self.train_streams.windows(progress.window, device=self.device):
                logits, hidden = self.model(window.inputs, self.hidden)
                loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), window.targets.reshape(-1))
                if not torch.isfinite(loss):
                    self._diverged(loss.item())
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                self._accumulate_grad_norms(groups)
                if config.clip > 0:
                    torch.nn.utils.clip_grad_norm_(self.model.parameters(), config.clip)
                self.optimizer.step()
                self.hidden = detach_state(hidden)
                tokens = window.targets.numel()
                progress.window = window.index + 1
                progress.step += 1
                progress.train_nats += loss.item() * tokens
                progress.train_tokens += tokens
                progress.train_seconds = seconds_before + time.monotonic() - epoch_clock
                bar.update(1)
                if progress.step % config.log_every == 0:
                    bpc = loss.item() / LN2 / self.train_chars_per_token
                    bar.set_postfix(bpc=f"{bpc:.3f}", chars_s=f"{progress.train_tokens / max(progress.train_seconds, 1e-9):.0f}")
                    self.run.record("step", epoch=progress.epoch + 1, step=progress.step, loss=loss.item(), bpc=bpc, lr=lr)
                if config.eval_every and progress.step % config.eval_every == 0:
                    valid = self._evaluate("valid")
                    self.model.train()
                    self.run.record("valid", epoch=progress.epoch + 1, step=progress.step, **valid.as_dict("valid_"))
                if stop.requested:
                    return "interrupted"
                if config.max_minutes is not None and time.monotonic() - started > config.max_minutes * 60:
                    return "time"
        finally:
            bar.close()
        return None

    def _accumulate_grad_norms(self, groups: dict) -> None:
        sums = self.progress.grad_norm_sums
        for name, params in groups.items():
            grads = [p.grad for p in params if p.grad is not None]
            if grads:
                norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads])).item()
                sums[name] = sums.get(name, 0.0) + norm

    def _diverged(self, value: float) -> None:
        kept = self.run.last if self.run.last.exists() else None
        where = f"kept the last good checkpoint {kept}" if kept else "no checkpoint had been saved yet"
        self.run.record("diverged", epoch=self.progress.epoch + 1, step=self.progress.step + 1, loss=value)
        raise TrainingDiverged(f"training stopped: loss became {value} at epoch {self.progress.epoch + 1}, step {self.progress.step + 1}; {where}")

    def _end_epoch(self, partial: bool) -> bool:
        """Evaluate, record, checkpoint. Returns True when early stopping ends training."""
        config, progress, run = self.config, self.progress, self.run
        valid, test = self._evaluate("valid"), self._evaluate("test")
        windows = max(progress.window, 1)
        train_loss = progress.train_nats / max(progress.train_tokens, 1)
        epoch_number = progress.epoch + 1
        improved = valid.bpc < progress.best_valid_bpc
        if improved:
            progress.best_valid_bpc, progress.best_epoch = valid.bpc, epoch_number
            progress.epochs_without_improvement = 0
        else:
            progress.epochs_without_improvement += 1
        record = {
            "epoch": epoch_number,
            "partial": partial,
            "lr": self._lr(progress.epoch),
            "train_loss": train_loss,
            "train_bits": train_loss / LN2,
            "train_bpc": train_loss / LN2 / self.train_chars_per_token,
            **valid.as_dict("valid_"),
            **test.as_dict("test_"),
            "grad_norm": {name: total / windows for name, total in progress.grad_norm_sums.items()},
            "chars_per_second": progress.train_tokens / max(progress.train_seconds, 1e-9),
            "train_seconds": progress.train_seconds,
            "step": progress.step,
            "best": improved,
        }
        run.record("epoch", **record)
        run.log(
            f"epoch {epoch_number:3d}  train {record['train_bpc']:.4f}  valid {valid.bpc:.4f}  test {test.bpc:.4f} bpc"
            f"  lr {record['lr']:.2e}  {record['chars_per_second']:,.0f} chars/s" + ("  *best" if improved else "")
        )
        if not partial:
            progress.epoch += 1
            progress.window = 0
            progress.train_nats, progress.train_tokens, progress.train_seconds = 0.0, 0, 0.0
            progress.grad_norm_sums = {}
            self.hidden = None
        stop_early = progress.epochs_without_improvement >= config.patience
        if stop_early:
            progress.finished = True
        payload = self._payload()
        save_checkpoint(run.last, payload)
        if improved:
            save_checkpoint(run.best, {**payload, "test_bpc": test.bpc, "valid_bpc": valid.bpc})
        if stop_early:
            run.log(f"no improvement for {config.patience} epochs: stopping early")
        return stop_early

    def summary(self) -> dict:
        test_at_best = None
        if self.run.best.exists():
            test_at_best = load_checkpoint(self.run.best).get("test_bpc")
        return {
            "run_dir": str(self.run.path),
            "epochs": self.progress.epoch,
            "best_epoch": self.progress.best_epoch,
            "best_valid_bpc": self.progress.best_valid_bpc,
            "test_bpc_at_best": test_at_best,
            "parameters": count_parameters(self.model),
            "hidden_size": self.model_config.hidden_size,
        }


def resume_training(run_dir: str, epochs: int | None = None, max_minutes: float | None = None) -> Trainer:
    """A trainer that continues the run in ``run_dir`` from its last checkpoint."""
    payload = load_checkpoint(run_dir, prefer="last")
    config = TrainConfig.from_dict(payload["config"])
    config.run_dir = str(RunDirectory(run_dir).path)
    if epochs is not None:
        config.epochs = epochs
    config.max_minutes = max_minutes
    return Trainer(config, resume=payload)
