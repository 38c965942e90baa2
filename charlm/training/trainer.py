"""Training: truncated BPTT with carried state, an optimizer (Adam by default) and its learning-rate
schedule, best/last checkpoints.

A step is one optimizer update: one window, or with ``--accumulate K`` a group of K windows
(``step.update_groups``). ``progress.step`` counts updates and ``progress.window`` windows; every
save, stop and resume falls at an update's end, so no run resumes inside a group.

The protocol is the Lattice Recurrent Unit paper's fair comparison (see ``TrainConfig``). A run
can be interrupted (Ctrl-C, SIGTERM, ``max_minutes``) and resumed: the checkpoint holds the
weights, the optimizer and scheduler, the RNG streams, the position in the epoch and the carried
state (``charlm.training.resume``), so on the CPU a resumed run ends with exactly the weights of an
uninterrupted one.

    import charlm
    summary = charlm.Trainer(charlm.TrainConfig(corpus="wp", cell="lru", params="1M", epochs=1)).fit()
    summary = charlm.Trainer.resume("runs/wp-lru-...", epochs=5).fit()

``Trainer`` is the loop and its decisions; the parts it is built from are made in ``setup``, one
optimization step is ``step.TrainingStep``, stopping is ``control``, what it shows and records is
``reporting``.
"""

from __future__ import annotations

import math
import time

import torch

from charlm.runtime.seeds import torch_seed
from charlm.checkpoint import Checkpoint
from charlm.checkpoint_checks import check_against_model
from charlm.config import TrainConfig
from charlm.corpora import load_corpus
from charlm.errors import CharlmError
from charlm.files import path_value
from charlm.inference.scoring import LN2, characters_per_token
from charlm.model import LanguageModel, count_parameters
from charlm.runs import provenance
from charlm.runs.directory import FollowerRun, Run, default_run_dir
from charlm.runs.retention import epoch_checkpoint_name, save_epoch_checkpoint
from charlm.runtime.distributed import environment_rank
from charlm.runtime.precision import grad_scaler
from charlm.training import reporting
from charlm.training.control import (
    Interrupted,
    LossNotFinite,
    OutOfTime,
    OutOfTokens,
    ProcessLost,
    SaveSchedule,
    StopRequest,
    StorageError,
    TimeBudget,
    TrainingDiverged,
    TrainingInterrupted,
    owning,
)
from charlm.training.evaluation import Scorer
from charlm.training.resume import (
    Progress,
    check_resumable,
    check_same_run,
    check_same_vocabulary,
    last_good_checkpoint,
    read_progress,
    restore,
    restore_best,
    resumed_config,
    seed_this_process,
    training_checkpoint,
)
from charlm.training.setup import (
    cell_class_for,
    check_training_state,
    check_streams,
    check_model_fits,
    forward_pass,
    gradient_sync_pause,
    load_initial_weights,
    model_config_for,
    optimizer_and_schedule,
    placement,
    training_streams,
)
from charlm.training.step import TrainingStep, gradients_for, update_groups
from charlm.training.text_input import check_text_corpus

__all__ = ["Trainer", "TrainingDiverged", "TrainingInterrupted", "ProcessLost", "StorageError", "Progress"]


class Trainer:
    """Trains one model under ``config`` into a run directory (``charlm.runs.directory.Run``).

    ``Trainer(config)`` starts a new run; ``Trainer.resume(run_dir)`` continues one.
    """

    def __init__(
        self,
        config: TrainConfig,
        *,
        _resume_from: tuple[Run, Checkpoint | None] | None = None,
        cells=(),
        trust_code: bool = False,
    ):
        """``_resume_from`` (used by ``resume``): the locked run and its checkpoint, or None for a run
        that was stopped before its first checkpoint and starts again."""
        self.last_valid_bpc = None  # the last validation score of this session, for the progress bar
        if not isinstance(config, TrainConfig):
            raise CharlmError(f"config must be a charlm.TrainConfig, not {type(config).__name__}")
        config.validate()
        if config.tensorboard:
            from charlm.runs.tensorboard import check_available

            check_available()
        if config.wandb:
            from charlm.runs import wandb_sink

            wandb_sink.check_available()
        self.config = config
        resumed_run, checkpoint = _resume_from or (None, None)
        cell_class = cell_class_for(config, resumed_run, checkpoint, cells, trust_code)
        if (
            checkpoint is not None
        ):  # weights, optimizer and carried state against the model's shapes, on the meta device
            shape = check_against_model(checkpoint, cell_class)
            if checkpoint.training is not None:
                check_training_state(checkpoint.training, shape, checkpoint.train_config, checkpoint.path)
            _check_tokens_left(read_progress(checkpoint), config)  # before anything is built or written
        self.device, self.world = placement(config)
        scaler = grad_scaler(config.precision, self.device)
        check_text_corpus(config)
        self.corpus = load_corpus(config.corpus, config.data_dir)
        check_same_vocabulary(checkpoint, self.corpus)
        check_streams(config, self.corpus)
        torch.manual_seed(torch_seed(config.seed))
        if checkpoint is None:
            self.model_config = model_config_for(config, self.corpus.vocab_size, cell_class, self.device)
        else:
            self.model_config = checkpoint.model_config
        check_model_fits(self.model_config, config, self.device, cell_class)
        self.model = LanguageModel(self.model_config, cell_class).to(self.device)
        seed_this_process(config.seed, self.world)
        forward = forward_pass(self.model, config, self.device, self.world)
        self.train_streams = training_streams(self.corpus, config, self.world)
        self.optimizer, self.scheduler = optimizer_and_schedule(self.model, config, len(self.train_streams))
        self.step = TrainingStep(
            self.model,
            forward,
            self.optimizer,
            gradients_for(scaler),
            self.world,
            batch_size=config.batch_size,
            clip=config.clip,
            precision=config.precision,
            device=self.device,
            gradient_sync_pause=gradient_sync_pause(forward),
        )
        self.train_chars_per_token = characters_per_token(self.corpus, "train")
        self.progress = Progress()
        self.scorer = Scorer(self)
        self.state = None  # the carried recurrent state of this process's streams
        self.provenance = provenance.collect(self.device, self.corpus)
        if checkpoint is not None:
            self.run = resumed_run
            self.progress, self.state = restore(
                checkpoint, config, self.model, self.optimizer, self.scheduler, self.world, self.device
            )
            self.provenance = {**checkpoint.provenance, "resumed": self.provenance}
            self.run.write_provenance(self.provenance)
        elif resumed_run is not None:  # stopped before its first checkpoint: it starts again
            self.run = resumed_run
            load_initial_weights(self.model, self.model_config, self.corpus, config)
            self.run.write_provenance(self.provenance)
        else:
            load_initial_weights(self.model, self.model_config, self.corpus, config)
            run_dir = self.world.broadcast(config.run_dir or default_run_dir(config.corpus, config.cell))
            if self.world.is_main:
                self.run = Run.create(
                    run_dir, {"train": config.to_dict(), "model": self.model_config.to_dict()}, self.provenance
                )
            else:
                self.run = FollowerRun(run_dir)
        self._fast_path_reported = not (config.compile or config.cuda_graph)
        self._budget = None  # the time budget of the session fit() runs
        if checkpoint is not None and self.world.is_main:
            restore_best(self.run, checkpoint)

    @classmethod
    def resume(cls, run_dir, *, cells=(), trust_code: bool = False, **changes) -> "Trainer":
        """A trainer that continues the run in ``run_dir`` from its last checkpoint. ``changes`` may
        set only the settings that do not define the run (``RESUMABLE_SETTINGS``: epochs,
        max_minutes, device, ...)."""
        check_resumable(changes)
        run_dir = path_value(run_dir, "run_dir")
        run = Run.resume(run_dir) if environment_rank() == 0 else FollowerRun(run_dir)
        try:
            checkpoint = last_good_checkpoint(run)
            if checkpoint is not None:
                check_same_run(run, checkpoint)
            config = resumed_config(run, checkpoint, changes)
            return cls(config, _resume_from=(run, checkpoint), cells=cells, trust_code=trust_code)
        except BaseException:
            run.release()
            raise

    @property
    def lr(self) -> float:
        return self.optimizer.param_groups[0]["lr"]

    def checkpoint(self, scores: dict | None = None) -> Checkpoint:
        """The run as it stands, as a checkpoint (weights shared with the live model)."""
        if self._budget is not None:  # the time budget is part of the saved progress
            self.progress.budget_seconds = self._budget.spent()
        return training_checkpoint(self, scores)

    def summary(self) -> dict:
        return reporting.summary(self.progress, self.run, self.model, self.model_config)

    # --- the protocol --------------------------------------------------------------------------------
    def fit(self) -> dict:
        """Train until ``epochs``, early stopping or ``max_minutes``; returns the summary."""
        config, progress, run = self.config, self.progress, self.run  # a used-up --max-tokens: refused in __init__
        with owning(run, self.world):
            if progress.finished and (
                progress.epoch >= config.epochs or progress.epochs_without_improvement >= config.patience
            ):
                return self._complete()
            progress.finished = False
            budget = self._budget = TimeBudget(
                config.max_minutes, progress.budget_seconds
            )  # the run's, not the session's
            if progress.stopped_by == "time" and budget.is_up():  # stopped by this budget before (its end unwritten?)
                return self._complete(
                    f"its --max-minutes budget of {config.max_minutes:g} min is used up; pass a larger "
                    "--max-minutes to go on"
                )
            if config.tensorboard and self.world.is_main:
                from charlm.runs.tensorboard import TensorBoardSink

                run.sinks.append(TensorBoardSink(run.path / "tensorboard"))
            if config.wandb and self.world.is_main:
                from charlm.runs.wandb_sink import WandbSink

                run.sinks.append(
                    WandbSink(
                        run.path,
                        {"train": config.to_dict(), "model": self.model_config.to_dict()},
                        config.wandb_project,
                        step=progress.step,
                    )
                )
            run.mark_running()
            parameters = count_parameters(self.model)
            run.log(
                f"training {self.model_config.cell} ({self.model_config.layers}×{self.model_config.hidden_size}, "
                f"{parameters:,} parameters) on {config.corpus} [{self.device}] → {run.path}"
            )
            if progress.step:
                best = (
                    f"; best valid {progress.best_valid_bpc:.4f} bpc at epoch {progress.best_epoch}"
                    if progress.best_epoch
                    else ""
                )
                run.log(
                    f"resuming at epoch {progress.epoch + 1}, window {progress.window:,}, step {progress.step:,}: "
                    f"{progress.tokens_seen:,} tokens trained so far{best}"
                )
            run.record(
                "start",
                parameters=parameters,
                hidden_size=self.model_config.hidden_size,
                device=str(self.device),
                resumed_at={"epoch": progress.epoch, "window": progress.window, "step": progress.step},
            )
            out_of_budget = None
            progress.stopped_by = None
            with StopRequest() as stop:
                while progress.epoch < config.epochs:
                    try:
                        self._train_epoch(stop, budget)
                    except Interrupted:
                        self._stop_interrupted()
                    except OutOfTime:
                        out_of_budget = "time"
                    except OutOfTokens:
                        out_of_budget = "tokens"
                    progress.stopped_by = out_of_budget  # saved with the partial epoch: a resume knows why it stopped
                    if self._end_epoch(partial=out_of_budget is not None):
                        progress.stopped_by = "patience"
                        break
                    if out_of_budget is None and self._tokens_used_up():  # the budget ended with the epoch
                        out_of_budget = "tokens"
                    if out_of_budget:
                        progress.stopped_by = out_of_budget
                        break
                else:
                    progress.stopped_by = "epochs"
            out_of_time = out_of_budget is not None
            progress.finished = not out_of_time
            self.scorer.test_best(self.run)
            run.save_last(self.checkpoint())
            summary = self.summary()
            run.record("end", **summary)
            if out_of_budget == "time":
                run.log(
                    f"time budget of {config.max_minutes:g} min used up: the run is resumable with "
                    f"`charlm train --resume {run.path}`"
                )
            elif out_of_budget == "tokens":
                run.log(
                    f"token budget of {config.max_tokens:,} used up ({progress.tokens_seen:,} tokens): the run is "
                    f"resumable with `charlm train --resume {run.path} --max-tokens N` (a larger N)"
                )
            return summary

    def _train_epoch(self, stop: StopRequest, budget: TimeBudget) -> None:
        """The windows of the current epoch from ``progress.window`` on; raises ``Interrupted`` or
        ``OutOfTime`` to stop at the end of an update."""
        config, progress, run = self.config, self.progress, self.run
        if progress.window == 0 or self.state is None:
            self.state = self.model.initial_state(self.train_streams.rows, device=self.device)
        self.model.train()
        bar = reporting.EpochBar(
            len(self.train_streams), progress.window, progress.epoch + 1, config.epochs, show=self.world.is_main
        )
        epoch_clock, seconds_before = time.monotonic(), progress.train_seconds
        saves = SaveSchedule(config.save_interval)
        try:
            windows = self.train_streams.windows(progress.window, device=self.device)
            for group in update_groups(windows, config.accumulate):  # one update each
                try:
                    result = self.step(group, self.state, stop, budget)
                except LossNotFinite as error:
                    self._diverged(error.value)
                self.state = result.state
                if not self._fast_path_reported and getattr(self.step.forward, "settled", True):
                    reporting.report_fast_path(
                        run, self.step.forward, self.provenance
                    )  # once compiled or captured, or not
                    if hasattr(self.step.forward, "probe_seconds"):  # --compile: its probe ran before training
                        progress.add_wall("compile", self.step.forward.probe_seconds)
                    self._fast_path_reported = True
                progress.window = group[-1].index + 1
                progress.step += 1
                progress.train_nats += result.loss * result.tokens
                progress.train_tokens += result.tokens
                progress.tokens_seen += result.tokens
                progress.train_seconds = seconds_before + time.monotonic() - epoch_clock
                if all(math.isfinite(norm) for norm in result.grad_norms.values()):
                    for name, norm in result.grad_norms.items():
                        progress.grad_norm_sums[name] = progress.grad_norm_sums.get(name, 0.0) + norm
                else:  # an overflow the fp16 scaler skipped: it has no place in the epoch's mean
                    progress.overflowed_steps += 1
                bar.advance(len(group))
                bpc = result.loss / LN2 / self.train_chars_per_token
                running = progress.train_nats / max(progress.train_tokens, 1) / LN2 / self.train_chars_per_token
                speed = progress.train_tokens / max(progress.train_seconds, 1e-9)
                bar.show_step(running, speed, self.last_valid_bpc)
                if progress.step % config.log_every == 0:
                    run.record(
                        "step",
                        epoch=progress.epoch + 1,
                        step=progress.step,
                        loss=result.loss,
                        bpc=bpc,
                        lr=self.lr,
                        grad_norm=result.grad_norms,
                    )
                if config.print_every and progress.step % config.print_every == 0 and self.world.is_main:
                    bar.write(
                        run.log,
                        reporting.step_line(
                            progress.epoch + 1,
                            progress.step,
                            progress.window,
                            len(self.train_streams),
                            result.loss,
                            bpc,
                            self.lr,
                            speed,
                        ),
                    )
                self.scheduler.after_step()  # the step record above has the rate the step trained with
                if config.eval_every and progress.step % config.eval_every == 0:
                    valid = self.scorer("valid")
                    self.last_valid_bpc = valid.bpc
                    self.model.train()
                    run.record(
                        "valid",
                        epoch=progress.epoch + 1,
                        step=progress.step,
                        **valid.as_dict("valid_"),
                        **self._valid_fraction(),
                    )
                if result.stop_requested:
                    raise Interrupted
                if self.world.any(saves.due(progress.step)):
                    # the record before its commit: a kill between them is superseded by the resume
                    run.record("checkpoint", epoch=progress.epoch + 1, window=progress.window, step=progress.step)
                    run.save_last(self.checkpoint())
                    saves.saved()
                bar.status_line(progress.window, running, speed, self.last_valid_bpc)
                if result.out_of_time:
                    raise OutOfTime
                if self._tokens_used_up() and progress.window < len(self.train_streams):
                    raise OutOfTokens  # inside the epoch (at its end, the epoch ends as any other)
        finally:
            bar.close()

    def _valid_fraction(self) -> dict:
        """``valid_fraction`` for the records, where validation scored part of the split."""
        return {"valid_fraction": self.config.eval_fraction} if self.config.eval_fraction < 1.0 else {}

    def _tokens_used_up(self) -> bool:
        return tokens_used_up(self.progress, self.config)

    def _end_epoch(self, partial: bool) -> bool:
        """Evaluate, record, checkpoint. Returns True when early stopping ends training."""
        config, progress, run = self.config, self.progress, self.run
        valid = self.scorer("valid")
        self.last_valid_bpc = valid.bpc
        test = self.scorer("test") if config.test_every_epoch else None
        if not math.isfinite(valid.loss):
            self._diverged(valid.loss)
        epoch_number = progress.epoch + 1
        improved = valid.bpc < progress.best_valid_bpc
        if improved:
            progress.best_valid_bpc, progress.best_epoch = valid.bpc, epoch_number
            progress.best_test_bpc = None if test is None else test.bpc
            progress.epochs_without_improvement = 0
        else:
            progress.epochs_without_improvement += 1
        record = reporting.epoch_record(
            progress, valid, test, self.lr, self.train_chars_per_token, partial, improved, config.accumulate
        )
        record.update(self._valid_fraction())
        run.record("epoch", **record)
        run.log(reporting.epoch_line(record))
        if not partial:
            progress.epoch += 1
            progress.window = 0
            progress.add_wall("train", progress.train_seconds)
            progress.train_nats, progress.train_tokens, progress.train_seconds = 0.0, 0, 0.0
            progress.grad_norm_sums, progress.overflowed_steps = {}, 0
            self.state = None
            self.scheduler.after_epoch(valid.loss)
        stop_early = progress.epochs_without_improvement >= config.patience
        if stop_early:
            progress.finished = True
        scores = {"valid_bpc": valid.bpc, "epoch": epoch_number}
        if test is not None:
            scores.update(test_bpc=test.bpc, test_loss=test.loss)
        checkpoint = self.checkpoint(scores)
        # One commit point, last.pt: the epoch record (above) and the epoch checkpoint come before it
        # (a resume trains the epoch again and supersedes them), best.pt after it (a resume restores
        # it from last.pt: ``resume.restore_best``). best.pt and epoch checkpoints keep no optimizer state.
        if not partial and self.world.is_main:
            name = epoch_checkpoint_name(epoch_number, valid.bpc, valid.perplexity, self.corpus.unit)
            save_epoch_checkpoint(run.path, checkpoint, epoch_number, name, config.keep_checkpoints)
        run.save_last(checkpoint)
        if improved and self.world.is_main:
            checkpoint.without_optimizer().save(run.best)
        if stop_early:
            run.log(f"no improvement for {config.patience} epochs: stopping early")
        return stop_early

    # --- how a training ends ---------------------------------------------------------------------------
    def _stop_interrupted(self) -> None:
        progress, run = self.progress, self.run
        run.save_last(self.checkpoint())
        run.record("interrupted", epoch=progress.epoch + 1, window=progress.window, step=progress.step)
        raise TrainingInterrupted(
            f"interrupted: saved {run.last} at epoch {progress.epoch + 1}, step "
            f"{progress.step}; continue with `charlm train --resume {run.path}`"
        )

    def _diverged(self, value: float) -> None:
        """Record the divergence, give the best weights before it their test score, and stop."""
        kept = self.run.last if self.run.last.exists() else None
        where = f"kept the last good checkpoint {kept}" if kept else "no checkpoint had been saved yet"
        self.run.record("diverged", epoch=self.progress.epoch + 1, step=self.progress.step + 1, loss=value)
        self.scorer.test_best(self.run)
        raise TrainingDiverged(
            f"training stopped: loss became {value} at epoch {self.progress.epoch + 1}, "
            f"step {self.progress.step + 1}; {where}"
        )

    def _complete(self, why: str | None = None) -> dict:
        """A run that has ended (``why``: how, when not by its epochs or early stopping): finish what
        a stop during its last steps left undone (the test score, the ``end`` record), then say so."""
        run = self.run
        if self.progress.best_test_bpc is None and run.best.exists():
            self.scorer.test_best(self.run)
            run.save_last(self.checkpoint())
        if not run.history().ended:
            run.record("end", **self.summary())
        if why:
            run.log(f"run {run.path} has nothing left to train: {why}")
            return self.summary()
        run.log(
            f"run {run.path} is already complete ({self.progress.epoch} "
            f"epoch{'s' if self.progress.epoch != 1 else ''}); pass a larger --epochs to go on"
        )
        return self.summary()


def tokens_used_up(progress: Progress, config: TrainConfig) -> bool:
    """Whether the run has trained on its whole ``--max-tokens`` budget."""
    return config.max_tokens is not None and progress.tokens_seen >= config.max_tokens


def _check_tokens_left(progress: Progress, config: TrainConfig) -> None:
    """Refuse to go on with a run that has trained on its whole ``--max-tokens`` budget already."""
    if tokens_used_up(progress, config):
        raise CharlmError(
            f"the run has already trained on {progress.tokens_seen:,} tokens, its --max-tokens budget of "
            f"{config.max_tokens:,}: give a larger --max-tokens to go on"
        )
