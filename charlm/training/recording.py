"""What the training loop records as it goes: the sinks a session opens, the ``start`` record and
its lines, the ``step`` records and ``--print-every`` lines, the ``valid`` records of
``--eval-every``, the ``epoch`` record and line, the lines that say how to go on after a budget.
The figures these take (running bpc, speed, position) are read from ``Progress``; the trainer
passes what each needs. (How they are shown and formatted is ``reporting``.)"""

from __future__ import annotations

from charlm.inference.scoring import LN2
from charlm.model import count_parameters
from charlm.runs.tensorboard import TensorBoardSink
from charlm.runs.wandb_sink import WandbSink
from charlm.training import reporting
from charlm.training.control import Stop


def add_sinks(run, config, model_config, progress, is_main: bool) -> None:
    """This session's TensorBoard and W&B sinks, where asked for (the main process only)."""
    if config.tensorboard and is_main:
        run.sinks.append(TensorBoardSink(run.path / "tensorboard"))
    if config.wandb and is_main:
        run.sinks.append(
            WandbSink(
                run.path,
                {"train": config.to_dict(), "model": model_config.to_dict()},
                config.wandb_project,
                step=progress.step,
            )
        )


def record_start(run, config, model_config, model, device, progress) -> None:
    """The lines that say what trains and from where, and the ``start`` record."""
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


def report_step(
    run, config, progress, result, bar, lr: float, chars_per_token: float, windows: int, is_main: bool
) -> None:
    """The ``step`` record every ``log_every`` updates, the ``--print-every`` line (``windows``: the
    epoch's)."""
    bpc = result.loss / LN2 / chars_per_token
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
    if config.print_every and progress.step % config.print_every == 0 and is_main:
        bar.write(
            run.log,
            reporting.step_line(
                progress.epoch + 1, progress.step, progress.window, windows, result.loss, bpc, lr, speed(progress)
            ),
        )


def record_valid(run, config, progress, valid) -> None:
    """``--eval-every``: a ``valid`` record of a score with the current weights."""
    run.record(
        "valid",
        epoch=progress.epoch + 1,
        step=progress.step,
        **valid.as_dict("valid_"),
        **valid_fraction(config),
        **position(progress),
    )


def record_epoch(
    run, config, progress, valid, test, lr: float, chars_per_token: float, partial: bool, improved: bool
) -> None:
    """The ``epoch`` record and its line."""
    record = reporting.epoch_record(progress, valid, test, lr, chars_per_token, partial, improved, config.accumulate)
    record.update(valid_fraction(config))
    run.record("epoch", **record)
    run.log(reporting.epoch_line(record))


def log_budget_cut(run, config, progress, cut: Stop | None) -> None:
    """Where a budget cut the session short, the line that says so and how to go on."""
    if cut is Stop.TIME:
        run.log(
            f"time budget of {config.max_minutes:g} min used up: the run is resumable with "
            f"`charlm train --resume {run.path}`"
        )
    elif cut is Stop.TOKENS:
        run.log(
            f"token budget of {config.max_tokens:,} used up ({progress.tokens_seen:,} tokens): the run is "
            f"resumable with `charlm train --resume {run.path} --max-tokens N` (a larger N)"
        )
