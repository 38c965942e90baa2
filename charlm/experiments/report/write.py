"""Writing a report: the one-run summary, the convergence table, the figures and the index.

``build_report`` reads the runs (``reading.read_runs``) and calls ``ReportWriter(...).write_all()``;
each ``write_*`` method writes one part, or adds a note to the index saying why it has none. The
comparison tables (Table 1, statistical efficiency, dynamic evaluation) are written by ``tables``.
"""

from __future__ import annotations

import csv
import dataclasses
import io
from pathlib import Path

from charlm.errors import CharlmError
from charlm.experiments.report import figures, series, tables
from charlm.experiments.report.compare import group_runs
from charlm.experiments.report.markdown import csv_value
from charlm.experiments.report.markdown import markdown_table as _markdown
from charlm.experiments.report.reading import RunRecord, read_runs
from charlm.experiments.report.publish import publish, report_directory, staged
from charlm.experiments.report.tasks import is_task_run, read_task_runs, write_task_report
from charlm.experiments.report.terminal import TerminalTable, runs_table, summary_table
from charlm.files import atomic_write_text, path_value
from charlm.runs.directory import find_runs

DEFAULT_REFERENCE = "gru"
REPORT_FILES = (
    "index.md",
    "table1.md",
    "table1.csv",
    "convergence.csv",
    "convergence.png",
    "curves.png",
    "progress.png",
    "efficiency.md",
    "efficiency.csv",
    "efficiency.png",
    "gradnorms.png",
    "dynamic.md",
    "dynamic.csv",
    "summary.md",
    "summary.csv",
    "tasks.md",
    "tasks.csv",
    "thresholds.png",
)


TABLES = {
    "summary.md": "Summary of the run",
    "table1.md": "Table 1: test loss at the best validation epoch, per corpus and cell",
    "efficiency.md": "Statistical efficiency: test bpc against the fraction of training data",
    "dynamic.md": "Static and dynamic evaluation",
}
FIGURES = {
    "curves.png": "Learning curves: validation bpc against epochs and training time",
    "progress.png": "Convergence: training and validation bpc against training tokens and training time",
    "convergence.png": "Epochs to the best validation loss, per cell",
    "efficiency.png": "Test bpc against the fraction of training data",
    "gradnorms.png": "Gradient norm per layer and logged step",
}


class ReportWriter:
    """Writes each part of a report, collecting the file names, notes and terminal tables."""

    def __init__(self, out: Path, records: list[RunRecord], reference: str, sources: list[str]):
        self.out, self.records, self.reference, self.sources = out, records, reference, sources
        self.groups = group_runs(records)
        self.colours = figures.cell_colours(sorted({record.cell for record in records}))
        self.files, self.notes, self.tables = [], [], []

    def text(self, name: str, text: str) -> None:
        atomic_write_text(self.out / name, text)
        self.files.append(name)

    def table(self, name: str, columns: list[str], rows: list[list]) -> None:
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        writer.writerow(columns)
        writer.writerows([[csv_value(value) for value in row] for row in rows])
        self.text(name, buffer.getvalue())

    def figure(self, name: str, draw, *arguments) -> None:
        draw(*arguments, self.out / name)
        self.files.append(name)

    def write_all(self) -> None:
        if len(self.records) == 1:
            self.write_summary()
        else:
            tables.write_table1(self)
            self.write_convergence()
            tables.write_efficiency(self)
        self.write_curves()
        self.write_progress()
        self.write_gradnorms()
        tables.write_dynamic(self)
        if not self.tables:  # no Table 1 (no run used all the data): the runs themselves, so a table is always shown
            self.tables.append(runs_table(self.records))
        self.text("index.md", self.index())

    def write_summary(self) -> None:
        record = self.records[0]
        rows = [
            *map(list, _settings(record).items()),
            ["best epoch", record.best_epoch],
            ["best valid bpc", record.best and record.best.valid_bpc],
            ["test loss (nats) at best", record.test_loss],
            ["test bpc at best", record.test_bpc],
            ["training seconds", record.seconds()],
        ]
        self.table("summary.csv", ["setting", "value"], rows)
        self.text("summary.md", f"# Run {record.name}\n\n" + _markdown(["setting", "value"], rows))
        self.tables.append(summary_table(record.name, rows))

    def write_convergence(self) -> None:
        rows = [
            [
                record.name,
                record.corpus,
                record.cell,
                record.layers,
                record.budget,
                record.fraction,
                record.seed,
                record.status,
                record.completed_epochs,
                record.best_epoch,
                record.best and record.best.valid_bpc,
                record.test_loss,
                record.test_bpc,
                record.best and record.seconds(record.best_epoch),
                record.seconds(),
            ]
            for record in self.records
        ]
        self.table(
            "convergence.csv",
            [
                "run",
                "corpus",
                "cell",
                "layers",
                "budget",
                "fraction",
                "seed",
                "status",
                "epochs",
                "best_epoch",
                "best_valid_bpc",
                "test_loss",
                "test_bpc",
                "seconds_to_best",
                "train_seconds",
            ],
            rows,
        )
        full = [record for record in self.records if record.fraction == 1.0 and record.best_epoch is not None]
        if not full:
            self.notes.append("No full-data run has a best epoch yet: no convergence box plot.")
            return
        cells = sorted({record.cell for record in full})
        epochs = {cell: [record.best_epoch for record in full if record.cell == cell] for cell in cells}
        self.figure("convergence.png", figures.convergence_boxes, epochs, self.colours)

    def write_curves(self) -> None:
        panels = series.learning_curves(self.records, self.colours)
        if not panels:
            self.notes.append("No run has finished an epoch: no learning curves.")
            return
        self.figure("curves.png", figures.learning_curves, panels)

    def write_progress(self) -> None:
        panels = series.progress_panels(self.records, self.colours)
        if not panels:
            self.notes.append(
                "No run has a step or validation placed by its tokens (none logged, or written before charlm "
                "counted tokens): no convergence by tokens and time."
            )
            return
        self.figure("progress.png", figures.progress_curves, panels)

    def write_gradnorms(self) -> None:
        maps = series.heat_maps(self.records)
        if not maps:
            self.notes.append("No step record holds per-layer gradient norms: no gradient-norm heat map.")
            return
        self.figure("gradnorms.png", figures.gradient_heatmaps, maps)

    def index(self) -> str:
        runs = "run" if len(self.records) == 1 else "runs"
        parts = [
            f"# Report on {len(self.records)} {runs}\n",
            f"Written by `charlm report` from {', '.join(f'`{source}`' for source in self.sources)}. Losses are "
            "nats per token, bpc bits per character; a run's test figures are those of its best validation epoch.\n",
            "## Tables\n",
        ]
        parts += [
            f"- [{title}]({name})" + (f" ([CSV]({name[:-3]}.csv))" if f"{name[:-3]}.csv" in self.files else "")
            for name, title in TABLES.items()
            if name in self.files
        ]
        if "convergence.csv" in self.files:
            parts.append("- [Epochs to the best validation loss, per run (CSV)](convergence.csv)")
        parts.append("\n## Figures\n")
        parts += [f"### {title}\n\n![{title}]({name})\n" for name, title in FIGURES.items() if name in self.files]
        if self.notes:
            parts += ["## Notes\n", *[f"- {note}" for note in self.notes], ""]
        columns = ["run", *list(_settings(self.records[0]))[1:]]
        parts += ["## Runs\n", _markdown(columns, [list(_settings(record).values()) for record in self.records])]
        return "\n".join(parts)


# --- text ----------------------------------------------------------------------------------------------


def _settings(record: RunRecord) -> dict:
    return {
        "run": record.name,
        "corpus": record.corpus,
        "cell": record.cell,
        "layers": record.layers,
        "hidden": record.hidden,
        "parameters": record.parameters,
        "budget": record.budget,
        "fraction": record.fraction,
        "seed": record.seed,
        "status": record.status,
        "epochs": record.completed_epochs,
        "tokens": record.tokens_seen,
        "stopped by": record.stopped_by,
    }


@dataclasses.dataclass
class Report:
    """What ``build_report`` wrote, and the main table(s) for the terminal."""

    out: Path
    files: list[str]
    tables: list[TerminalTable]


def build_report(directories: list[str | Path], out: str | Path | None = None, reference: str | None = None) -> Report:
    """Read the runs at or below ``directories`` and write the report into ``out`` (default
    ``DIR/report`` for a single directory); files of an earlier report that no longer apply are removed."""
    if not directories:
        raise CharlmError("give at least one run directory")
    out = None if out is None else path_value(out, "the report directory")
    if out is None and len(directories) > 1:
        raise CharlmError("several directories: say where the report goes with --out REPORT_DIR")
    task_runs = read_task_runs(directories)
    if task_runs and not any(not is_task_run(run) for directory in directories for run in find_runs(directory)):
        out = report_directory(directories, out)
        with staged(out) as staging:
            files, tables = write_task_report(staging, task_runs, directories)
            publish(staging, out, files, REPORT_FILES)
        return Report(out, files, tables)
    skipped = []
    records = read_runs(directories, skipped)
    cells = sorted({record.cell for record in records})
    if reference is not None and reference not in cells:
        raise CharlmError(f"reference cell {reference} has no run here (cells: {', '.join(cells)})")
    out = report_directory(directories, out)
    with staged(out) as staging:
        writer = ReportWriter(
            staging, records, reference or DEFAULT_REFERENCE, [str(directory) for directory in directories]
        )
        writer.notes.extend(f"Skipped the damaged run {name}: {reason}" for name, reason in skipped)
        writer.write_all()
        publish(staging, out, writer.files, REPORT_FILES)
    return Report(out, writer.files, writer.tables)
