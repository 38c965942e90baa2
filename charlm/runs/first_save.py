"""Why a run directory holds no checkpoint yet, for the commands that load one (`sample`, `eval`, ...):
its run is training and saves its first one later, or its training stopped before it saved. The
boundaries, the command line and ``charlm.load``, turn a ``NoCheckpoint`` into this line."""

from __future__ import annotations

from pathlib import Path

from charlm.config import TrainConfig
from charlm.config_rules import save_interval
from charlm.errors import CharlmError, NoCheckpoint
from charlm.runs.directory import Run


def explained(error: NoCheckpoint) -> NoCheckpoint:
    """``error`` saying what the run in its directory is doing and when, or how, it gets a checkpoint."""
    return NoCheckpoint(error.path, no_checkpoint_yet(Path(error.path)))


def no_checkpoint_yet(path: Path) -> str:
    """The one line for a directory without best.pt or last.pt; one that holds no run (no config.json,
    no records) is said to hold no checkpoint."""
    run = Run(path)
    plain = f"run directory {path} holds no checkpoint (best.pt or last.pt)"
    if not (run.config_file.exists() or run.metrics.exists()):
        return plain
    try:
        status = run.status()
    except CharlmError:  # records it cannot read: say no more than what is missing
        return plain
    if status == "running":
        holder = run.holder()
        who = f" ({holder})" if holder else ""
        return (
            f"run directory {path} holds no checkpoint yet: it is training{who} and saves its first checkpoint "
            f"{_first_save(run)}"
        )
    if status == "diverged":
        return f"run directory {path} holds no checkpoint: its training diverged before its first save"
    if status == "finished":
        return plain
    return (
        f"run directory {path} holds no checkpoint: its training was interrupted before its first save; "
        f"continue it with `charlm train --resume {path}`"
    )


def _first_save(run) -> str:
    """When the training saves its first last.pt: at the end of its first epoch, or before it at
    ``--save-every`` steps or minutes of training."""
    at_epoch_end = "at the end of its first epoch"
    try:
        every = run.read_config().get("train", {}).get("save_every")
        interval = save_interval(every, TrainConfig) if isinstance(every, str) else None
    except CharlmError:
        interval = None
    if interval is None:
        return at_epoch_end
    kind, amount = interval
    when = f"at step {amount:,}" if kind == "steps" else f"{_duration(amount)} into its training"
    return f"{when} (--save-every {every}) or {at_epoch_end}, whichever comes first"


def _duration(seconds: float) -> str:
    for unit, length in (("hour", 3600), ("minute", 60)):
        if seconds >= length and seconds % length == 0:
            count = int(seconds // length)
            return f"{count} {unit}{'s' if count != 1 else ''}"
    return f"{seconds:g} seconds"
