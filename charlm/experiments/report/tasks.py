"""The report of `charlm task` runs: the Grid LSTM paper's Figure 4 table (held-out accuracy and
samples per network) and Figure 5 (samples to each accuracy threshold against depth, one marker per
network type, a panel per threshold)."""

from __future__ import annotations

import csv
import dataclasses
import io
import os
import statistics
from pathlib import Path

from charlm.errors import CharlmError
from charlm.experiments.report import figures
from charlm.logs import get_logger
from charlm.experiments.report.markdown import markdown_table
from charlm.experiments.report.terminal import TerminalTable
from charlm.files import atomic_write_text
from charlm.runs.directory import Run, find_runs

FIGURE_THRESHOLDS = ("0.5", "0.8", "0.99")  # Figure 5's panels
TABLE_THRESHOLDS = ("0.5", "0.8", "0.99", "1.0")


@dataclasses.dataclass(frozen=True)
class TaskRun:
    name: str
    task: str
    network: str  # "grid-lstm tied", "lstm untied", ...
    layers: int
    hidden: int | None
    seed: int | None
    parameters: int | None
    samples: int | None  # trained so far
    budget: int | None  # max_samples
    stopped_by: str | None
    reached: dict  # threshold ("0.5") → samples when first exceeded
    accuracy: float | None
    sequence_accuracy: float | None
    status: str


def is_task_run(run: Run) -> bool:
    return "task" in run.read_json(run.config_file)


def read_task_runs(directories) -> list[TaskRun]:
    """Every task run at or below the directories, named by its path relative to their common parent."""
    found = {run.path.resolve(): run for directory in directories for run in find_runs(directory) if is_task_run(run)}
    if not found:
        return []
    base = Path(os.path.commonpath([Path(directory).resolve() for directory in directories]))
    if base in found:
        base = base.parent
    read = []
    for path, run in found.items():
        name = Path(os.path.relpath(path, base)).as_posix()
        try:
            read.append(read_task_run(run, name))
        except CharlmError as error:  # a damaged run does not hide the others
            get_logger().warning(f"warning: skipped the damaged run {name}: {error}")
    return sorted(read, key=lambda run: (run.task, run.network, run.layers, run.seed or 0, run.name))


def read_task_run(run: Run, name: str) -> TaskRun:
    config = run.read_config()
    if not isinstance(config.get("task"), dict):
        raise CharlmError(f"{run.config_file}: task must be an object")
    train, model = config.get("train", {}), config.get("model", {})
    history = run.history()
    evaluations, ends = history.of("task_eval"), history.of("task_end")
    end = ends[-1] if ends else None
    last = evaluations[-1] if evaluations else None
    reached = {}
    for record in evaluations:  # the same bookkeeping as training, so an unfinished run reports too
        for threshold in TABLE_THRESHOLDS:
            value = float(threshold)
            if (
                threshold not in reached
                and record.accuracy is not None
                and (record.accuracy >= 1.0 if value == 1.0 else record.accuracy > value)
            ):
                reached[threshold] = record.samples
    cell, tied = str(model.get("cell", "?")), model.get("tied")
    if tied is None:
        tied = cell == "grid-lstm" and (train.get("cell_options") or {}).get("tied", True)
    return TaskRun(
        name=name,
        task=str(config["task"].get("name", train.get("task", "?"))),
        network=f"{cell} {'tied' if tied else 'untied'}",
        layers=int(model.get("layers") or 1),
        hidden=model.get("hidden_size"),
        seed=train.get("seed"),
        parameters=history.parameters,
        samples=last.samples if last else None,
        budget=train.get("max_samples"),
        stopped_by=end.stopped_by if end else None,
        reached=reached,
        accuracy=last.accuracy if last else None,
        sequence_accuracy=last.sequence_accuracy if last else None,
        status=run.status(history),
    )


def threshold_rows(runs: list[TaskRun]) -> list[list]:
    """Figure 4's table, by task, network and depth: seeds, parameters, the samples to each threshold
    (mean over the seeds that reached it, with how many did), held-out accuracy (mean), samples trained."""
    rows, groups = [], {}
    for run in runs:
        groups.setdefault((run.task, run.network, run.layers), []).append(run)
    for (task, network, layers), members in groups.items():
        row = [task, network, layers, len(members), members[0].parameters]
        for threshold in TABLE_THRESHOLDS:
            got = [run.reached[threshold] for run in members if threshold in run.reached]
            row.append(f"{statistics.fmean(got):,.0f} ({len(got)}/{len(members)})" if got else f"- (0/{len(members)})")
        accuracies = [run.accuracy for run in members if run.accuracy is not None]
        row.append(f"{statistics.fmean(accuracies):.2%}" if accuracies else "-")
        trained = [run.samples for run in members if run.samples is not None]
        row.append(f"{statistics.fmean(trained):,.0f}" if trained else "-")
        rows.append(row)
    return rows


COLUMNS = [
    "task",
    "network",
    "layers",
    "seeds",
    "parameters",
    ">50%",
    ">80%",
    ">99%",
    "100%",
    "held-out accuracy",
    "samples trained",
]


def threshold_figure_data(runs: list[TaskRun]) -> dict[str, dict[str, list[figures.Marker]]]:
    """Per threshold, per network: a marker per depth (mean samples over the seeds that reached it;
    ``reached`` False and the budget where none did)."""
    panels = {}
    for threshold in FIGURE_THRESHOLDS:
        networks = {}
        for run in runs:
            networks.setdefault(run.network, {}).setdefault(run.layers, []).append(run)
        panel = {}
        for network, depths in networks.items():
            markers = []
            for layers, members in sorted(depths.items()):
                got = [run.reached[threshold] for run in members if threshold in run.reached]
                if got:
                    markers.append(figures.Marker(layers, statistics.fmean(got), True, len(got), len(members)))
                else:
                    budget = max((run.samples or 0) for run in members)
                    markers.append(figures.Marker(layers, budget, False, 0, len(members)))
            panel[network] = markers
        panels[threshold] = panel
    return panels


def write_task_report(out: Path, runs: list[TaskRun], directories) -> tuple[list[str], list]:
    """Figure 4's table (tasks.md/.csv), Figure 5's plot (thresholds.png) and index.md into ``out``;
    the files written and the table for the terminal."""
    rows = threshold_rows(runs)
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="\n").writerows([COLUMNS, *rows])
    atomic_write_text(out / "tasks.csv", buffer.getvalue())
    table = markdown_table(COLUMNS, rows)
    atomic_write_text(out / "tasks.md", "# Samples to each held-out accuracy threshold\n\n" + table + "\n")
    figures.threshold_panels(threshold_figure_data(runs), out / "thresholds.png")
    index = [
        "# Report",
        "",
        f"{len(runs)} task run(s) from {', '.join(map(str, directories))}.",
        "",
        "Samples to exceed 50%, 80%, 99% and to reach 100% held-out per-symbol accuracy: the mean over the",
        "seeds that reached it, with how many did (k/n). As the Grid LSTM paper's Figure 4 table and Figure 5.",
        "",
        table,
        "",
        "![samples to threshold](thresholds.png)",
        "",
    ]
    atomic_write_text(out / "index.md", "\n".join(index))
    terminal = TerminalTable(
        "Samples to each held-out accuracy threshold",
        COLUMNS,
        [[str(value) for value in row] for row in rows],
        wrap=("network", ">50%", ">80%", ">99%", "100%"),
        drop_order=("samples trained", "parameters", "seeds", ">50%", ">80%", ">99%"),
    )
    return ["index.md", "tasks.md", "tasks.csv", "thresholds.png"], [terminal]
