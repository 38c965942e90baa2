"""What the training loop records as it goes, through a :class:`Reporter`: the sinks a session opens,
the ``start`` record and its lines, the estimate, the fast path's report, the epoch's progress bar,
the ``step`` records and ``--print-every`` lines, the ``valid`` records of ``--eval-every``, the
``epoch`` record and line, the lines that say how to go on after a budget. The figures these take
(running bpc, speed, position) are read from ``Progress``. (How they are shown and formatted is
``reporting``.)"""

from __future__ import annotations

import contextlib

from charlm.inference.scoring import LN2
from charlm.model import count_parameters
from charlm.runs.tensorboard import TensorBoardSink
from charlm.runs.wandb_sink import WandbSink
from charlm.training import reporting
from charlm.training.control import StopReason


def running_bpc(progress, chars_per_token: float) -> float:
    """The epoch's train bpc so far."""
    return progress.train_nats / max(progress.train_tokens, 1) / LN2 / chars_per_token


def speed(progress) -> float:
    """The epoch's training tokens a second so far."""
    return progress.train_tokens / max(progress.train_seconds, 1e-9)


def position(progress) -> dict:
    """How far the run has trained, for the step and valid records: tokens, and training seconds
    (every session, validation left out)."""
    return {
        "tokens": progress.tokens_seen,
        "seconds": round(progress.wall_seconds.get("train", 0.0) + progress.train_seconds, 3),
    }


def valid_fraction(config) -> dict:
    """``valid_fraction`` for the records, where validation scored part of the split."""
    return {"valid_fraction": config.eval_fraction} if config.eval_fraction < 1.0 else {}


class Reporter:
    """What a trainer shows and records of its ``run`` under ``config`` as ``progress`` moves on:
    ``start`` a session, an ``epoch``'s bar around its updates, ``after_step`` each update, ``status``
    lines, ``valid`` and ``end_epoch`` scores, ``budget_cut``. Only the main process writes (the
    others' run directory records nothing) and draws a bar."""

    def __init__(self, run, config, progress, provenance: dict, fast_path, chars_per_token: float, is_main: bool):
        self.run, self.config, self.progress, self.provenance = run, config, progress, provenance
        self.fast_path = reporting.FastPathReport(fast_path)  # reported once, when the first steps settle it
        self.chars_per_token = chars_per_token  # of the train split
        self.is_main = is_main
        self.last_valid_bpc = None  # the last validation score of this session, for the progress bar
        self.estimate = None  # this session's StartEstimate
        self.bar = None  # the current epoch's EpochBar

    def start(self, model_config, model, device, tokens_per_epoch: int, budget) -> None:
        """A session's start: its TensorBoard and W&B sinks where asked for, the lines and the
        ``start`` record that say what trains and from where, the estimate to come."""
        run, config, progress = self.run, self.config, self.progress
        if config.tensorboard and self.is_main:
            run.sinks.append(TensorBoardSink(run.path / "tensorboard"))
        if config.wandb and self.is_main:
            settings = {"train": config.to_dict(), "model": model_config.to_dict()}
            run.sinks.append(WandbSink(run.path, settings, config.wandb_project, step=progress.step))
        self.estimate = reporting.StartEstimate(config, tokens_per_epoch, budget)
        parameters = count_parameters(model)
        run.log(
            f"training {model_config.cell} ({model_config.layers}×{model_config.hidden_size}, "
            f"{parameters:,} parameters) on {config.corpus} [{device}] → {run.path}"
        )
        if progress.step:
            run.log(reporting.resuming_line(progress))
        run.record(
            "start",
            parameters=parameters,
            hidden_size=model_config.hidden_size,
            device=str(device),
            resumed_at={"epoch": progress.epoch, "window": progress.window, "step": progress.step},
        )

    @contextlib.contextmanager
    def epoch(self, windows: int):
        """The current epoch's bar (of its ``windows``, from ``progress.window`` on) while its updates train."""
        progress = self.progress
        self.bar = reporting.EpochBar(
            windows, progress.window, progress.epoch + 1, self.config.epochs, show=self.is_main
        )
        try:
            yield
        finally:
            self.bar.close()

    def after_step(self, result, windows: int, lr: float) -> None:
        """An update counted into ``progress`` (of ``windows`` windows, ``result`` its step's): the fast
        path's report once it settles, the estimate, the bar, the ``step`` record every ``log_every``
        updates, the ``--print-every`` line."""
        run, config, progress, bar = self.run, self.config, self.progress, self.bar
        self.fast_path.after_step(run, self.provenance, progress)
        self.estimate.after_step(progress, lambda line: bar.write(run.log, line))
        bar.advance(windows)
        bar.show_step(running_bpc(progress, self.chars_per_token), speed(progress), self.last_valid_bpc)
        bpc = result.loss / LN2 / self.chars_per_token
        if progress.step % config.log_every == 0:
            run.record(
                "step",
                epoch=progress.epoch + 1,
                step=progress.step,
                loss=result.loss,
                bpc=bpc,
                lr=lr,
                grad_norm=result.grad_norms,
                **position(progress),
            )
        if config.print_every and progress.step % config.print_every == 0 and self.is_main:
            line = reporting.step_line(
                progress.epoch + 1, progress.step, progress.window, bar.windows, result.loss, bpc, lr, speed(progress)
            )
            bar.write(run.log, line)

    def status(self) -> None:
        """The plain status line, when one is due (where no bar is drawn)."""
        progress = self.progress
        running = running_bpc(progress, self.chars_per_token)
        self.bar.status_line(progress.window, running, speed(progress), self.last_valid_bpc)

    def valid(self, valid) -> None:
        """``--eval-every``: a ``valid`` record of a score with the current weights."""
        progress = self.progress
        self.last_valid_bpc = valid.bpc
        self.run.record(
            "valid",
            epoch=progress.epoch + 1,
            step=progress.step,
            **valid.as_dict("valid_"),
            **valid_fraction(self.config),
            **position(progress),
        )

    def end_epoch(self, valid, test, lr: float, partial: bool, improved: bool) -> None:
        """The ``epoch`` record and its line."""
        self.last_valid_bpc = valid.bpc
        record = reporting.epoch_record(
            self.progress, valid, test, lr, self.chars_per_token, partial, improved, self.config.accumulate
        )
        record.update(valid_fraction(self.config))
        self.run.record("epoch", **record)
        self.run.log(reporting.epoch_line(record))

    def budget_cut(self, budget: StopReason | None) -> None:
        """Where a ``budget`` cut the session short, the line that says so and how to go on."""
        run, config = self.run, self.config
        if budget is StopReason.TIME:
            run.log(
                f"time budget of {config.max_minutes:g} min used up: the run is resumable with "
                f"`charlm train --resume {run.path}`"
            )
        elif budget is StopReason.TOKENS:
            run.log(
                f"token budget of {config.max_tokens:,} used up ({self.progress.tokens_seen:,} tokens): the run is "
                f"resumable with `charlm train --resume {run.path} --max-tokens N` (a larger N)"
            )
