"""Comparing runs: each run read back (through its RunHistory) into a ``RunRecord``, runs grouped
over seeds, and the comparisons of the LRU and Delta-RNN papers computed from the groups.

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
import json
import math
import os
import statistics
from pathlib import Path

from charlm.errors import CharlmError
from charlm.logs import get_logger
from charlm.model import parse_budget
from charlm.runs.directory import STATUSES, Run, find_runs
from charlm.runs.records import EpochRecord, EvalRecord, StepRecord


@dataclasses.dataclass(frozen=True)
class Point:
    """A bpc measured after ``tokens`` training tokens and ``seconds`` of training."""

    tokens: float
    seconds: float
    bpc: float


@dataclasses.dataclass(frozen=True)
class RunRecord:
    """One run read back from its directory: its settings, status and the records a report needs."""

    name: str
    corpus: str
    cell: str
    layers: int | None
    hidden: int | None
    parameters: int | None
    budget: str
    budget_size: float
    fraction: float
    seed: int | None
    status: str
    epochs: tuple[EpochRecord, ...]  # the last record written for each epoch, in order
    best: EpochRecord | None  # the epoch record of the best validation loss (the last one flagged best)
    test_loss: float | None  # the test score of the best epoch's weights
    test_bpc: float | None
    steps: tuple[StepRecord, ...]  # step records with per-layer gradient norms
    evaluations: tuple[EvalRecord, ...]  # dynamic "eval" records
    tokens_seen: int | None = None  # training tokens of the whole run (None: written before it was counted)
    stopped_by: str | None = None  # epochs, patience, tokens, time, diverged, interrupted; None while it runs
    device: str | None = None  # what it trained on, from provenance.json: ``NVIDIA H200``, ``cpu (x86_64, 2 threads)``
    trained: tuple[Point, ...] = ()  # training bpc of the step records, by tokens and training seconds
    validated: tuple[Point, ...] = ()  # validation bpc of the valid and epoch records

    @property
    def completed_epochs(self) -> int:
        return sum(1 for epoch in self.epochs if not epoch.partial)

    @property
    def best_epoch(self) -> int | None:
        return self.best.epoch if self.best else None

    def seconds(self, through_epoch: int | None = None) -> float:
        """Training time (the sum of the epochs' train_seconds) through ``through_epoch``, or in all."""
        return sum(
            epoch.train_seconds or 0.0 for epoch in self.epochs if through_epoch is None or epoch.epoch <= through_epoch
        )


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


# --- reading runs ------------------------------------------------------------------------------------


def read_runs(directories: list[str | Path], skipped: list | None = None) -> list[RunRecord]:
    """Every run at or below the directories, named by its path relative to their common parent.

    A damaged run (its config.json or metrics.jsonl unreadable, or of the wrong types) is left out
    with a warning, and (name, reason) appended to ``skipped``: it does not hide the others."""
    found = {}
    for directory in directories:
        runs = [
            run for run in find_runs(directory) if "task" not in run.read_json(run.config_file)
        ]  # `charlm task` runs: report/tasks.py
        if not runs:
            raise CharlmError(f"no runs under {directory} (no directory there holds config.json and metrics.jsonl)")
        found.update({run.path.resolve(): run for run in runs})
    base = Path(os.path.commonpath([Path(directory).resolve() for directory in directories]))
    if base in found:
        base = base.parent
    records, damaged = [], []
    for path, run in found.items():
        name = Path(os.path.relpath(path, base)).as_posix()
        try:
            records.append(read_run(run, name))
        except CharlmError as error:
            damaged.append((name, str(error)))
    if not records:
        raise CharlmError(
            f"no readable runs under {', '.join(map(str, directories))}: "
            + "; ".join(f"{name}: {reason}" for name, reason in sorted(damaged))
        )
    for name, reason in sorted(damaged):
        get_logger().warning(f"warning: skipped the damaged run {name}: {reason}")
    if skipped is not None:
        skipped.extend(sorted(damaged))
    return sorted(records, key=lambda record: record.name)


def read_run(run: Run, name: str) -> RunRecord:
    """A run's settings from config.json and its records from metrics.jsonl (a ``CharlmError`` when either is
    damaged)."""
    config = run.read_config()
    train, model = config.get("train", {}), config.get("model", {})
    history = run.history()
    parameters = history.parameters
    budget, budget_size = budget_label(train.get("params"), parameters, nominal_budget(run))
    return RunRecord(
        name=name,
        corpus=str(train.get("corpus", "?")),
        cell=str(model.get("cell", train.get("cell", "?"))),
        layers=model.get("layers", train.get("layers")),
        hidden=model.get("hidden_size", train.get("hidden")),
        parameters=parameters,
        budget=budget,
        budget_size=budget_size,
        fraction=float(train.get("train_fraction", 1.0)),
        seed=train.get("seed"),
        status=run.status(history),
        epochs=tuple(history.epochs),
        best=history.best,
        test_loss=history.test_loss_at_best,
        test_bpc=history.test_bpc_at_best,
        steps=tuple(step for step in history.steps if step.grad_norm),
        evaluations=tuple(evaluation for evaluation in history.evaluations if evaluation.mode == "dynamic"),
        tokens_seen=_tokens_seen(history),
        stopped_by=_stopped_by(history, run.status(history)),
        device=device_label(run.read_json(run.provenance_file)),
        **progress_points(history),
    )


def device_label(provenance: dict) -> str | None:
    """``NVIDIA H200`` for a GPU, ``cpu (x86_64, 2 threads)`` for a CPU; None when not recorded."""
    device, name, threads = provenance.get("device"), provenance.get("device_name"), provenance.get("threads")
    if not isinstance(device, str):
        return None
    if device.startswith("cuda") and isinstance(name, str):
        return name
    details = [str(part) for part in (name, threads and f"{threads} threads") if part]
    return f"{device} ({', '.join(details)})" if details else device


def progress_points(history) -> dict[str, tuple[Point, ...]]:
    """The run's training bpc (``trained``) and validation bpc (``validated``) as points by tokens and
    training seconds. Step and valid records since charlm 0.4 carry both; older ones are placed by their
    step between the epoch ends, which record them, as if each epoch trained at an even pace."""
    anchors, ends, seconds = [(0, 0, 0.0)], [], 0.0  # (step, tokens, seconds) at the start and each epoch end
    for epoch in history.epochs:
        seconds += epoch.train_seconds or 0.0
        if epoch.step is not None and epoch.tokens_seen is not None:
            anchors.append((epoch.step, epoch.tokens_seen, seconds))
            ends.append(Point(epoch.tokens_seen, seconds, epoch.valid_bpc))

    def placed(record, bpc) -> Point | None:
        if record.tokens is not None and record.seconds is not None:
            return Point(record.tokens, record.seconds, bpc)
        for (step0, tokens0, seconds0), (step1, tokens1, seconds1) in zip(anchors, anchors[1:]):
            if record.step is not None and step0 <= record.step <= step1 and step1 > step0:
                share = (record.step - step0) / (step1 - step0)
                return Point(tokens0 + share * (tokens1 - tokens0), seconds0 + share * (seconds1 - seconds0), bpc)
        return None  # past the last epoch end of a run written before charlm 0.4

    trained = [placed(record, record.bpc) for record in history.steps]
    validated = [placed(record, record.valid_bpc) for record in history.of("valid")] + ends
    return {
        "trained": tuple(point for point in trained if point is not None and _finite(point.bpc)),
        "validated": tuple(
            sorted((point for point in validated if point is not None and _finite(point.bpc)), key=lambda p: p.tokens)
        ),
    }


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def _tokens_seen(history) -> int | None:
    counted = [record.tokens_seen for record in history.of("epoch", "end") if record.tokens_seen is not None]
    return counted[-1] if counted else None


def _stopped_by(history, status: str) -> str | None:
    """Why the run's training last stopped: its ``end`` record says, or its status (diverged, interrupted)."""
    if status in ("diverged", "interrupted"):
        return status
    ends = history.of("end")
    if ends and ends[-1].stopped_by:
        return ends[-1].stopped_by
    return None


def nominal_budget(run: Run) -> str | None:
    """The ``budget`` label of the plan whose sweep made the run (sweep.json beside it), if any."""
    record = run.path.parent / "sweep.json"
    try:
        label = json.loads(record.read_text(encoding="utf-8")).get("budget") if record.is_file() else None
    except (OSError, ValueError, AttributeError, RecursionError):  # RecursionError: arrays nested thousands deep
        return None
    return label if isinstance(label, str) and label.strip() else None


def budget_label(params, parameters, nominal: str | None = None) -> tuple[str, float]:
    """The parameter budget a run belongs to, and a number to sort by: its ``--params`` as given, else
    the nominal budget its plan names for runs sized by ``--hidden`` (``0.9M per layer``), else its
    parameter count to two significant figures (``≈1.8M``)."""
    if not isinstance(params, str) and nominal is not None:
        params = nominal
    if isinstance(params, str):
        try:
            return params, float(
                parse_budget(params.split()[0].lstrip("≈~") if params.split() else params)
            )  # "0.9M per layer" sorts as 0.9M
        except CharlmError:
            return params, math.inf
    if parameters is None:
        return "unknown", math.inf
    rounded = float(f"{parameters:.2g}")
    for scale, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if rounded >= scale:
            return f"≈{rounded / scale:g}{suffix}", rounded
    return f"≈{rounded:g}", rounded


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
            depth = f" ({layers_text(next(iter(shared)))})" if len(shared) == 1 and shared != {1} else ""
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
