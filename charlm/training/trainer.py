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

``Trainer`` is the loop and its decisions, read top to bottom: the constructor's setup steps, then
``fit``: epochs in a loop, each returning why it stopped training if it did (a ``control.Stop``),
and the end that stop calls for. The parts it is built from are made in ``setup``, one optimization
step is ``step.TrainingStep``, stopping is ``control``, what it shows and records is ``reporting`` and
``recording``.
"""

from __future__ import annotations

import math
import time

import torch

from charlm.runtime.seeds import torch_seed
from charlm.checkpoint import Checkpoint
from charlm.config import TrainConfig
from charlm.corpora import load_corpus
from charlm.files import path_value
from charlm.inference.scoring import characters_per_token
from charlm.model import LanguageModel
from charlm.runs import provenance
from charlm.runs.directory import FollowerRun, Run, default_run_dir
from charlm.runs.retention import epoch_checkpoint_name, save_epoch_checkpoint
from charlm.runtime.distributed import environment_rank
from charlm.runtime.precision import grad_scaler
from charlm.training import recording, reporting
from charlm.training.control import (
    ProcessLost,
    SaveSchedule,
    Stop,
    StopRequest,
    StorageError,
    TimeBudget,
    TrainingDiverged,
    TrainingInterrupted,
    owning,
    tokens_used_up,
)
from charlm.training.evaluation import Scorer
from charlm.training.resume import (
    Progress,
    check_resumable,
    check_same_run,
    check_same_vocabulary,
    last_good_checkpoint,
    restore,
    restore_best,
    resumed_config,
    seed_this_process,
    training_checkpoint,
)
from charlm.training.setup import (
    cell_class_for,
    check_checkpoint,
    check_streams,
    checked_settings,
    check_model_fits,
    forward_pass,
    gradient_sync_pause,
    load_initial_weights,
    model_config_for,
    optimizer_and_schedule,
    placement,
    training_windows,
)
from charlm.training.step import StepResult, TrainingStep, gradients_for, update_groups
from charlm.training.text_input import check_text_corpus
from charlm.training.windows import scaled_learning_rate

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
        self.config = checked_settings(config)
        resumed_run, checkpoint = _resume_from or (None, None)
        cell_class = cell_class_for(config, resumed_run, checkpoint, cells, trust_code)
        if checkpoint is not None:  # before anything is built or written
            check_checkpoint(checkpoint, cell_class, config)
        self.device, self.world = placement(config)
        self._setup_data(checkpoint)
        self._setup_model(cell_class, checkpoint)
        self._setup_optimizer()
        self._setup_progress()
        self._setup_run_directory(resumed_run, checkpoint)

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

    # --- setup -----------------------------------------------------------------------------------------
    def _setup_data(self, checkpoint: Checkpoint | None) -> None:
        """The corpus, checked against the checkpoint's vocabulary and the streams the run cuts it into."""
        config = self.config
        check_text_corpus(config)
        self.corpus = (
            load_corpus(config.corpus, config.data_dir) if checkpoint is None else checkpoint.corpus(config.data_dir)
        )
        check_same_vocabulary(checkpoint, self.corpus)
        check_streams(config, self.corpus)
        self.train_chars_per_token = characters_per_token(self.corpus, "train")

    def _setup_model(self, cell_class, checkpoint: Checkpoint | None) -> None:
        """The model (its size a new run's settings give, or the checkpoint's), seeded, on the device,
        and the forward pass a step calls: the model, or its fast path (``setup.forward_pass``)."""
        config = self.config
        torch.manual_seed(torch_seed(config.seed))
        if checkpoint is None:
            self.model_config = model_config_for(config, self.corpus.vocab_size, cell_class, self.device)
        else:
            self.model_config = checkpoint.model_config
        check_model_fits(self.model_config, config, self.device, cell_class)
        self.model = LanguageModel(self.model_config, cell_class).to(self.device)
        seed_this_process(config.seed, self.world)
        self.forward, fast_path = forward_pass(self.model, config, self.device, self.world)
        self.fast_path = reporting.FastPathReport(fast_path)  # reported once, when the first steps settle it
        self.layout = training_windows(self.corpus, config, self.world)
        self.train_streams = self.layout.epoch(0)  # the current epoch's windows

    def _setup_optimizer(self) -> None:
        """The optimizer, its learning-rate schedule, and the step that updates the model with them."""
        config = self.config
        self.optimizer, self.scheduler = optimizer_and_schedule(
            self.model, config, self.layout.windows_per_epoch(config.epochs)
        )
        self.step = TrainingStep(
            self.model,
            self.forward,
            self.optimizer,
            gradients_for(grad_scaler(config.precision, self.device)),
            self.world,
            batch_size=config.batch_size,
            clip=config.clip,
            precision=config.precision,
            device=self.device,
            gradient_sync_pause=gradient_sync_pause(self.forward),
            ar=config.ar,
            tar=config.tar,
        )

    def _setup_progress(self) -> None:
        """Where a new run stands (a resumed one's is restored with its run directory), and its scorer."""
        self.progress = Progress()
        self.state = None  # the carried recurrent state of this process's streams
        self.scorer = Scorer(self)
        self.last_valid_bpc = None  # the last validation score of this session, for the progress bar
        self._budget = None  # the time budget of the session fit() runs
        self._diverged_loss = None  # the loss that was not finite, once training diverged

    def _setup_run_directory(self, resumed_run: Run | None, checkpoint: Checkpoint | None) -> None:
        """The run directory: a resumed run's, with its checkpoint restored (or, stopped before its
        first checkpoint, started again), or a new one; the provenance written into it."""
        config = self.config
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
        if checkpoint is not None and self.world.is_main:
            restore_best(self.run, checkpoint)

    # --- what it is ------------------------------------------------------------------------------------
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
        """Train until ``epochs``, early stopping or a budget (``max_minutes``, ``max_tokens``);
        returns the summary. Raises ``TrainingInterrupted`` or ``TrainingDiverged`` where training
        ends so. (A used-up ``--max-tokens`` was refused when the trainer was made.)"""
        config, progress = self.config, self.progress
        with owning(self.run, self.world):
            if progress.finished and (
                progress.epoch >= config.epochs or progress.epochs_without_improvement >= config.patience
            ):
                return self._complete()
            progress.finished = False
            self._budget = TimeBudget(config.max_minutes, progress.budget_seconds)  # the run's, not the session's
            if progress.stopped_by == Stop.TIME and self._budget.is_up():  # stopped by it before (its end unwritten?)
                return self._complete(
                    f"its --max-minutes budget of {config.max_minutes:g} min is used up; pass a larger "
                    "--max-minutes to go on"
                )
            self._start_session()
            with StopRequest() as stop:
                why, cut = self._train(stop)
                if why in (Stop.INTERRUPTED, Stop.DIVERGED):
                    self._fail(why)
            return self._finish(why, cut)

    def _train(self, stop: StopRequest) -> tuple[Stop, Stop | None]:
        """The epochs left, each to its end unless it stops training: returns why training stopped,
        and the budget that cut its last epoch short (None where none did)."""
        while self.progress.epoch < self.config.epochs:
            cut = self._train_epoch(stop)
            if cut in (Stop.INTERRUPTED, Stop.DIVERGED):
                return cut, None
            self._note_stop(cut)  # saved with the partial epoch: a resume knows why it stopped
            why = self._end_epoch(partial=cut is not None)
            if why is Stop.DIVERGED:
                return why, None
            if why is Stop.PATIENCE:
                return why, cut
            if cut is None and self._tokens_used_up():  # the budget ended with the epoch
                return Stop.TOKENS, Stop.TOKENS
            if cut is not None:
                return cut, cut
        return Stop.EPOCHS, None

    def _start_session(self) -> None:
        """This session's sinks, the run marked running, the lines and the ``start`` record that say
        what trains and from where."""
        config, progress, run = self.config, self.progress, self.run
        recording.add_sinks(run, config, self.model_config, progress, self.world.is_main)
        run.mark_running()
        self.estimate = reporting.StartEstimate(config, self.train_streams.tokens_scored, self._budget)
        recording.record_start(run, config, self.model_config, self.model, self.device, progress)
        self._note_stop(None)

    def _note_stop(self, why: Stop | None) -> None:
        """``progress.stopped_by`` (saved with the checkpoints from now on, and in the summary): why
        this session stopped, the budget that cut an epoch short, or None while it trains."""
        self.progress.stopped_by = None if why is None else why.value

    # --- an epoch --------------------------------------------------------------------------------------
    def _train_epoch(self, stop: StopRequest) -> Stop | None:
        """The updates of the current epoch from ``progress.window`` on. Returns why the epoch
        stopped at the end of an update before its own end (interrupted, diverged, out of time or
        tokens), or None where it ran to its end."""
        config, progress = self.config, self.progress
        self.train_streams = self.layout.epoch(progress.epoch)
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
                with scaled_learning_rate(self.optimizer, self.layout.learning_rate_factor(group)):
                    result = self.step(group, self.state, stop, self._budget)
                if result.diverged:
                    self._diverged_loss = result.loss
                    return Stop.DIVERGED
                self.state = result.state
                self.fast_path.after_step(self.run, self.provenance, progress)  # once compiled or captured, or not
                self._count(group, result, seconds_before + time.monotonic() - epoch_clock)
                self.estimate.after_step(progress, lambda line: bar.write(self.run.log, line))
                bar.advance(len(group))
                bar.show_step(self._running_bpc(), recording.speed(progress), self.last_valid_bpc)
                recording.report_step(
                    self.run,
                    config,
                    progress,
                    result,
                    bar,
                    self.lr,
                    self.train_chars_per_token,
                    len(self.train_streams),
                    self.world.is_main,
                )
                self.scheduler.after_step()  # the step record above has the rate the step trained with
                if config.eval_every and progress.step % config.eval_every == 0:
                    self._validate_within_epoch()
                if result.stop_requested:
                    return Stop.INTERRUPTED
                if self.world.any(saves.due(progress.step)):
                    self._save_within_epoch()
                    saves.saved()
                bar.status_line(progress.window, self._running_bpc(), recording.speed(progress), self.last_valid_bpc)
                if result.out_of_time:
                    return Stop.TIME
                if self._tokens_used_up() and progress.window < len(self.train_streams):
                    return Stop.TOKENS  # inside the epoch (at its end, the epoch ends as any other)
            return None
        finally:
            bar.close()

    def _count(self, group: list, result: StepResult, train_seconds: float) -> None:
        """An update into the progress: its position, its loss, tokens and gradient norms, the time."""
        progress = self.progress
        progress.window = group[-1].index + 1
        progress.step += 1
        progress.train_nats += result.loss * result.tokens
        progress.train_tokens += result.tokens
        progress.tokens_seen += result.tokens
        progress.train_seconds = train_seconds
        if all(math.isfinite(norm) for norm in result.grad_norms.values()):
            for name, norm in result.grad_norms.items():
                progress.grad_norm_sums[name] = progress.grad_norm_sums.get(name, 0.0) + norm
        else:  # an overflow the fp16 scaler skipped: it has no place in the epoch's mean
            progress.overflowed_steps += 1

    def _running_bpc(self) -> float:
        return recording.running_bpc(self.progress, self.train_chars_per_token)

    def _validate_within_epoch(self) -> None:
        """``--eval-every``: a ``valid`` record with the current weights."""
        valid = self.scorer("valid")
        self.last_valid_bpc = valid.bpc
        self.model.train()
        recording.record_valid(self.run, self.config, self.progress, valid)

    def _save_within_epoch(self) -> None:
        """``--save-every``: last.pt, the ``checkpoint`` record before its commit (a kill between them
        is superseded by the resume)."""
        progress = self.progress
        self.run.record("checkpoint", epoch=progress.epoch + 1, window=progress.window, step=progress.step)
        self.run.save_last(self.checkpoint())

    def _tokens_used_up(self) -> bool:
        return tokens_used_up(self.progress.tokens_seen, self.config.max_tokens)

    def _end_epoch(self, partial: bool) -> Stop | None:
        """Evaluate, record, checkpoint. Returns why training stops after this epoch, if it does:
        early stopping (the run marked finished), or a validation loss that is not finite (diverged,
        before anything is recorded)."""
        config, progress, run = self.config, self.progress, self.run
        valid = self.scorer("valid")
        self.last_valid_bpc = valid.bpc
        test = self.scorer("test") if config.test_every_epoch else None
        if not math.isfinite(valid.loss):
            self._diverged_loss = valid.loss
            return Stop.DIVERGED
        epoch_number = progress.epoch + 1
        improved = valid.bpc < progress.best_valid_bpc
        if improved:
            progress.best_valid_bpc, progress.best_epoch = valid.bpc, epoch_number
            progress.best_test_bpc = None if test is None else test.bpc
            progress.epochs_without_improvement = 0
        else:
            progress.epochs_without_improvement += 1
        recording.record_epoch(
            run, config, progress, valid, test, self.lr, self.train_chars_per_token, partial, improved
        )
        if not partial:
            self._next_epoch(valid.loss)
        stop_early = progress.epochs_without_improvement >= config.patience
        if stop_early:
            progress.finished = True
        self._save_epoch(epoch_number, valid, test, improved, partial)
        if not stop_early:
            return None
        run.log(f"no improvement for {config.patience} epochs: stopping early")
        return Stop.PATIENCE

    def _next_epoch(self, valid_loss: float) -> None:
        """Past a whole epoch: its sums cleared, its time in the run's account, the schedule's epoch step."""
        progress = self.progress
        progress.epoch += 1
        progress.window = 0
        progress.add_wall("train", progress.train_seconds)
        progress.train_nats, progress.train_tokens, progress.train_seconds = 0.0, 0, 0.0
        progress.grad_norm_sums, progress.overflowed_steps = {}, 0
        self.state = None
        self.scheduler.after_epoch(valid_loss)

    def _save_epoch(self, epoch_number: int, valid, test, improved: bool, partial: bool) -> None:
        """The epoch's checkpoints. One commit point, last.pt: the epoch record and the epoch
        checkpoint come before it (a resume trains the epoch again and supersedes them), best.pt
        after it (a resume restores it from last.pt: ``resume.restore_best``). best.pt and epoch
        checkpoints keep no optimizer state."""
        run = self.run
        scores = {"valid_bpc": valid.bpc, "epoch": epoch_number}
        if test is not None:
            scores.update(test_bpc=test.bpc, test_loss=test.loss)
        checkpoint = self.checkpoint(scores)
        if not partial and self.world.is_main:
            name = epoch_checkpoint_name(epoch_number, valid.bpc, valid.perplexity, self.corpus.unit)
            save_epoch_checkpoint(run.path, checkpoint, epoch_number, name, self.config.keep_checkpoints)
        run.save_last(checkpoint)
        if improved and self.world.is_main:
            checkpoint.without_optimizer().save(run.best)

    # --- how a training ends ---------------------------------------------------------------------------
    def _finish(self, why: Stop, cut: Stop | None) -> dict:
        """A session that stopped with a summary (``why``): the test score of the best weights, the
        last checkpoint, the ``end`` record; where a budget cut it short (``cut``), how to go on."""
        config, progress, run = self.config, self.progress, self.run
        self._note_stop(why)
        progress.finished = cut is None
        self.scorer.test_best(run)
        run.save_last(self.checkpoint())
        summary = self.summary()
        run.record("end", **summary)
        recording.log_budget_cut(run, config, progress, cut)
        return summary

    def _fail(self, why: Stop) -> None:
        """A session that stopped with an error: interrupted (saved, resumable) or diverged (the best
        weights before it given their test score); recorded, then raised."""
        progress, run = self.progress, self.run
        if why is Stop.INTERRUPTED:
            run.save_last(self.checkpoint())
            run.record("interrupted", epoch=progress.epoch + 1, window=progress.window, step=progress.step)
            raise TrainingInterrupted(
                f"interrupted: saved {run.last} at epoch {progress.epoch + 1}, step "
                f"{progress.step}; continue with `charlm train --resume {run.path}`"
            )
        value = self._diverged_loss
        kept = run.last if run.last.exists() else None
        where = f"kept the last good checkpoint {kept}" if kept else "no checkpoint had been saved yet"
        run.record("diverged", epoch=progress.epoch + 1, step=progress.step + 1, loss=value)
        self.scorer.test_best(run)
        raise TrainingDiverged(
            f"training stopped: loss became {value} at epoch {progress.epoch + 1}, step {progress.step + 1}; {where}"
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
