"""Which checkpoint of a run directory holds its best weights, when its files disagree.

At an epoch's end ``last.pt`` is committed before ``best.pt`` is written; a run killed between the
two, and not resumed since, holds an older ``best.pt`` (or none) while its records and ``last.pt``
call the new epoch best. Reading such a run (`charlm eval RUN`, ``charlm.load(RUN)``) must not
silently score the older weights: ``best_of_run`` takes the best epoch's weights from ``last.pt``
where it holds them, and otherwise says whose weights are scored.
"""

from __future__ import annotations

from pathlib import Path

from charlm.errors import CharlmError
from charlm.logs import get_logger
from charlm.runs.history import RunHistory


def best_of_run(run_dir: Path, chosen, read):
    """``chosen`` (the checkpoint read for ``run_dir``: its best.pt, or last.pt where it has none),
    or the run's ``last.pt`` (``read(path)`` reads one) where that holds the best epoch and ``chosen``
    does not; a warning names the epoch whose weights are returned whenever they are not the best's."""
    try:
        recorded = RunHistory.read(run_dir / "metrics.jsonl").best
    except CharlmError:  # damaged records say nothing of the best epoch: the checkpoint is what there is
        return chosen
    if recorded is None or chosen.scores.get("epoch") == recorded.epoch:
        return chosen
    last = run_dir / "last.pt"
    if chosen.path != last and last.is_file():
        try:
            candidate = read(last)
        except CharlmError:
            candidate = None
        progress = (candidate.training.progress if candidate is not None and candidate.training else None) or {}
        if candidate is not None and candidate.scores.get("epoch") == recorded.epoch == progress.get("best_epoch"):
            get_logger().warning(
                f"warning: {chosen.path} holds {_whose(chosen)}, but the run's best is epoch "
                f"{recorded.epoch} (a kill cut the save of best.pt short; `charlm train --resume "
                f"{run_dir}` rewrites it): using {last}, which holds the best epoch's weights"
            )
            return candidate.without_optimizer()
    get_logger().warning(
        f"warning: using {_whose(chosen)} ({chosen.path}): the run's records call epoch "
        f"{recorded.epoch} best, but no checkpoint holds its weights (the run was killed before they "
        "were saved)"
    )
    return chosen


def _whose(checkpoint) -> str:
    epoch = checkpoint.scores.get("epoch")
    if epoch is not None:
        return f"the weights of epoch {epoch}"
    progress = (checkpoint.training.progress if checkpoint.training else None) or {}
    return f"the weights saved at step {progress.get('step', '?')} (epoch {progress.get('epoch', 0) + 1})"
