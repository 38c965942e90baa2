"""What a run directory keeps on disk, and `charlm runs --prune`, which frees what it need not keep.

A run keeps ``last.pt`` (weights, optimizer, schedule, RNG streams, progress: what ``--resume``
needs), ``previous.pt`` (the ``last.pt`` before the latest save: the fallback when ``last.pt``
cannot be read) and ``best.pt`` (the best-validation weights, without the optimizer's state).
With ``--keep-checkpoints N`` it also keeps the N latest epoch-end checkpoints, without the
optimizer's state, named with the epoch and the run's validation figure, char-rnn style::

    epoch03-valid1.8420.pt     validation bits per character (4 decimals, as train.log shows it)
    epoch03-ppl141.27.pt       validation perplexity per word, on a word-level corpus

``prune`` removes what is needed neither to resume nor to use the best model: ``previous.pt`` when
``last.pt`` loads (it is only ever read when ``last.pt`` cannot be), the optimizer's state inside a
``best.pt`` written before charlm kept it out, epoch checkpoints beyond the ones to keep, and
temporary files a killed write left. ``last.pt`` is never touched, finished run or not: a finished
run goes on with a larger ``--epochs`` exactly as it would have. A run that a training holds (its
``lock``) is left alone. Torch is imported only where a checkpoint is read.
"""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path

from charlm.errors import CharlmError
from charlm.files import WriteError

EPOCH_FILE = re.compile(r"epoch(\d+)-(?:valid|ppl)(?:\d+\.\d+|inf|nan)\.pt")


def epoch_checkpoint_name(epoch: int, valid_bpc: float, valid_perplexity: float, unit: str) -> str:
    """``epoch03-valid1.8420.pt``; ``epoch03-ppl141.27.pt`` for a word-level corpus (``unit`` "word")."""
    if unit == "word":
        return f"epoch{epoch:02d}-ppl{valid_perplexity:.2f}.pt"
    return f"epoch{epoch:02d}-valid{valid_bpc:.4f}.pt"


def epoch_checkpoints(directory: str | Path) -> list[Path]:
    """The epoch checkpoints in a run directory, the earliest epoch first."""
    found = []
    for path in Path(directory).iterdir():
        match = EPOCH_FILE.fullmatch(path.name)
        if match and path.is_file():
            found.append((int(match[1]), path.name, path))
    return [path for _, _, path in sorted(found)]


def beyond_kept(directory: str | Path, keep: int) -> list[Path]:
    """The epoch checkpoints beyond the ``keep`` latest."""
    files = epoch_checkpoints(directory)
    return files[: max(len(files) - keep, 0)]


def save_epoch_checkpoint(directory: Path, checkpoint, epoch: int, name: str, keep: int) -> None:
    """At the end of epoch ``epoch``: write ``checkpoint`` without its optimizer state as ``name``
    (when ``keep`` > 0) and remove the epoch checkpoints beyond the ``keep`` latest. Files of this
    epoch or later under other names belong to a history the run went back on (it resumed from an
    older checkpoint) and are replaced."""
    for path in epoch_checkpoints(directory):
        if int(EPOCH_FILE.fullmatch(path.name)[1]) >= epoch and path.name != name:
            path.unlink(missing_ok=True)
    if keep > 0:
        checkpoint.without_optimizer().save(directory / name)
    for path in beyond_kept(directory, keep):
        path.unlink(missing_ok=True)


def save_epoch_end(run, checkpoint, epoch_name: str | None, *, improved: bool, keep: int, is_main: bool) -> None:
    """An epoch's checkpoints, in the order a kill can interrupt safely. One commit point, last.pt: the epoch
    checkpoint (``epoch_name``; None for a partial epoch) comes before it (a resume trains the epoch again and
    supersedes it), best.pt after it (a resume restores it from last.pt: ``training.resume.restore_best``).
    best.pt and epoch checkpoints keep no optimizer state."""
    if epoch_name is not None and is_main:
        save_epoch_checkpoint(run.path, checkpoint, checkpoint.scores["epoch"], epoch_name, keep)
    run.save_last(checkpoint)
    if improved and is_main:
        checkpoint.without_optimizer().save(run.best)


def disk_usage(directory: str | Path) -> int:
    """Bytes of every file at or below ``directory`` (links not followed): what `charlm runs` shows."""
    total = 0
    for root, _, names in os.walk(directory):
        for name in names:
            try:
                info = os.lstat(os.path.join(root, name))
            except OSError:  # removed while we walk
                continue
            total += info.st_size
    return total


# --- pruning -----------------------------------------------------------------------------------------


@dataclasses.dataclass
class Freed:
    """One file pruned: removed (``after`` 0) or rewritten smaller."""

    path: Path
    before: int
    after: int
    why: str

    @property
    def bytes(self) -> int:
        return self.before - self.after


@dataclasses.dataclass
class Pruning:
    """What pruning one run did (or, in a dry run, would do)."""

    run: Path
    freed: list = dataclasses.field(default_factory=list)  # Freed
    kept: list = dataclasses.field(default_factory=list)  # why something that might have gone stayed
    in_use: str | None = None  # who trains the run ("pid N on HOST"): nothing was touched

    @property
    def bytes(self) -> int:
        return sum(item.bytes for item in self.freed)


def prune(run, keep: int | None = None, dry_run: bool = False) -> Pruning:
    """Free what ``run`` (a ``charlm.runs.directory.Run``) needs neither to resume nor to use its best
    model; ``keep``: the epoch checkpoints to keep (default: the run's ``--keep-checkpoints``).
    The run's lock is held meanwhile, so no training starts; one that a training holds is skipped."""
    try:
        run.acquire(claim=False)
    except WriteError:  # its lock cannot even be opened (a read-only file system): said as it is, not as "in use"
        if dry_run:  # which changes nothing: said all the same
            return _prune(run, keep, dry_run)
        raise
    except CharlmError:
        return Pruning(run.path, in_use=run.holder() or "another process")
    try:
        if _running(run):  # where there are no locks (Windows): a live process's running mark
            return Pruning(run.path, in_use="a live process")
        return _prune(run, keep, dry_run)
    finally:
        run.release()


def _running(run) -> bool:
    try:
        return run.status() == "running"
    except CharlmError:  # its records are damaged, which no file pruned depends on: the others are pruned too
        return False


def _prune(run, keep: int | None, dry_run: bool) -> Pruning:
    result = Pruning(run.path)

    def remove(path: Path, why: str) -> None:
        size = path.stat().st_size
        if not dry_run:
            path.unlink()
        result.freed.append(Freed(path, size, 0, why))

    for leftover in sorted(run.path.glob(".*.tmp")):
        remove(leftover, "left by a write that was cut short")
    last, problem = _resume_point(run.last)
    if run.previous.exists():
        if problem is None:
            remove(run.previous, "last.pt loads, so the fallback is not needed")
        else:
            result.kept.append(f"kept previous.pt: {problem}")
    _slim_best(run.best, result, dry_run)
    if keep is None:
        keep = (
            last.train_config.keep_checkpoints
            if last is not None
            else run.read_json(run.config_file).get("train", {}).get("keep_checkpoints", 0)
        )
    for path in beyond_kept(run.path, keep):
        remove(path, f"beyond the {keep} latest epoch checkpoint{'s' if keep != 1 else ''} to keep")
    return result


def _resume_point(path: Path):
    """``(checkpoint, None)`` when ``--resume`` can go on from ``path``, else ``(None, why not)``;
    a `charlm task` checkpoint (another format) counts when it loads."""
    import torch

    from charlm.checkpoint import FORMAT, Checkpoint

    if not path.exists():
        return None, f"{path.name} is missing"
    if not path.is_file():  # a named pipe would wait for a writer, a device be read without end
        return None, f"{path.name} is not a regular file"
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception:  # torch.load raises many kinds on a damaged file
        return None, f"{path.name} cannot be read"
    if not isinstance(payload, dict) or not str(payload.get("format", "")).startswith("charlm-"):
        return None, f"{path.name} is not a charlm checkpoint"
    if payload["format"] != FORMAT:
        return None, None
    try:
        checkpoint = Checkpoint.from_payload(payload, path)
    except (CharlmError, KeyError, TypeError, ValueError, AttributeError):
        return None, f"{path.name} is damaged"
    if checkpoint.training is None or checkpoint.training.optimizer is None:
        return None, f"{path.name} holds no optimizer state"
    return checkpoint, None


def _slim_best(path: Path, result: Pruning, dry_run: bool) -> None:
    """Rewrite a ``best.pt`` that still holds the optimizer's state without it (atomically)."""
    from charlm.checkpoint import Checkpoint

    if not path.exists():
        return
    try:
        best = Checkpoint.load(path)
    except CharlmError:
        result.kept.append(f"left {path.name} as it is: it cannot be read")
        return
    if best.training is None or best.training.optimizer is None:
        return
    slim, before = best.without_optimizer(), path.stat().st_size
    if dry_run:
        after = _saved_size(slim)
    else:
        slim.save(path)
        after = path.stat().st_size
    result.freed.append(Freed(path, before, after, "its optimizer state"))


def _saved_size(checkpoint) -> int:
    """The bytes ``checkpoint.save(path)`` would write."""
    from charlm.checkpoint import torch_file

    return len(torch_file(checkpoint.to_payload()))
