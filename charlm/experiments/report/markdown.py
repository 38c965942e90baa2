"""Tables as Markdown, and values as the report shows them (in its Markdown and CSV files)."""

from __future__ import annotations

from charlm.experiments.report.compare import Group, Stat


def display(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def markdown_table(columns: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + " --- |" * len(columns)]
    lines += ["| " + " | ".join(display(value).replace("|", "\\|") for value in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def loss_text(group: Group | None, *, bold: bool = False) -> str:
    """``1.2345 ± 0.0100 nats · 1.7810 ± 0.0144 bpc (2 runs; 1 interrupted)``, or a status alone."""
    if group is None:
        return "–"
    if group.loss is None:
        return group.status
    text = f"{plus_minus(group.loss)} nats · {plus_minus(group.bpc)} bpc"
    notes = [f"{len(group.runs)} runs"] if len(group.runs) > 1 else []
    notes += [] if group.status == "finished" else [group.status]
    text = f"**{text}**" if bold else text
    return text + (f" ({'; '.join(notes)})" if notes else "")


def plus_minus(stat: Stat | None) -> str:
    if stat is None:
        return "-"
    return f"{stat.mean:.4f}" if stat.std is None else f"{stat.mean:.4f} ± {stat.std:.4f}"


def needed_text(needed: tuple[float | None, bool]) -> str:
    fraction, upper_bound = needed
    if fraction is None:
        return "not reached"
    return f"≤ {fraction:.2f}" if upper_bound else f"{fraction:.2f}"


def stat_values(stat: Stat | None) -> list:
    return [None, None] if stat is None else [stat.mean, stat.std]


def bpc_text(group: Group | None) -> str:
    if group is None:
        return "–"
    if group.bpc is None:
        return group.status
    return f"{group.bpc.mean:.4f}" + ("" if group.status == "finished" else f" ({group.status})")


def csv_value(value) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value) if isinstance(value, float) else str(value)
