"""The one rule of charlm's tables (``charlm.cli.output.print_table``): to fit the terminal, leave
out the least needed columns, never break a figure. Each command's table at 80 columns is tested
next to the command's other tests."""

from charlm.cli import output
from helpers import assert_fits, table_header, table_lines, terminal_of

COLUMNS = ["name", "figure", "extra", "notes"]
ROWS = [["a-long-row-name", "12,345,678", "x" * 30, "some free text that wraps " * 4], ["b", "1.2345", "y", "short"]]


def printed(capsys, monkeypatch, columns: int, **options) -> str:
    terminal_of(monkeypatch, columns)
    output.print_table("a title long enough to be wrapped at a narrow terminal's width", COLUMNS, ROWS, **options)
    return capsys.readouterr().out


def test_a_wide_terminal_shows_every_column_a_row_a_line(capsys, monkeypatch):
    text = printed(capsys, monkeypatch, 200, drop_order=("extra",), wrap=("notes",))
    assert table_header(text) == COLUMNS and len(table_lines(text)) == len(ROWS)


def test_columns_go_in_their_order_and_free_text_wraps_with_room(capsys, monkeypatch):
    text = printed(capsys, monkeypatch, 80, drop_order=("extra", "figure"), wrap=("notes",))
    assert_fits(text)
    assert table_header(text) == ["name", "figure", "notes"]  # "extra" was enough
    lines = table_lines(text)
    assert [line[:2] for line in lines if line[0]] == [row[:2] for row in ROWS]  # whole, on the row's first line
    assert all(len(line[2]) > 24 for line in lines[:-2])  # the wrapped text has the room left, not a word a line


def test_identifying_columns_stay_whole_even_wider_than_the_terminal(capsys, monkeypatch):
    text = printed(capsys, monkeypatch, 20, drop_order=("extra",), wrap=("notes",))
    assert table_header(text) == ["name", "figure", "notes"]
    assert [line[:2] for line in table_lines(text) if line[0]] == [row[:2] for row in ROWS]  # never cut
    assert all(len(line) <= 20 for line in text.splitlines() if not line.startswith(("┃", "│", "┏", "┡", "└")))
    assert max(map(len, text.splitlines())) == 1 + 3 * 3 + 15 + 10 + output.NARROWEST  # notes narrowed to NARROWEST

    text = printed(capsys, monkeypatch, 20)  # without a drop order every column is kept whole
    assert table_header(text) == COLUMNS and len(table_lines(text)) == len(ROWS)


def test_a_name_too_long_to_share_a_line_with_the_figures_stands_above_them(capsys, monkeypatch):
    """Issue 42: rather than cut a row's name (a run directory), it goes on a line of its own."""
    text = printed(capsys, monkeypatch, 30, drop_order=("extra",), wrap=("notes",))
    assert_fits(text, 30)
    assert text.splitlines()[3:6] == ["┏━━━━━━━━━━━━┳━━━━━━━━━━━━━━━┓", "┃ name", "┃ figure     ┃ notes         ┃"]
    assert "│ a-long-row-name\n│ 12,345,678 │ some free     │\n" in text and "│ b\n│ 1.2345     │ short" in text
    assert table_header(text) == ["name", "figure", "notes"]
    assert [line[:2] for line in table_lines(text) if line[0]] == [row[:2] for row in ROWS]
