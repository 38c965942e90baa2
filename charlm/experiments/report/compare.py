"""Comparing runs: the runs read back (``charlm.experiments.report.reading``) grouped over seeds, and
the comparisons of the LRU and Delta-RNN papers computed from the groups.

``charlm.experiments.report.write.build_report(["runs/sweep"])`` reads every run directory at or
below the given directories with ``read_runs`` and writes, into ``runs/sweep/report``:

- ``table1.md/.csv``: the LRU paper's Table 1, one table per parameter budget (``--params``, else
  the parameter count to two significant figures): rows corpora, columns cells, the test loss
  (nats, and bpc) at the best-validation epoch, mean ± standard deviation over seeds, the best
  cell of each row in bold; full-data runs only;
- ``convergence.csv/.png``: epochs to the best validation loss per run, a box plot per cell;
- ``curves.png``: validation bpc against epochs and against training time, one panel per corpus;
- ``progress.png``: training bpc (step records) and validation bpc against training tokens and against
  training time, the time labelled with the device the runs trained on;
- ``efficiency.md/.csv/.png``: test bpc against the training fraction, and the fraction of the data
  each cell needs to match the reference cell's full-data test loss;
- ``gradnorms.png``: per-layer gradient norms of the step records as heat maps;
- ``dynamic.md/.csv``: static against dynamic evaluation (Delta-RNN paper, protocols #1 and #2);
- ``index.md``: links to all of these and the list of runs with their settings.

A single run gets ``summary.md/.csv``, its curves and gradient norms. Unfinished runs are shown with
their status, never dropped. The files depend only on the runs: a second report is byte-identical.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import statistics

from charlm.runs.directory import STATUSES
from charlm.experiments.report.reading import RunRecord
from charlm.runs.records import EvalRecord


@dataclasses.dataclass(frozen=True)
class Stat:
    """The mean of a figure over runs, and its spread."""

    mean: float
    std: float | None  # sample standard deviation; None for a single run


@dataclasses.dataclass(frozen=True)
class Group:
    """The runs (seeds) sharing corpus, budget, layers, cell and training fraction."""

    runs: tuple[RunRecord, ...]

    corpus = property(lambda self: self.runs[0].corpus)
    budget = property(lambda self: self.runs[0].budget)
    layers = property(lambda self: self.runs[0].layers)
    cell = property(lambda self: self.runs[0].cell)
    fraction = property(lambda self: self.runs[0].fraction)
    loss = property(lambda self: _stat([run.test_loss for run in self.runs]))
    bpc = property(lambda self: _stat([run.test_bpc for run in self.runs]))

    @property
    def status(self) -> str:
        """``finished``, ``interrupted``, or counts: ``2 finished, 1 diverged``."""
        counts = collections.Counter(run.status for run in self.runs)
        if len(counts) == 1:
            return next(iter(counts))
        return ", ".join(f"{counts[status]} {status}" for status in STATUSES if counts[status])


def _stat(values: list[float | None]) -> Stat | None:
    values = [value for value in values if value is not None and math.isfinite(value)]
    if not values:
        return None
    return Stat(statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else None)


def group_runs(records: list[RunRecord]) -> list[Group]:
    """Runs grouped over seeds, sorted by corpus, budget, layers, cell and fraction."""
    groups = collections.defaultdict(list)
    for record in records:
        key = (record.corpus, record.budget_size, record.budget, record.layers or 0, record.cell, record.fraction)
        groups[key].append(record)
    return [Group(tuple(groups[key])) for key in sorted(groups)]


# --- comparisons -------------------------------------------------------------------------------------


def table1_sections(groups: list[Group]) -> list[tuple[str, list[str], list[tuple[str, list[Group | None]]]]]:
    """Per budget (full-data runs): its label, its cells, and rows (corpus label, group per cell)."""
    full = [group for group in groups if group.fraction == 1.0]
    sections = []
    for budget in _unique(group.budget for group in full):
        inside = [group for group in full if group.budget == budget]
        cells = sorted({group.cell for group in inside})
        depths = {cell: {group.layers for group in inside if group.cell == cell} for cell in cells}
        if all(len(layers) == 1 for layers in depths.values()):  # a depth per cell (lstm 2, rhn 1): a row per corpus
            shared = {layers for (layers,) in depths.values()}
            depth = f" ({layers_text(next(iter(shared)))})" if shared not in ({1}, {None}) and len(shared) == 1 else ""
            rows = [
                (
                    corpus + depth,
                    [next((g for g in inside if (g.corpus, g.cell) == (corpus, cell)), None) for cell in cells],
                )
                for corpus in _unique(group.corpus for group in inside)
            ]
            if len(shared) > 1:
                cells = [f"{cell} ({layers_text(*depths[cell])})" for cell in cells]
            sections.append((budget, cells, rows))
            continue
        rows = []
        for corpus, layers in _unique((group.corpus, group.layers) for group in inside):
            by_cell = {group.cell: group for group in inside if (group.corpus, group.layers) == (corpus, layers)}
            rows.append((f"{corpus} ({layers_text(layers)})", [by_cell.get(cell) for cell in cells]))
        sections.append((budget, cells, rows))
    return sections


def layers_text(layers) -> str:
    return "1 layer" if layers == 1 else "layers not recorded" if layers is None else f"{layers} layers"


def unequal_data(row: list[Group | None]) -> list[int] | None:
    """The different token counts the runs of a row trained on, when they differ (the comparison then
    mixes the amount of data with the modelling); None when they agree or were not counted."""
    seen = sorted(
        {run.tokens_seen for group in row if group is not None for run in group.runs if run.tokens_seen is not None}
    )
    return seen if len(seen) > 1 else None


def ordering_note(row: list[Group | None], cells: list[str]) -> str | None:
    """Whether the best cell's lead over the second is larger than the two groups' seed spread
    (mean ± standard deviation, several seeds each); None where that cannot be told."""
    scored = sorted(
        (
            (group.loss.mean, cell, group)
            for cell, group in zip(cells, row)
            if group is not None and group.loss is not None
        ),
        key=lambda item: item[0],
    )
    if len(scored) < 2 or scored[0][2].loss.std is None or scored[1][2].loss.std is None:
        return None
    (first_mean, first, first_group), (second_mean, second, second_group) = scored[:2]
    lead, spread = second_mean - first_mean, first_group.loss.std + second_group.loss.std
    verdict = "larger than" if lead > spread else "within"
    return (
        f"{first} leads {second} by {lead:.4f} nats, {verdict} their seed spread "
        f"(±{first_group.loss.std:.4f}, ±{second_group.loss.std:.4f})"
    )


def best_of(row: list[Group | None]) -> Group | None:
    """The group of a row with the lowest mean test loss."""
    scored = [group for group in row if group is not None and group.loss is not None]
    return min(scored, key=lambda group: group.loss.mean) if scored else None


def efficiency_families(groups: list[Group]) -> dict[tuple, list[Group]]:
    """Groups by (corpus, budget, layers), where some runs trained on part of the training split:
    what one statistical-efficiency comparison holds."""
    families = {}
    for group in groups:
        families.setdefault((group.corpus, group.budget, group.layers), []).append(group)
    return {key: inside for key, inside in families.items() if any(group.fraction < 1.0 for group in inside)}


def reference_loss(groups: list[Group], reference: str) -> float | None:
    """The mean full-data test loss of the reference cell among ``groups``."""
    return next(
        (
            group.loss.mean
            for group in groups
            if group.cell == reference and group.fraction == 1.0 and group.loss is not None
        ),
        None,
    )


def data_needed(points: list[tuple[float, float]], target: float) -> tuple[float | None, bool]:
    """The training fraction at which the test loss first reaches ``target``, interpolated linearly
    between measured (fraction, loss) points; (None, False) when never. The flag says the smallest
    measured fraction already reaches it (the figure is then an upper bound)."""
    points = sorted(points)
    for index, (fraction, loss) in enumerate(points):
        if loss <= target:
            if index == 0:
                return fraction, True
            before, before_loss = points[index - 1]
            return before + (before_loss - target) / (before_loss - loss) * (fraction - before), False
    return None, False


def dynamic_columns(records: list[RunRecord]) -> list[tuple[str, bool]]:
    """The (method, after adapting on validation) pairs recorded: sgd #1, sgd #2, rms #1, ..."""
    pairs = {(_method(row), bool(row.adapt_on)) for record in records for row in record.evaluations}
    return sorted(pairs)


def dynamic_rows(records: list[RunRecord]) -> list[tuple[RunRecord, str, float | None, dict]]:
    """Per run and split: the static bpc and the last dynamic bpc of each method and protocol."""
    rows = []
    for record in records:
        for split in sorted({_split(row) for row in record.evaluations}):
            inside = [row for row in record.evaluations if _split(row) == split]
            latest = {(_method(row), bool(row.adapt_on)): row.dynamic_bpc for row in inside}
            rows.append((record, split, inside[-1].static_bpc, latest))
    return rows


def _method(row: EvalRecord) -> str:
    return str((row.hyperparameters or {}).get("method", "dynamic"))


def _split(row: EvalRecord) -> str:
    return "?" if row.split is None else row.split


def protocol_name(pair: tuple[str, bool]) -> str:
    return f"{pair[0]} #{2 if pair[1] else 1}"


def _unique(values) -> list:
    return list(dict.fromkeys(values))
