"""What a training shows and records: the progress bar or, where none is drawn, a plain status line
every minute; the ``step``, ``epoch``, ``compile`` and ``cuda_graph`` records; the epoch's log
line; the run's summary."""

from __future__ import annotations

import time
from typing import Protocol

from tqdm import tqdm

from charlm.checkpoint import Checkpoint
from charlm.inference.scoring import LN2
from charlm.logs import get_logger, progress_bar
from charlm.model import count_parameters
from charlm.runtime.fast_path_check import FastPathCheck

STATUS_INTERVAL = 60.0  # seconds between plain status lines when stderr is not a terminal
ESTIMATE_STEPS = 20  # steps a session times (after its first) before it states its estimate
ESTIMATE_SECONDS = 10.0  # ... or seconds of training, whichever come first


class EpochBar:
    """The windows of one epoch: a tqdm bar on a terminal (rank 0 only), else a plain status line
    on the charlm logger every ``STATUS_INTERVAL`` seconds."""

    def __init__(self, windows: int, done: int, epoch: int, epochs: int, show: bool):
        self.windows, self.epoch, self.epochs = windows, epoch, epochs
        self.bar = progress_bar(windows, f"epoch {epoch}/{epochs}", initial=done, show=show)
        self.plain = show and self.bar.disable  # no bar is drawn: not a terminal
        self.reported_at = time.monotonic()

    def advance(self, windows: int = 1) -> None:
        self.bar.update(windows)

    def show_step(self, running_bpc: float, chars_per_second: float, valid_bpc: float | None = None) -> None:
        """The bar's figures: the epoch's running train bpc, the last validation bpc, the speed (short,
        so that they stay whole at 80 columns)."""
        valid = "" if valid_bpc is None else f", valid {valid_bpc:.3f}"
        self.bar.set_postfix_str(
            f"train {running_bpc:.3f}{valid}, {tqdm.format_sizeof(chars_per_second)} chars/s", refresh=False
        )

    def status_line(
        self, window: int, running_bpc: float, chars_per_second: float, valid_bpc: float | None = None
    ) -> None:
        """A plain line for logs and pipes, when one is due."""
        if not self.plain or time.monotonic() - self.reported_at < STATUS_INTERVAL:
            return
        valid = "" if valid_bpc is None else f"  last valid {valid_bpc:.4f} bpc"
        get_logger().info(
            f"epoch {self.epoch}/{self.epochs}  window {window:,}/{self.windows:,} "
            f"({100 * window / self.windows:.0f}%)  train {running_bpc:.4f} bpc (epoch so far){valid}  "
            f"{chars_per_second:,.0f} chars/s"
        )
        self.reported_at = time.monotonic()

    def write(self, log, message: str) -> None:
        """``log(message)`` with the bar cleared first and drawn again after it."""
        with self.bar.external_write_mode():
            log(message)

    def close(self) -> None:
        self.bar.close()


def step_line(
    epoch: int, step: int, window: int, windows: int, loss: float, bpc: float, lr: float, chars_per_second: float
) -> str:
    """``--print-every``'s line: this step's training loss (nats per token) and bpc."""
    return (
        f"step {step:,}  epoch {epoch}  window {window:,}/{windows:,}  loss {loss:.4f}  train {bpc:.4f} bpc  "
        f"lr {lr:.2e}  {chars_per_second:,.0f} chars/s"
    )


def resuming_line(progress) -> str:
    """Where a resumed run goes on from: its position, its tokens so far, its best epoch."""
    best = (
        f"; best valid {progress.best_valid_bpc:.4f} bpc at epoch {progress.best_epoch}" if progress.best_epoch else ""
    )
    return (
        f"resuming at epoch {progress.epoch + 1}, window {progress.window:,}, step {progress.step:,}: "
        f"{progress.tokens_seen:,} tokens trained so far{best}"
    )


def tokens_to_train(epochs: int, tokens_per_epoch: int, max_tokens: int | None) -> int:
    """The tokens a run trains in all: ``epochs`` epochs, or its ``--max-tokens`` where fewer."""
    total = epochs * tokens_per_epoch
    return total if max_tokens is None else min(total, max_tokens)


def duration(seconds: float) -> str:
    """An estimate's length to the precision it has: ``40 s``, ``1 min 30 s``, ``12 min``, ``2 h 10 min``,
    ``130 h``."""
    if seconds < 59.5:
        return f"{max(round(seconds), 1)} s"
    if seconds < 595:  # under ten minutes: to ten seconds
        minutes, tens = divmod(round(seconds / 10), 6)
        return f"{minutes} min" + (f" {tens}0 s" if tens else "")
    minutes = round(seconds / 60)
    if minutes < 60:
        return f"{minutes} min"
    if minutes >= 100 * 60:
        return f"{round(minutes / 60):,} h"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h" + (f" {minutes} min" if minutes else "")


class StartEstimate:
    """`charlm train`'s estimate, stated once a session: the session's first step (compiling,
    capturing, a cold cache) is left out, the next ``ESTIMATE_STEPS`` steps or ``ESTIMATE_SECONDS``
    of training are timed, and the line says how long the tokens left take at that speed (training
    time: validation not counted). Nothing is measured but the run's own steps."""

    def __init__(self, config, tokens_per_epoch: int, budget):
        self.goal = tokens_to_train(config.epochs, tokens_per_epoch, config.max_tokens)
        epochs = f"{config.epochs} epoch" + ("s" if config.epochs != 1 else "")
        self.goal_name = epochs if self.goal == config.epochs * tokens_per_epoch else "its --max-tokens"
        self.budget = budget  # the run's TimeBudget (--max-minutes)
        self.start = None  # (step, tokens seen, training seconds) after the session's first step
        self.stated = False

    def after_step(self, progress, log) -> None:
        """Count an update; once enough are timed, ``log`` the estimate (once a session)."""
        if self.stated:
            return
        seconds = progress.wall_seconds.get("train", 0.0) + progress.train_seconds
        if self.start is None:
            self.start = (progress.step, progress.tokens_seen, seconds)
            return
        first_step, first_tokens, first_seconds = self.start
        steps, elapsed = progress.step - first_step, seconds - first_seconds
        if steps < ESTIMATE_STEPS and elapsed < ESTIMATE_SECONDS:
            return
        self.stated = True
        left = self.goal - progress.tokens_seen
        if left > 0 and elapsed > 0:
            log(self.line(left, (progress.tokens_seen - first_tokens) / elapsed, first_step + 1, progress.step))

    def line(self, left: int, speed: float, first: int, last: int) -> str:
        """``estimate: about 12 min to go for 2 epochs (1,536,000 tokens) at ~2,100 tokens/s, ...``, or
        where ``--max-minutes`` ends the run first, when it does."""
        seconds, measured = left / speed, f"at ~{speed:,.0f} tokens/s, measured on steps {first:,}-{last:,}"
        goal = f"{self.goal_name} ({self.goal:,} tokens)"
        if self.budget.max_minutes is not None:
            budget_left = max(self.budget.max_minutes * 60 - self.budget.spent(), 0.0)
            if budget_left < seconds:
                return (
                    f"estimate: about {duration(budget_left)} to go: --max-minutes {self.budget.max_minutes:g} stops "
                    f"it before its {goal}, which would take about {duration(seconds)} more {measured}"
                )
        return f"estimate: about {duration(seconds)} to go for {goal} {measured} (validation not counted)"


def check_fields(check) -> dict:
    """A first-use check (``charlm.runtime.fast_path_check.FastPathCheck``) as record fields."""
    fields = check.fields()
    return {
        "checked": fields["checked"],
        "max_difference": fields["max_difference"],
        "tolerance": fields["tolerance"],
        "check_seconds": fields["seconds"],
    }


class FastForward(Protocol):
    """A fast training forward pass (``--compile``'s ``CompiledForward``, ``--cuda-graph``'s
    ``GraphedWindow``): the model's forward, compiled or replayed, checked against eager on first
    use and falling back to it where that fails."""

    record: str  # the name of the record its first-use report goes under
    check: FastPathCheck  # its first-use check against eager

    @property
    def active(self) -> bool: ...  # in use (not fallen back to eager)

    @property
    def failure(self) -> str | None: ...  # why it fell back, or None

    @property
    def settled(self) -> bool: ...  # compiled or captured and checked, or fallen back: ``active`` is final

    @property
    def before_training(self) -> dict[str, float]: ...  # the run's wall-clock parts it spent before training

    def report_fields(self) -> dict: ...  # its record's own fields

    def report_line(self) -> str | None: ...  # its log line, if it has one


class FastPathReport:
    """Reports a fast forward pass once, after the first step it has settled in (``None``: there
    is none, nothing to report)."""

    def __init__(self, forward: FastForward | None):
        self.pending = forward

    def after_step(self, run, provenance: dict, progress) -> None:
        """Report the fast path if it has just settled: a log line, a record, the run's provenance,
        and the time it spent before training in the run's wall-clock account."""
        forward = self.pending
        if forward is None or not forward.settled:
            return
        report_fast_path(run, forward, provenance)
        for part, seconds in forward.before_training.items():
            progress.add_wall(part, seconds)
        self.pending = None


def report_fast_path(run, forward: FastForward, provenance: dict) -> None:
    """After the first step under ``--compile`` or ``--cuda-graph``: how long compiling or
    capturing took and what the check against eager found, or that it was not used (a log line,
    a record and the run's provenance)."""
    line = forward.report_line()
    if line:
        run.log(line)
    run.record(forward.record, **forward.report_fields(), **check_fields(forward.check))
    note_in_provenance(run, provenance, forward.check)


def report_scoring_graph(run, provenance: dict, check) -> None:
    """The first scoring graph of a session: a ``fast_path`` record and the run's provenance."""
    run.record("fast_path", path=check.path, active=check.active, failure=check.failure, **check_fields(check))
    note_in_provenance(run, provenance, check)


def note_in_provenance(run, provenance: dict, check) -> None:
    """``fast_paths`` in the run's provenance (provenance.json, and the checkpoints saved from now
    on): each fast path's first-use check in this session."""
    provenance.setdefault("fast_paths", {})[check.path] = check.fields()
    run.write_provenance(provenance)


def epoch_record(
    progress, valid, test, lr: float, chars_per_token: float, partial: bool, improved: bool, accumulate: int = 1
) -> dict:
    """The fields of an ``epoch`` record, from the epoch's sums in ``progress`` (whose updates took
    ``accumulate`` windows each, the last perhaps fewer)."""
    updates = -(-progress.window // accumulate)
    windows = max(updates - progress.overflowed_steps, 1)  # the steps whose gradient norms were summed
    train_loss = progress.train_nats / max(progress.train_tokens, 1)
    return {
        "epoch": progress.epoch + 1,
        "partial": partial,
        "lr": lr,
        "train_loss": train_loss,
        "train_bits": train_loss / LN2,
        "train_bpc": train_loss / LN2 / chars_per_token,
        **valid.as_dict("valid_"),
        **({} if test is None else test.as_dict("test_")),
        "grad_norm": {name: total / windows for name, total in progress.grad_norm_sums.items()},
        "chars_per_second": progress.train_tokens / max(progress.train_seconds, 1e-9),
        "train_seconds": progress.train_seconds,
        "step": progress.step,
        "best": improved,
        "tokens_seen": progress.tokens_seen,
    }


def epoch_line(record: dict) -> str:
    """``epoch   3  train 2.0412  valid 2.1003 bpc  lr 9.00e-04  41,230 chars/s  *best``"""
    test = record.get("test_bpc")
    return (
        f"epoch {record['epoch']:3d}  train {record['train_bpc']:.4f}  valid {record['valid_bpc']:.4f}"
        + ("" if test is None else f"  test {test:.4f}")
        + " bpc"
        f"  lr {record['lr']:.2e}  {record['chars_per_second']:,.0f} chars/s"
        + ("  *best" if record["best"] else "")
        + ("  (partial epoch)" if record["partial"] else "")
    )


def wall_seconds(progress) -> dict:
    """Where the run's time went: training (this epoch's part included), validation, test."""
    wall = dict(progress.wall_seconds)
    wall["train"] = wall.get("train", 0.0) + progress.train_seconds
    parts = ("train", "valid", "test") + (("compile",) if "compile" in wall else ())  # compile: --compile's probe
    return {part: round(wall.get(part, 0.0), 3) for part in parts}


def summary(progress, run, model, model_config) -> dict:
    """What `charlm train` prints at the end and the ``end`` record holds."""
    test_at_best = progress.best_test_bpc
    if test_at_best is None and run.best.exists():
        test_at_best = Checkpoint.load(run.best).scores.get("test_bpc")
    return {
        "run_dir": str(run.path),
        "epochs": progress.epoch,
        "partial_epoch": progress.window > 0,
        "best_epoch": progress.best_epoch,
        "best_valid_bpc": progress.best_valid_bpc,
        "test_bpc_at_best": test_at_best,
        "parameters": count_parameters(model),
        "hidden_size": model_config.hidden_size,
        "wall_seconds": wall_seconds(progress),
        "tokens_seen": progress.tokens_seen,
        "stopped_by": progress.stopped_by,
    }
