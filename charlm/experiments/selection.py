"""Which points of a plan a `charlm sweep` command runs: ``--only KEY=VALUE`` and ``--shard I/N``."""

from __future__ import annotations

from charlm.errors import CharlmError
from charlm.experiments.plan import Point


def parse_shard(text: str | None) -> tuple[int, int] | None:
    """``"2/4"`` → (2, 4): the third of four disjoint shares (I counts from 0, as Slurm arrays do)."""
    if text is None:
        return None
    try:
        index, count = (int(part) for part in text.split("/"))
    except ValueError:
        raise CharlmError(f"--shard must be I/N, such as 0/4, not {text!r}") from None
    if count < 1 or not 0 <= index < count:
        raise CharlmError(f"--shard {text}: I must be from 0 to N-1 and N at least 1")
    return index, count


def select(points: list[Point], only: list[str] = (), shard: tuple[int, int] | None = None) -> list[Point]:
    """The points matching every ``KEY=VALUE`` of ``only`` (axis values or settings), then the share."""
    wanted = []
    for condition in only:
        key, separator, value = condition.partition("=")
        if not separator:
            raise CharlmError(f"--only {condition!r} is not of the form KEY=VALUE")
        wanted.append((key.strip(), value.strip()))
    chosen = [point for point in points if all(_matches(point, key, value) for key, value in wanted)]
    if wanted and not chosen:
        raise CharlmError(f"no run of the plan matches {' '.join(only)}")
    if shard is not None:
        index, count = shard
        chosen = [point for position, point in enumerate(chosen) if position % count == index]
    return chosen


def _matches(point: Point, key: str, value: str) -> bool:
    found = point.settings.get(key, point.values.get(key, point.settings.get("cell_options", {}).get(key)))
    if isinstance(found, bool):
        return str(found).lower() == value.lower()
    return found is not None and str(found) == value
