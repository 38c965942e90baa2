"""Tables as Markdown, and values as the report shows them."""

from __future__ import annotations


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
