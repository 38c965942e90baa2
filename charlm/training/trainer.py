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

``Trainer`` is the loop and its decisions, read top to bottom: the setup steps, then ``fit``: epochs
in a loop, each returning why it stopped training if it did (a ``control.StopReason``), and the end
that the session's ``control.Stop`` calls for. The parts it is built from are made in ``setup``, one
optimization step is ``step.TrainingStep``, stopping is ``control``, scoring ``evaluation``, what it
shows and records ``recording.Reporter``.
"""

from __future__ import annotations

import math
import time

import torch

from charlm.checkpoint import Checkpoint
from charlm.config import TrainConfig
from charlm.corpora import catalog
from charlm.files import path_value
from charlm.inference import scoring
from charlm.model import LanguageModel
from charlm.runs import provenance, retention
from charlm.runs.directory import FollowerRun, Run, default_run_dir
from charlm.runtime import distributed, precision, seeds
from charlm.training import control, evaluation, recording, reporting, resume, run_inputs, setup, step, windows
from charlm.training.control import ProcessLost, Stop, StopReason, StorageError, TrainingDiverged, TrainingInterrupted
from charlm.training.resume import Progress

__all__ = ["Trainer", "TrainingDiverged", "TrainingInterrupted", "ProcessLost", "StorageError", "Progress"]


class Trainer:
    """Trains one model under ``config`` into a run directory (``charlm.runs.directory.Run``).

    ``Trainer(config)`` starts a new run; ``Trainer.resume(run_dir)`` continues one.
    """

    def __init__(self, config: TrainConfig, *, cells=(), trust_code: bool = False):
        self._set_up(config, cells, trust_code)

    @classmethod
    def resume(cls, run_dir, *, cells=(), trust_code: bool = False, **changes) -> "Trainer":
        """A trainer that continues the run in ``run_dir`` from its last checkpoint. ``changes`` may
        set only the settings that do not define the run (``RESUMABLE_SETTINGS``: epochs,
        max_minutes, device, ...)."""
        resume.check_resumable(changes)
        run_dir = path_value(run_dir, "run_dir")
        run = Run.resume(run_dir) if distributed.environment_rank() == 0 else FollowerRun(run_dir)
        try:
            checkpoint = resume.last_good_checkpoint(run)
            if checkpoint is not None:
                resume.check_same_run(run, checkpoint)
            trainer = cls.__new__(cls)
            trainer._set_up(resume.resumed_config(run, checkpoint, changes), cells, trust_code, run, checkpoint)
            return trainer
        except BaseException:
            run.release()
            raise

    # --- setup -----------------------------------------------------------------------------------------
    def _set_up(
        self, config: TrainConfig, cells, trust_code: bool, resumed_run: Run | None = None, checkpoint=None
    ) -> None:
        """The setup steps of a new run, or of ``resumed_run`` from its ``checkpoint`` (None: it was
        stopped before its first checkpoint and starts again)."""
        self.config = setup.checked_settings(config)
        cell_class = setup.cell_class_for(config, resumed_run, checkpoint, cells, trust_code)
        if checkpoint is not None:  # before anything is built or written
            setup.check_checkpoint(checkpoint, cell_class, config)
        self.device, self.world = setup.placement(config)
        self._setup_data(checkpoint)
        self._setup_model(cell_class, checkpoint)
        self._setup_optimizer()
        self._setup_run_directory(resumed_run, checkpoint)
        self._setup_reporting()

    def _setup_data(self, checkpoint: Checkpoint | None) -> None:
        """The corpus, checked against the checkpoint's vocabulary and the streams the run cuts it into."""
        config = self.config
        run_inputs.check_text_corpus(config)
        if checkpoint is None:
            self.corpus = catalog.load_corpus(config.corpus, config.data_dir)
        else:
            self.corpus = checkpoint.corpus(config.data_dir)
        resume.check_same_vocabulary(checkpoint, self.corpus)
        setup.check_streams(config, self.corpus)
        self.train_chars_per_token = scoring.characters_per_token(self.corpus, "train")

    def _setup_model(self, cell_class, checkpoint: Checkpoint | None) -> None:
        """The model (its size a new run's settings give, or the checkpoint's), seeded, on the device,
        and the forward pass a step calls: the model, or its fast path (``setup.forward_pass``)."""
        config = self.config
        torch.manual_seed(seeds.torch_seed(config.seed))
        if checkpoint is None:
            self.model_config = setup.model_config_for(config, self.corpus.vocab_size, cell_class, self.device)
        else:
            self.model_config = checkpoint.model_config
        setup.check_model_fits(self.model_config, config, self.device, cell_class)
        self.model = LanguageModel(self.model_config, cell_class).to(self.device)
        resume.seed_this_process(config.seed, self.world)
        self.forward, self.fast_path = setup.forward_pass(
            self.model, config, self.device, self.world
        )  # fast path or None
        self.layout = setup.training_windows(self.corpus, config, self.world)
        self.train_streams = self.layout.epoch(0)  # the current epoch's windows

    def _setup_optimizer(self) -> None:
        """The optimizer, its learning-rate schedule, and the step that updates the model with them."""
        config = self.config
        self.optimizer, self.scheduler = setup.optimizer_and_schedule(
            self.model, config, self.layout.windows_per_epoch(config.epochs)
        )
        self.step = step.TrainingStep(
            self.model,
            self.forward,
            self.optimizer,
            step.gradients_for(precision.grad_scaler(config.precision, self.device)),
            self.world,
            batch_size=config.batch_size,
            clip=config.clip,
            precision=config.precision,
            device=self.device,
            gradient_sync_pause=setup.gradient_sync_pause(self.forward),
            ar=config.ar,
            tar=config.tar,
        )

    def _setup_run_directory(self, resumed_run: Run | None, checkpoint: Checkpoint | None) -> None:
        """The run directory: a resumed run's, with its checkpoint restored (or, stopped before its
        first checkpoint, started again), or a new one; the provenance written into it; where the
        run stands (``progress``) and the carried recurrent state of this process's streams."""
        config = self.config
        self.provenance = provenance.collect(self.device, self.corpus)
        self.progress, self.state = Progress(), None
        if checkpoint is not None:
            self.run = resumed_run
            self.progress, self.state = resume.restore(
                checkpoint, config, self.model, self.optimizer, self.scheduler, self.world, self.device
            )
            self.provenance = {**checkpoint.provenance, "resumed": self.provenance}
            self.run.write_provenance(self.provenance)
        elif resumed_run is not None:  # stopped before its first checkpoint: it starts again
            self.run = resumed_run
            setup.load_initial_weights(self.model, self.model_config, self.corpus, config)
            self.run.write_provenance(self.provenance)
        else:
            setup.load_initial_weights(self.model, self.model_config, self.corpus, config)
            run_dir = self.world.broadcast(config.run_dir or default_run_dir(config.corpus, config.cell))
            if self.world.is_main:
                settings = {"train": config.to_dict(), "model": self.model_config.to_dict()}
                self.run = Run.create(run_dir, settings, self.provenance)
            else:
                self.run = FollowerRun(run_dir)
        if checkpoint is not None and self.world.is_main:
            resume.restore_best(self.run, checkpoint)

    def _setup_reporting(self) -> None:
        """What scores the splits and what records the run as it trains (``fit`` sets the time budget)."""
        self.scorer = evaluation.Scorer(
            self.model, self.corpus, self.config, self.device, self.world, self.run, self.progress, self.provenance
        )
        self.reporter = recording.Reporter(
            self.run,
            self.config,
            self.progress,
            self.provenance,
            self.fast_path,
            self.train_chars_per_token,
            self.world.is_main,
        )
        self._budget = None  # the time budget of the session fit() runs
        self._diverged_loss = None  # the loss that was not finite, once training diverged

    # --- what it is ------------------------------------------------------------------------------------
    @property
    def lr(self) -> float:
        return self.optimizer.param_groups[0]["lr"]

    def checkpoint(self, scores: dict | None = None) -> Checkpoint:
        """The run as it stands, as a checkpoint (weights shared with the live model)."""
        if self._budget is not None:  # the time budget is part of the saved progress
            self.progress.budget_seconds = self._budget.spent()
        return resume.training_checkpoint(
            self.config,
            self.model_config,
            self.model,
            self.optimizer,
            self.scheduler,
            progress=self.progress,
            state=self.state,
            tokenizer=self.corpus.tokenizer,
            provenance=self.provenance,
            world=self.world,
            device=self.device,
            scores=scores,
        )

    def summary(self) -> dict:
        return reporting.summary(self.progress, self.run, self.model, self.model_config)

    # --- the protocol --------------------------------------------------------------------------------
    def fit(self) -> dict:
        """Train until ``epochs``, early stopping or a budget (``max_minutes``, ``max_tokens``);
        returns the summary. Raises ``TrainingInterrupted`` or ``TrainingDiverged`` where training
        ends so. (A used-up ``--max-tokens`` was refused when the trainer was made.)"""
        config, progress = self.config, self.progress
        with control.owning(self.run, self.world):
            if progress.finished and (
                progress.epoch >= config.epochs or progress.epochs_without_improvement >= config.patience
            ):
                return self._complete()
            progress.finished = False
            self._budget = control.TimeBudget(config.max_minutes, progress.budget_seconds)  # the whole run's
            if progress.stopped_by == StopReason.TIME and self._budget.is_up():  # stopped by it before (end unwritten?)
                return self._complete(
                    f"its --max-minutes budget of {config.max_minutes:g} min is used up; pass a larger "
                    "--max-minutes to go on"
                )
            self.run.mark_running()
            self.reporter.start(
                self.model_config, self.model, self.device, self.train_streams.tokens_scored, self._budget
            )
            self._note_stop(None)
            with control.StopRequest() as request:
                stop = self._train(request)
                if stop.failed:
                    self._fail(stop.reason)
            return self._finish(stop)

    def _train(self, request: control.StopRequest) -> Stop:
        """The epochs left, each to its end unless it stops training: returns why training stopped,
        and the budget that left the run unfinished, if one did."""
        while self.progress.epoch < self.config.epochs:
            cut = self._train_epoch(request)
            if cut in (StopReason.INTERRUPTED, StopReason.DIVERGED):
                return Stop(cut)
            self._note_stop(cut)  # saved with the partial epoch: a resume knows why it stopped
            why = self._end_epoch(partial=cut is not None)
            if why is StopReason.DIVERGED:
                return Stop(why)
            if why is StopReason.PATIENCE:
                return Stop(why, cut)
            if cut is None and self._tokens_used_up():  # the budget ended with the epoch
                cut = StopReason.TOKENS
            if cut is not None:
                return Stop(cut, cut)
        return Stop(StopReason.EPOCHS)

    def _note_stop(self, why: StopReason | None) -> None:
        """``progress.stopped_by`` (saved with the checkpoints from now on, and in the summary): why
        this session stopped, the budget that cut an epoch short, or None while it trains."""
        self.progress.stopped_by = None if why is None else why.value

    # --- an epoch --------------------------------------------------------------------------------------
    def _train_epoch(self, request: control.StopRequest) -> StopReason | None:
        """The updates of the current epoch from ``progress.window`` on. Returns why the epoch
        stopped at the end of an update before its own end (interrupted, diverged, out of time or
        tokens), or None where it ran to its end."""
        config, progress, reporter = self.config, self.progress, self.reporter
        self.train_streams = self.layout.epoch(progress.epoch)
        if progress.window == 0 or self.state is None:
            self.state = self.model.initial_state(self.train_streams.rows, device=self.device)
        self.model.train()
        epoch_clock, seconds_before = time.monotonic(), progress.train_seconds
        saves = control.SaveSchedule(config.save_interval)
        updates = step.update_groups(self.train_streams.windows(progress.window, device=self.device), config.accumulate)
        with reporter.epoch(len(self.train_streams)):
            for group in updates:  # one update each
                with windows.scaled_learning_rate(self.optimizer, self.layout.learning_rate_factor(group)):
                    result = self.step(group, self.state, request, self._budget)
                if result.diverged:
                    self._diverged_loss = result.loss
                    return StopReason.DIVERGED
                self.state = result.state
                progress.add_update(group[-1].index + 1, result, seconds_before + time.monotonic() - epoch_clock)
                reporter.after_step(result, len(group), self.lr)
                self.scheduler.after_step()  # the step record above has the rate the step trained with
                if config.eval_every and progress.step % config.eval_every == 0:
                    reporter.valid(self.scorer("valid"))
                    self.model.train()
                if result.stop_requested:
                    return StopReason.INTERRUPTED
                if self.world.any(saves.due(progress.step)):
                    self._save_within_epoch()
                    saves.saved()
                reporter.status()
                if result.out_of_time:
                    return StopReason.TIME
                if self._tokens_used_up() and progress.window < len(self.train_streams):
                    return StopReason.TOKENS  # inside the epoch (at its end, the epoch ends as any other)
            return None

    def _save_within_epoch(self) -> None:
        """``--save-every``: last.pt, the ``checkpoint`` record before its commit (a kill between them
        is superseded by the resume)."""
        progress = self.progress
        self.run.record("checkpoint", epoch=progress.epoch + 1, window=progress.window, step=progress.step)
        self.run.save_last(self.checkpoint())

    def _tokens_used_up(self) -> bool:
        return control.tokens_used_up(self.progress.tokens_seen, self.config.max_tokens)

    def _end_epoch(self, partial: bool) -> StopReason | None:
        """Evaluate, record, checkpoint. Returns why training stops after this epoch, if it does:
        early stopping (the run marked finished), or a validation loss that is not finite (diverged,
        before anything is recorded)."""
        config, progress = self.config, self.progress
        valid = self.scorer("valid")
        test = self.scorer("test") if config.test_every_epoch else None
        if not math.isfinite(valid.loss):
            self._diverged_loss = valid.loss
            return StopReason.DIVERGED
        epoch_number = progress.epoch + 1
        improved = progress.add_validation(epoch_number, valid.bpc, None if test is None else test.bpc)
        self.reporter.end_epoch(valid, test, self.lr, partial, improved)
        if not partial:
            progress.next_epoch()
            self.state = None
            self.scheduler.after_epoch(valid.loss)
        stop_early = progress.epochs_without_improvement >= config.patience
        if stop_early:
            progress.finished = True
        scores = {"valid_bpc": valid.bpc, "epoch": epoch_number}
        if test is not None:
            scores.update(test_bpc=test.bpc, test_loss=test.loss)
        name = (
            None
            if partial
            else retention.epoch_checkpoint_name(epoch_number, valid.bpc, valid.perplexity, self.corpus.unit)
        )
        retention.save_epoch_end(
            self.run,
            self.checkpoint(scores),
            name,
            improved=improved,
            keep=config.keep_checkpoints,
            is_main=self.world.is_main,
        )
        if not stop_early:
            return None
        self.run.log(f"no improvement for {config.patience} epochs: stopping early")
        return StopReason.PATIENCE

    # --- how a training ends ---------------------------------------------------------------------------
    def _finish(self, stop: Stop) -> dict:
        """A session that stopped with a summary: the test score of the best weights, the last
        checkpoint, the ``end`` record; where a budget cut it short, how to go on."""
        run = self.run
        self._note_stop(stop.reason)
        self.progress.finished = stop.budget is None
        self.scorer.test_best()
        run.save_last(self.checkpoint())
        summary = self.summary()
        run.record("end", **summary)
        self.reporter.budget_cut(stop.budget)
        return summary

    def _fail(self, why: StopReason) -> None:
        """A session that stopped with an error: interrupted (saved, resumable) or diverged (the best
        weights before it given their test score); recorded, then raised."""
        progress, run = self.progress, self.run
        if why is StopReason.INTERRUPTED:
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
        self.scorer.test_best()
        raise TrainingDiverged(
            f"training stopped: loss became {value} at epoch {progress.epoch + 1}, step {progress.step + 1}; {where}"
        )

    def _complete(self, why: str | None = None) -> dict:
        """A run that has ended (``why``: how, when not by its epochs or early stopping): finish what
        a stop during its last steps left undone (the test score, the ``end`` record), then say so."""
        run = self.run
        if self.progress.best_test_bpc is None and run.best.exists():
            self.scorer.test_best()
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
