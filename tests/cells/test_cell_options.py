"""Every built-in cell's options are declared as the training settings are (``setting(...)``): each value
just past a declared bound, and a value outside the declared choices, is refused in one line naming
the cell, the option, the value and its range; `charlm cells CELL` shows each option's range."""

import dataclasses

import pytest

from charlm.cells import CELLS, parse_cell_options
from charlm.errors import CharlmError
from charlm.settings import bound_text
from helpers import cli

OPTIONS = [(cell.name, field) for cell in CELLS for field in dataclasses.fields(cell.Config)]


def beyond(meta) -> list:
    """Values just outside the bounds ``meta`` declares: below its minimum, above its maximum."""
    values = []
    low, high = meta["min"], meta["max"]
    if low is not None:
        values.append(low if meta["min_open"] else low - 1)
    if high is not None:
        values.append(high if meta["max_open"] else high + 1)
    return values


def test_every_option_of_a_built_in_cell_is_declared_with_its_help():
    assert len(OPTIONS) >= 50
    undeclared = [f"{cell}.{field.name}" for cell, field in OPTIONS if not field.metadata.get("help")]
    assert not undeclared, f"declare these with charlm.settings.setting(...): {undeclared}"


@pytest.mark.parametrize("cell, field", OPTIONS, ids=[f"{cell}-{field.name}" for cell, field in OPTIONS])
def test_a_value_outside_an_option_s_declaration_is_refused_in_one_line(cell, field):
    meta = field.metadata
    choices = meta["choices"]
    outside = ([max(choices) + 1] if isinstance(choices[0], int) else ["sideways"]) if choices else beyond(meta)
    for value in outside:
        with pytest.raises(CharlmError) as caught:
            parse_cell_options(CELLS.get(cell), {field.name: str(value)})
        message = str(caught.value)
        expected = f"one of {', '.join(map(str, meta['choices']))}" if meta["choices"] else bound_text(meta)
        assert message.startswith(f"bad option for cell {cell!r}: {field.name} must be {expected}, not "), message
        assert str(value) in message and "\n" not in message


def test_a_config_built_in_python_is_checked_as_the_cell_is_built():
    mamba = CELLS.get("mamba")
    with pytest.raises(CharlmError, match="bad option for cell 'mamba': state_size must be at least 1, not 0"):
        mamba(8, 8, mamba.Config(state_size=0))


@pytest.mark.parametrize("cell", CELLS.names())
def test_cells_command_shows_each_option_with_its_range(cell, monkeypatch):
    from charlm.cli import output

    monkeypatch.setattr(output.stdout, "width", 400)  # a row a line
    text = cli("cells", cell, check_code=0).stdout
    fields = dataclasses.fields(CELLS.get(cell).Config)
    if not fields:
        assert text.strip() == f"{cell}: no options"
    for field in fields:
        row = next(line for line in text.splitlines() if line.startswith(f"│ {field.name} "))
        meta = field.metadata
        allowed = "one of: " + ", ".join(map(str, meta["choices"])) if meta["choices"] else bound_text(meta) or "-"
        assert allowed.lower() in row and meta["help"] in row, row
