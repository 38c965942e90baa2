"""The report's comparison tables, Markdown and CSV: Table 1, statistical efficiency, dynamic evaluation.

Each ``write_*`` takes the ``write.ReportWriter`` and writes its files through it (``text``, ``table``,
``figure``), or adds a note to the index saying why there is no such table.
"""

from __future__ import annotations

from charlm.experiments.report import figures, series
from charlm.experiments.report.compare import (
    Group,
    best_of,
    data_needed,
    dynamic_columns,
    dynamic_rows,
    efficiency_families,
    layers_text,
    ordering_note,
    protocol_name,
    reference_loss,
    table1_sections,
    unequal_data,
)
from charlm.experiments.report.markdown import bpc_text, loss_text, needed_text, stat_values
from charlm.experiments.report.markdown import markdown_table as _markdown
from charlm.experiments.report.terminal import table1_table


def write_table1(writer) -> None:
    """Table 1: the test loss of each corpus and cell, per parameter budget (full-data runs)."""
    sections = table1_sections(writer.groups)
    if not sections:
        writer.notes.append("No run trained on the full training data: no Table 1.")
        return
    csv_rows, markdown = (
        [],
        [
            "# Table 1: test loss at the best validation epoch\n",
            "Nats per token · bits per character, mean ± standard deviation over runs (seeds) "
            "where several share corpus, budget, layers and cell; the best cell of each row in "
            "bold. Full-data runs only.\n",
        ],
    )
    for budget, cells, rows in sections:
        markdown_rows, labelled, remarks = [], [], []
        for label, row in rows:
            seen = unequal_data(row)
            if seen is not None:
                label += " †"
                remarks.append(
                    f"† {label[:-2]}: the runs saw different amounts of training data "
                    f"({', '.join(f'{count:,}' for count in seen)} tokens); the comparison mixes data "
                    "with modelling (give every run the same --epochs, --train-fraction or --max-tokens)"
                )
                writer.notes.append(f"{budget}, {label[:-2]}: the runs compared saw different amounts of training data")
            ordering = ordering_note(row, cells)
            if ordering is not None:
                remarks.append(f"{label.rstrip(' †')}: {ordering}")
            best = [group is not None and group is best_of(row) for group in row]
            markdown_rows.append([label, *[loss_text(group, bold=bold) for group, bold in zip(row, best)]])
            labelled.append((label, row))
            csv_rows += [_csv_row(budget, group, bold) for group, bold in zip(row, best) if group is not None]
        markdown.append(
            f"## {budget} parameters\n\n"
            + _markdown(["corpus", *cells], markdown_rows)
            + "".join(f"\n- {remark}" for remark in remarks)
            + ("\n" if remarks else "")
        )
        writer.tables.append(table1_table(budget, cells, labelled, best_of))
    writer.table(
        "table1.csv",
        [
            "budget",
            "corpus",
            "layers",
            "cell",
            "runs",
            "test_loss",
            "test_loss_std",
            "test_bpc",
            "test_bpc_std",
            "status",
            "best",
        ],
        csv_rows,
    )
    writer.text("table1.md", "\n".join(markdown))


def write_efficiency(writer) -> None:
    """The statistical efficiency: test bpc at each fraction of the training data, and its figure."""
    if all(record.fraction == 1.0 for record in writer.records):
        writer.notes.append(
            "Every run trained on the whole training split: no statistical-efficiency comparison "
            "(train with --train-fraction 0.2, 0.4, ...)."
        )
        return
    rows = [
        [
            group.corpus,
            group.budget,
            group.layers,
            group.cell,
            group.fraction,
            len(group.runs),
            *stat_values(group.loss),
            *stat_values(group.bpc),
            group.status,
        ]
        for groups in efficiency_families(writer.groups).values()
        for group in groups
    ]
    writer.table(
        "efficiency.csv",
        [
            "corpus",
            "budget",
            "layers",
            "cell",
            "fraction",
            "runs",
            "test_loss",
            "test_loss_std",
            "test_bpc",
            "test_bpc_std",
            "status",
        ],
        rows,
    )
    writer.text("efficiency.md", efficiency_markdown(writer.groups, writer.reference))
    writer.figure("efficiency.png", figures.efficiency_lines, series.efficiency_lines(writer.groups, writer.colours))


def efficiency_markdown(groups: dict, reference: str) -> str:
    parts = [
        "# Statistical efficiency\n",
        f"Test bits per character at each fraction of the training split (mean over runs). The last column is "
        f"the fraction of the data a cell needs to reach the full-data test loss of the reference cell, "
        f"{reference}, interpolated linearly between measured fractions; ≤ marks a loss already reached "
        f"at the smallest fraction measured.\n",
    ]
    for (corpus, budget, layers), groups in efficiency_families(groups).items():
        fractions = sorted({group.fraction for group in groups})
        target = reference_loss(groups, reference)
        match = f"data to match {reference}" + ("" if target is None else f" ({target:.4f} nats)")
        rows = []
        for cell in sorted({group.cell for group in groups}):
            own = {group.fraction: group for group in groups if group.cell == cell}
            points = [(fraction, group.loss.mean) for fraction, group in own.items() if group.loss is not None]
            needed = "no full-data run of the reference" if target is None else needed_text(data_needed(points, target))
            rows.append([cell, *[bpc_text(own.get(fraction)) for fraction in fractions], needed])
        parts.append(
            f"## {corpus}, {budget} parameters, {layers_text(layers)}\n\n"
            + _markdown(["cell", *[f"bpc at {fraction:g}" for fraction in fractions], match], rows)
        )
    return "\n".join(parts)


def write_dynamic(writer) -> None:
    """Static against dynamic evaluation, per run and split evaluated."""
    rows = dynamic_rows(writer.records)
    if not rows:
        writer.notes.append("No dynamic evaluation recorded (`charlm eval RUN --dynamic sgd`): no dynamic table.")
        return
    pairs = dynamic_columns(writer.records)
    table = [
        [record.name, record.corpus, record.cell, split, static, *[by_protocol.get(pair) for pair in pairs]]
        for record, split, static, by_protocol in rows
    ]
    writer.table(
        "dynamic.csv",
        [
            "run",
            "corpus",
            "cell",
            "split",
            "static_bpc",
            *[f"{method}_{2 if after_valid else 1}_bpc" for method, after_valid in pairs],
        ],
        table,
    )
    writer.text(
        "dynamic.md",
        "# Static and dynamic evaluation\n\nBits per character of the evaluated split: static, "
        "and dynamic by method; #1 adapts on the evaluated split only, #2 first adapts over the whole "
        "validation split (Delta-RNN paper).\n\n"
        + _markdown(["run", "corpus", "cell", "split", "static bpc", *map(protocol_name, pairs)], table),
    )


def _csv_row(budget: str, group: Group, best: bool) -> list:
    return [
        budget,
        group.corpus,
        group.layers,
        group.cell,
        len(group.runs),
        *stat_values(group.loss),
        *stat_values(group.bpc),
        group.status,
        best,
    ]
