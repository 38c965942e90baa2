"""Training: truncated BPTT with carried state, Adam with per-epoch decay, best/last checkpoints.

The protocol is the Lattice Recurrent Unit paper's fair comparison (see ``TrainConfig``). A run
can be interrupted (Ctrl-C, SIGTERM, ``max_minutes``) and resumed: the checkpoint holds the
weights, the optimizer and scheduler, the RNG streams, the position in the epoch and the carried
hidden state, so on the CPU a resumed run ends with exactly the weights of an uninterrupted one.

    import charlm
    summary = charlm.train(charlm.TrainConfig(corpus="wp", cell="lru", params="1M", epochs=1))
    summary = charlm.Trainer.resume("runs/wp-lru-...", epochs=5).fit()
"""

from __future__ import annotations

import dataclasses
import math
import re
import signal
import threading
import time

import torch
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm

from charlm.runs import provenance
from charlm.corpora.streams import TokenStreams
from charlm.cells import CELLS
from charlm.checkpoint import Checkpoint, TrainingState
from charlm.runtime.compiling import CompiledForward
from charlm.config import RESUMABLE_SETTINGS, TrainConfig
from charlm.corpora import load_corpus
from charlm.runtime.devices import resolve_device
from charlm.runtime.distributed import device_for_rank, environment_rank, world_from_environment
from charlm.errors import CharlmError, ConfigError
from charlm.logs import get_logger
from charlm.inference.scoring import LN2, characters_per_token, score_split
from charlm.runtime.cuda_graphs import GraphedWindow, graphed_window
from charlm.runtime.memory import check_budget_fits, check_fits, estimate_training_memory
from charlm.model import LanguageModel, ModelConfig, count_parameters, detach_state, parse_budget, size_for_budget
from charlm.runtime.precision import autocast, check_precision, float32_state, grad_scaler
from charlm.runs.directory import FollowerRun, Run, default_run_dir


class TrainingDiverged(CharlmError):
    exit_code = 3


class TrainingInterrupted(CharlmError):
    exit_code = 130


class ProcessLost(CharlmError):
    """Another process of a torchrun training failed or its machine was lost."""

    exit_code = 1


class StorageError(CharlmError):
    """The run directory could not be written (full disk, read-only): exit 1, checkpoints intact."""

    exit_code = 1


PROGRESS_INTERVAL = 60.0  # seconds between plain progress lines when stderr is not a terminal


def _first_sentence(error: BaseException) -> str:
    """``Read error [127.0.0.1]:17326: Connection reset by peer`` from a backend's long message."""
    text = re.sub(r"^\[[^\]]*\]\s*", "", str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__)
    return text.split(". ")[0].rstrip(".")


def _last_good_checkpoint(run: Run) -> Checkpoint | None:
    """The newest readable checkpoint with training state: last.pt, else previous.pt, else best.pt
    (with a warning naming what could not be read); None when the run has none at all."""
    failures = []
    for path in (run.last, run.previous, run.best):
        if not path.exists():
            if path == run.last and (run.previous.exists() or run.best.exists()):
                failures.append(f"{run.last} is missing")
            continue
        try:
            checkpoint = Checkpoint.load(path)
        except CharlmError as error:
            failures.append(str(error))
            continue
        if checkpoint.training is None:
            failures.append(f"{path} holds no training state")
            continue
        if failures:
            get_logger().warning(f"warning: {'; '.join(failures)}: resuming from {path}")
        return checkpoint
    if failures:
        raise CharlmError(f"{'; '.join(failures)}; no other checkpoint to resume from")
    return None


@dataclasses.dataclass
class Progress:
    """Where training stands; everything here goes into the checkpoint."""

    epoch: int = 0  # epochs completed before the current one
    window: int = 0  # next window of the current epoch
    step: int = 0  # optimizer steps so far
    best_valid_bpc: float = math.inf
    best_epoch: int = 0
    best_test_bpc: float | None = None  # test bpc of the best-validation weights, once scored
    wall_seconds: dict = dataclasses.field(default_factory=dict)  # train (completed epochs) / valid / test
    epochs_without_improvement: int = 0
    train_nats: float = 0.0  # this epoch so far
    train_tokens: int = 0
    train_seconds: float = 0.0
    grad_norm_sums: dict = dataclasses.field(default_factory=dict)
    finished: bool = False


def model_config_for(config: TrainConfig, vocab_size: int, cell_class=None, device: torch.device | None = None) -> ModelConfig:
    """The model a training config describes: its hidden size given, or sized to its budget.
    With ``device``, a budget whose optimizer state alone cannot fit there is refused first."""
    model_config = ModelConfig(cell=config.cell, vocab_size=vocab_size, hidden_size=config.hidden_size,
                               layers=config.layers, embed_size=config.embed_size, dropout=config.dropout,
                               cell_options=dict(config.cell_options))
    if config.params is not None:
        budget = parse_budget(config.params)
        if device is not None:
            check_budget_fits(budget, device)
        hidden, _ = size_for_budget(model_config, budget, cell_class=cell_class)
        model_config = dataclasses.replace(model_config, hidden_size=hidden)
    return model_config


def check_model_fits(model_config: ModelConfig, config: TrainConfig, device: torch.device, cell_class=None) -> None:
    """Refuse, before allocating it, a model that ``device`` cannot train (``charlm.runtime.memory``)."""
    with torch.device("meta"):
        shape = LanguageModel(model_config, cell_class)
    embed_size = getattr(shape.embedding, "embedding_dim", 0)
    estimate = estimate_training_memory(count_parameters(shape), model_config.cell, model_config.hidden_size,
                                        model_config.layers, model_config.vocab_size, embed_size,
                                        max(config.batch_size, config.eval_batch_size), config.bptt)
    check_fits(estimate, device)


class _StopRequest:
    """Ctrl-C or SIGTERM asks training to stop at the next window boundary; a second Ctrl-C aborts."""

    def __init__(self):
        self.requested = False
        self._previous = {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, signal.SIGTERM):
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc):
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)

    def _handle(self, signum, frame):
        if self.requested and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.requested = True


def check_cuda_graph(cuda_graph: bool, device: torch.device) -> None:
    """One line when ``--cuda-graph`` is asked for off a CUDA device."""
    if cuda_graph and device.type != "cuda":
        raise CharlmError(f"--cuda-graph needs a CUDA device, not {device.type}")


class Trainer:
    """Trains one model under ``config`` into a run directory (``charlm.runs.directory.Run``).

    ``Trainer(config)`` starts a new run; ``Trainer.resume(run_dir)`` continues one.
    """

    def __init__(self, config: TrainConfig, *, _resume_from: tuple[Run, Checkpoint | None] | None = None, cells=(),
                 trust_code: bool = False):
        """``_resume_from`` (used by ``resume``): the locked run and its checkpoint, or None for a run
        that was stopped before its first checkpoint and starts again."""
        config.validate()
        if config.tensorboard:
            from charlm.runs.tensorboard import check_available

            check_available()
        self.config = config
        resumed_run, checkpoint = _resume_from or (None, None)
        if checkpoint is not None:
            cell_class = checkpoint.cell_class(cells, trust_code)
        elif resumed_run is not None:
            cell_class = CELLS.resolve(config.cell, cells=cells, trust_code=trust_code, source=str(resumed_run.config_file))
        else:
            cell_class = CELLS.get(config.cell)  # the caller named this cell: it may be a module:Class
        self.device = resolve_device(config.device)
        check_precision(config.precision, self.device)
        check_cuda_graph(config.cuda_graph, self.device)
        self.world = world_from_environment(self.device)
        self.device = device_for_rank(self.device, self.world)
        self.scaler = grad_scaler(config.precision, self.device)
        self.corpus = load_corpus(config.corpus, config.data_dir)
        torch.manual_seed(config.seed)
        if checkpoint is None:
            self.model_config = model_config_for(config, self.corpus.vocab_size, cell_class, self.device)
        else:
            self.model_config = checkpoint.model_config
        check_model_fits(self.model_config, config, self.device, cell_class)
        self.model = LanguageModel(self.model_config, cell_class).to(self.device)
        # What a training step calls: the model or its DDP wrapper, maybe compiled or replayed from graphs.
        self.network = self.model
        if self.world.distributed:
            self.network = DistributedDataParallel(self.model, device_ids=[self.device.index] if self.device.type == "cuda" else None)
        if config.compile:
            self.network = CompiledForward(self.network, self.device)
        if config.cuda_graph:
            self.network = graphed_window(self.network, self.device, self.world.distributed)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=config.lr, betas=(0.9, 0.999))
        self.scheduler = torch.optim.lr_scheduler.ExponentialLR(self.optimizer, gamma=config.lr_decay)
        self.progress = Progress()
        train_tokens = self.corpus.split("train")
        used = max(2, int(len(train_tokens) * config.train_fraction))
        self.train_streams = TokenStreams(train_tokens[:used], config.batch_size, config.bptt,
                                          rows=self.world.share(config.batch_size))
        self.train_chars_per_token = characters_per_token(self.corpus, "train")
        self.hidden = None
        self.provenance = provenance.collect(self.device, self.corpus)
        if checkpoint is not None:
            self.run = resumed_run
            self._restore(checkpoint)
            self.provenance = {**checkpoint.provenance, "resumed": self.provenance}
            self.run.write_provenance(self.provenance)
        else:
            if config.init_from:
                self._load_initial_weights(config.init_from)
            if resumed_run is not None:
                self.run = resumed_run
                self.run.write_provenance(self.provenance)
            else:
                run_dir = self.world.broadcast(config.run_dir or default_run_dir(config.corpus, config.cell))
                if self.world.is_main:
                    self.run = Run.create(run_dir, {"train": config.to_dict(), "model": self.model_config.to_dict()}, self.provenance)
                else:
                    self.run = FollowerRun(run_dir)
        self.progress_interval = PROGRESS_INTERVAL
        self._compile_reported = not (config.compile or config.cuda_graph)

    @classmethod
    def resume(cls, run_dir, *, cells=(), trust_code: bool = False, **changes) -> "Trainer":
        """A trainer that continues the run in ``run_dir`` from its last checkpoint. ``changes`` may
        set only the settings that do not define the run (``RESUMABLE_SETTINGS``: epochs,
        max_minutes, device, ...)."""
        fixed = sorted(set(changes) - set(RESUMABLE_SETTINGS))
        if fixed:
            raise ConfigError(TrainConfig, fixed[0], "is fixed by the run being resumed; start a new run to change it")
        run = Run.resume(run_dir) if environment_rank() == 0 else FollowerRun(run_dir)
        try:
            checkpoint = _last_good_checkpoint(run)
            if checkpoint is not None:
                settings = checkpoint.train_config
            else:  # stopped before its first checkpoint: start it again from its config.json
                recorded = run.read_json(run.config_file).get("train")
                if not recorded:
                    raise CharlmError(f"run directory {run.path} holds no checkpoint and no readable config.json to resume")
                settings = TrainConfig.from_dict(recorded)
                get_logger().warning(f"warning: {run.path} holds no checkpoint (the run stopped before its first save): "
                                     "starting it again from the beginning")
            config = dataclasses.replace(settings, **{"run_dir": str(run.path), "max_minutes": None, **changes})
            return cls(config, _resume_from=(run, checkpoint), cells=cells, trust_code=trust_code)
        except BaseException:
            run.release()
            raise

    def _load_initial_weights(self, reference: str) -> None:
        checkpoint = Checkpoint.load(reference)
        if checkpoint.model_config != self.model_config:
            theirs, ours = checkpoint.model_config.to_dict(), self.model_config.to_dict()
            differences = ", ".join(f"{key} {theirs[key]!r} there, {ours[key]!r} here" for key in ours if theirs.get(key) != ours[key])
            raise ConfigError(TrainConfig, "init_from", f"{reference} holds another model ({differences})")
        if checkpoint.tokenizer["vocab"] != self.corpus.tokenizer.vocab:
            raise ConfigError(TrainConfig, "init_from", f"{reference}: its vocabulary differs from corpus {self.config.corpus!r}")
        self.model.load_state_dict(checkpoint.weights)

    def _restore(self, checkpoint: Checkpoint) -> None:
        state = checkpoint.training
        self.model.load_state_dict(checkpoint.weights)
        self.optimizer.load_state_dict(state.optimizer)
        self.progress = Progress(**state.progress)
        if state.scheduler is not None:
            self.scheduler.load_state_dict(state.scheduler)
        else:  # format 1 kept no scheduler: its rule was lr · decay^epoch
            lr = self.config.lr * self.config.lr_decay**self.progress.epoch
            for group in self.optimizer.param_groups:
                group["lr"] = lr
            self.scheduler.load_state_dict({"last_epoch": self.progress.epoch, "_step_count": self.progress.epoch + 1,
                                            "_last_lr": [lr] * len(self.optimizer.param_groups)})
        torch.set_rng_state(state.rng["torch"])
        if state.rng.get("cuda") and torch.cuda.is_available() and len(state.rng["cuda"]) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(state.rng["cuda"])
        if state.hidden is not None:  # every stream's state: this process carries its share
            rows = self.world.share(self.config.batch_size)
            self.hidden = [tuple(t[rows].to(self.device) for t in layer) for layer in state.hidden]

    def checkpoint(self, scores: dict | None = None) -> Checkpoint:
        """The run as it stands, as a checkpoint (weights shared with the live model)."""
        rng = {"torch": torch.get_rng_state()}
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            rng["cuda"] = torch.cuda.get_rng_state_all()
        hidden = None
        if self.hidden is not None:  # every stream's state, gathered from the processes that carry them
            gather = self.world.gather_rows
            hidden = [[gather(t.detach(), self.config.batch_size).cpu() for t in layer] for layer in self.hidden]
        training = TrainingState(optimizer=self.optimizer.state_dict(), scheduler=self.scheduler.state_dict(), rng=rng,
                                 progress=dataclasses.asdict(self.progress), hidden=hidden)
        return Checkpoint(model_config=self.model_config, train_config=self.config,
                          tokenizer=self.corpus.tokenizer.to_state(), weights=self.model.state_dict(),
                          training=training, scores=scores or {}, provenance=self.provenance)

    @property
    def lr(self) -> float:
        return self.optimizer.param_groups[0]["lr"]

    def _evaluate(self, split: str):
        started = time.monotonic()
        with autocast(self.config.precision, self.device):
            score = score_split(self.model, self.corpus, split, batch_size=self.config.eval_batch_size,
                                bptt=self.config.bptt, device=self.device, rows=self.world.share(self.config.eval_batch_size))
        score.nats = self.world.sum([score.nats])[0]  # each process scored its share of the streams
        self._add_wall(split, time.monotonic() - started)
        return score

    def _add_wall(self, part: str, seconds: float) -> None:
        wall = self.progress.wall_seconds
        wall[part] = wall.get(part, 0.0) + seconds

    def _score_best_on_test(self) -> None:
        """Score the test split once, with the best-validation weights (unless every epoch did)."""
        progress, run = self.progress, self.run
        self.world.barrier()  # best.pt is written by rank 0
        if progress.best_test_bpc is not None or not run.best.exists():
            return
        best = Checkpoint.load(run.best)
        current = {name: tensor.clone() for name, tensor in self.model.state_dict().items()}
        self.model.load_state_dict(best.weights)
        try:
            test = self._evaluate("test")
        finally:
            self.model.load_state_dict(current)
        progress.best_test_bpc = test.bpc
        if self.world.is_main:
            dataclasses.replace(best, scores={**best.scores, "test_bpc": test.bpc, "test_loss": test.loss}).save(run.best)
        run.record("test", epoch=progress.best_epoch, **test.as_dict("test_"))
        run.log(f"test {test.bpc:.4f} bpc with the best-validation weights (epoch {progress.best_epoch})")

    def fit(self) -> dict:
        """Train until ``epochs``, early stopping or ``max_minutes``; returns the summary."""
        config, progress, run = self.config, self.progress, self.run
        run.acquire()
        ended = False  # cleanly, in every process: they can part together
        try:
            if progress.finished and (progress.epoch >= config.epochs or progress.epochs_without_improvement >= config.patience):
                summary = self._complete()
                ended = True
                return summary
            progress.finished = False
            if config.tensorboard and self.world.is_main:
                from charlm.runs.tensorboard import TensorBoardSink

                run.sinks.append(TensorBoardSink(run.path / "tensorboard"))
            run.mark_running()
            summary = self._fit()
            ended = True
            return summary
        except TrainingDiverged:
            self._score_best_on_test()  # the best weights before the divergence still get their test score
            raise
        except RuntimeError as error:  # under torchrun: a collective whose peer died (gloo, NCCL)
            if not self.world.distributed:
                raise
            kept = f"the last checkpoint {run.last} is intact" if run.last.exists() else "no checkpoint had been saved"
            raise ProcessLost(f"training stopped: a process of this training failed or was lost ({_first_sentence(error)}); "
                              f"{kept}; continue with `torchrun ... -m charlm train --resume {run.path}` on any number "
                              "of processes") from None
        except OSError as error:  # a full disk, a read-only or vanished run directory
            kept = f"the last checkpoint {run.last} is intact" if run.last.exists() else "no checkpoint had been saved"
            where = error.filename or run.path
            raise StorageError(f"training stopped: cannot write {where}: {error.strerror or error}; {kept}") from None
        finally:
            try:
                run.mark_stopped()
            except OSError:
                run.release()
            self.world.leave(together=ended)

    def _complete(self) -> dict:
        """A run that has ended: finish what a stop during its last steps left undone (the test
        score, the ``end`` record), then say so."""
        run = self.run
        if self.progress.best_test_bpc is None and run.best.exists():
            self._score_best_on_test()
            run.save_last(self.checkpoint())
        if not any(row.get("event") == "end" for row in run.events()[-1:]):
            run.record("end", **self.summary())
        run.log(f"run {run.path} is already complete ({self.progress.epoch} epochs); pass a larger --epochs to go on")
        return self.summary()

    def _fit(self) -> dict:
        config, progress, run = self.config, self.progress, self.run
        parameters = count_parameters(self.model)
        run.log(f"training {self.model_config.cell} ({self.model_config.layers}×{self.model_config.hidden_size}, "
                f"{parameters:,} parameters) on {config.corpus} [{self.device}] → {run.path}")
        run.record("start", parameters=parameters, hidden_size=self.model_config.hidden_size, device=str(self.device),
                   resumed_at={"epoch": progress.epoch, "window": progress.window})
        started = time.monotonic()
        time_left = True
        with _StopRequest() as stop:
            while progress.epoch < config.epochs and time_left:
                reason = self._train_epoch(stop, started)
                if reason == "interrupted":
                    run.save_last(self.checkpoint())
                    run.record("interrupted", epoch=progress.epoch + 1, window=progress.window, step=progress.step)
                    raise TrainingInterrupted(f"interrupted: saved {run.last} at epoch {progress.epoch + 1}, step "
                                              f"{progress.step}; continue with `charlm train --resume {run.path}`")
                time_left = reason != "time"
                if self._end_epoch(partial=not time_left):
                    break
        progress.finished = time_left
        self._score_best_on_test()
        run.save_last(self.checkpoint())
        summary = self.summary()
        run.record("end", **summary)
        if not time_left:
            run.log(f"time budget of {config.max_minutes:g} min used up: the run is resumable with "
                    f"`charlm train --resume {run.path}`")
        return summary

    def _train_epoch(self, stop: _StopRequest, started: float) -> str | None:
        config, progress = self.config, self.progress
        if progress.window == 0 or self.hidden is None:
            self.hidden = self.model.initial_state(self.train_streams.rows, device=self.device)
        self.model.train()
        groups = self.model.layer_groups()
        bar = tqdm(total=len(self.train_streams), initial=progress.window, desc=f"epoch {progress.epoch + 1}/{config.epochs}",
                   unit="win", leave=False, disable=None if self.world.is_main else True, dynamic_ncols=True)
        epoch_clock = time.monotonic()
        seconds_before = progress.train_seconds
        interval = config.save_interval
        saved_at, reported_at = time.monotonic(), time.monotonic()
        try:
            for window in self.train_streams.windows(progress.window, device=self.device):
                with autocast(config.precision, self.device):
                    logits, hidden = self.network(window.inputs, self.hidden)
                logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # the loss in float32 at least
                tokens = config.batch_size * window.targets.shape[1]  # every process's streams
                if self.world.distributed:
                    # DDP averages the processes' gradients: scaling each share's summed loss by
                    # W / tokens makes that average the gradient of the mean over every stream.
                    nats = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), window.targets.reshape(-1),
                                                             reduction="sum")
                    loss = nats * (self.world.size / tokens)
                    total, stop_votes, time_votes = self.world.sum([nats.item(), stop.requested, self._time_is_up(started)])
                    value = total / tokens
                    stop_now, time_up = stop_votes > 0, time_votes > 0  # the same decision in every process
                else:
                    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), window.targets.reshape(-1))
                    value = loss.item()  # one synchronisation per step, used by every figure below
                    stop_now, time_up = None, self._time_is_up(started)
                if not math.isfinite(value):
                    self._diverged(value)
                self.optimizer.zero_grad(set_to_none=True)
                if self.scaler is None:
                    loss.backward()
                else:
                    self.scaler.scale(loss).backward()
                    self.scaler.unscale_(self.optimizer)  # true gradients for the norms and the clipping
                step_norms = self._accumulate_grad_norms(groups)
                if config.clip > 0:
                    torch.nn.utils.clip_grad_norm_(self.model.parameters(), config.clip)
                if self.scaler is None:
                    self.optimizer.step()
                else:
                    self.scaler.step(self.optimizer)  # skipped when the scaled gradients overflowed
                    self.scaler.update()
                self.hidden = float32_state(detach_state(hidden))
                if not self._compile_reported:
                    self._report_compilation()
                progress.window = window.index + 1
                progress.step += 1
                progress.train_nats += value * tokens
                progress.train_tokens += tokens
                progress.train_seconds = seconds_before + time.monotonic() - epoch_clock
                bar.update(1)
                if progress.step % config.log_every == 0:
                    bpc = value / LN2 / self.train_chars_per_token
                    bar.set_postfix(bpc=f"{bpc:.3f}", chars_s=f"{progress.train_tokens / max(progress.train_seconds, 1e-9):.0f}")
                    self.run.record("step", epoch=progress.epoch + 1, step=progress.step, loss=value, bpc=bpc, lr=self.lr,
                                    grad_norm=step_norms)
                if config.eval_every and progress.step % config.eval_every == 0:
                    valid = self._evaluate("valid")
                    self.model.train()
                    self.run.record("valid", epoch=progress.epoch + 1, step=progress.step, **valid.as_dict("valid_"))
                if stop.requested if stop_now is None else stop_now:
                    return "interrupted"
                if interval and self.world.any(self._save_due(interval, saved_at)):
                    self.run.save_last(self.checkpoint())
                    self.run.record("checkpoint", epoch=progress.epoch + 1, window=progress.window, step=progress.step)
                    saved_at = time.monotonic()
                if bar.disable and self.world.is_main and time.monotonic() - reported_at >= self.progress_interval:
                    self._report_progress(value)
                    reported_at = time.monotonic()
                if time_up:
                    return "time"
        finally:
            bar.close()
        return None

    def _report_compilation(self) -> None:
        """After the first step under ``--compile`` or ``--cuda-graph``: how long compiling or
        capturing took, or that it was not used."""
        self._compile_reported = True
        if isinstance(self.network, GraphedWindow):
            graphed = self.network
            if graphed.active and graphed.capture_seconds:
                self.run.log(f"CUDA graphs of the training window captured in {graphed.capture_seconds:.1f} s")
            self.run.record("cuda_graph", active=graphed.active, seconds=round(graphed.capture_seconds, 3),
                            failure=graphed.failure)
        if not isinstance(self.network, CompiledForward):
            return
        compiled = self.network
        if compiled.active:
            self.run.log(f"torch.compile ({compiled.backend_name}): the first step, compilation included, took "
                         f"{compiled.compile_seconds:.1f} s")
        self.run.record("compile", active=compiled.active, seconds=round(compiled.compile_seconds, 3),
                        backend=compiled.backend_name, failure=compiled.failure)

    def _time_is_up(self, started: float) -> bool:
        return self.config.max_minutes is not None and time.monotonic() - started > self.config.max_minutes * 60

    def _save_due(self, interval: tuple[str, float], saved_at: float) -> bool:
        kind, every = interval
        if kind == "steps":
            return self.progress.step % every == 0
        return time.monotonic() - saved_at >= every

    def _report_progress(self, loss: float) -> None:
        """A plain progress line, for logs and pipes where no progress bar is drawn."""
        progress, windows = self.progress, len(self.train_streams)
        bpc = loss / LN2 / self.train_chars_per_token
        speed = progress.train_tokens / max(progress.train_seconds, 1e-9)
        get_logger().info(f"epoch {progress.epoch + 1}/{self.config.epochs}  window {progress.window:,}/{windows:,} "
                          f"({100 * progress.window / windows:.0f}%)  train {bpc:.4f} bpc  {speed:,.0f} chars/s")

    def _accumulate_grad_norms(self, groups: dict) -> dict[str, float]:
        """This step's gradient norm per layer (before clipping), added to the epoch's sums."""
        sums, norms = self.progress.grad_norm_sums, {}
        for name, params in groups.items():
            grads = [p.grad for p in params if p.grad is not None]
            if grads:
                norms[name] = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads])).item()
                sums[name] = sums.get(name, 0.0) + norms[name]
        return norms

    def _diverged(self, value: float) -> None:
        kept = self.run.last if self.run.last.exists() else None
        where = f"kept the last good checkpoint {kept}" if kept else "no checkpoint had been saved yet"
        self.run.record("diverged", epoch=self.progress.epoch + 1, step=self.progress.step + 1, loss=value)
        raise TrainingDiverged(f"training stopped: loss became {value} at epoch {self.progress.epoch + 1}, "
                               f"step {self.progress.step + 1}; {where}")

    def _end_epoch(self, partial: bool) -> bool:
        """Evaluate, record, checkpoint. Returns True when early stopping ends training."""
        config, progress, run = self.config, self.progress, self.run
        valid = self._evaluate("valid")
        test = self._evaluate("test") if config.test_every_epoch else None
        if not math.isfinite(valid.loss):
            self._diverged(valid.loss)
        windows = max(progress.window, 1)
        train_loss = progress.train_nats / max(progress.train_tokens, 1)
        epoch_number = progress.epoch + 1
        improved = valid.bpc < progress.best_valid_bpc
        if improved:
            progress.best_valid_bpc, progress.best_epoch = valid.bpc, epoch_number
            progress.best_test_bpc = None if test is None else test.bpc
            progress.epochs_without_improvement = 0
        else:
            progress.epochs_without_improvement += 1
        record = {
            "epoch": epoch_number,
            "partial": partial,
            "lr": self.lr,
            "train_loss": train_loss,
            "train_bits": train_loss / LN2,
            "train_bpc": train_loss / LN2 / self.train_chars_per_token,
            **valid.as_dict("valid_"),
            **({} if test is None else test.as_dict("test_")),
            "grad_norm": {name: total / windows for name, total in progress.grad_norm_sums.items()},
            "chars_per_second": progress.train_tokens / max(progress.train_seconds, 1e-9),
            "train_seconds": progress.train_seconds,
            "step": progress.step,
            "best": improved,
        }
        run.record("epoch", **record)
        run.log(f"epoch {epoch_number:3d}  train {record['train_bpc']:.4f}  valid {valid.bpc:.4f}"
                + ("" if test is None else f"  test {test.bpc:.4f}") + " bpc"
                f"  lr {record['lr']:.2e}  {record['chars_per_second']:,.0f} chars/s" + ("  *best" if improved else "")
                + ("  (partial epoch)" if partial else ""))
        if not partial:
            progress.epoch += 1
            progress.window = 0
            self._add_wall("train", progress.train_seconds)
            progress.train_nats, progress.train_tokens, progress.train_seconds = 0.0, 0, 0.0
            progress.grad_norm_sums = {}
            self.hidden = None
            self.scheduler.step()
        stop_early = progress.epochs_without_improvement >= config.patience
        if stop_early:
            progress.finished = True
        checkpoint = self.checkpoint()
        run.save_last(checkpoint)
        if improved:
            scores = {"valid_bpc": valid.bpc, "epoch": epoch_number}
            if test is not None:
                scores.update(test_bpc=test.bpc, test_loss=test.loss)
            if self.world.is_main:
                dataclasses.replace(checkpoint, scores=scores).save(run.best)
        if stop_early:
            run.log(f"no improvement for {config.patience} epochs: stopping early")
        return stop_early

    def wall_seconds(self) -> dict:
        """Where the run's time went: training (this epoch's part included), validation, test."""
        wall = dict(self.progress.wall_seconds)
        wall["train"] = wall.get("train", 0.0) + self.progress.train_seconds
        return {part: round(wall.get(part, 0.0), 3) for part in ("train", "valid", "test")}

    def summary(self) -> dict:
        test_at_best = self.progress.best_test_bpc
        if test_at_best is None and self.run.best.exists():
            test_at_best = Checkpoint.load(self.run.best).scores.get("test_bpc")
        return {
            "run_dir": str(self.run.path),
            "epochs": self.progress.epoch,
            "partial_epoch": self.progress.window > 0,
            "best_epoch": self.progress.best_epoch,
            "best_valid_bpc": self.progress.best_valid_bpc,
            "test_bpc_at_best": test_at_best,
            "parameters": count_parameters(self.model),
            "hidden_size": self.model_config.hidden_size,
            "wall_seconds": self.wall_seconds(),
        }


def train(config: TrainConfig) -> dict:
    """Train a new run under ``config`` and return its summary (``Trainer(config).fit()``)."""
    return Trainer(config).fit()
