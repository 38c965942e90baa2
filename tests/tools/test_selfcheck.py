"""`charlm check`: the self-test runs on the CPU (its CUDA rows skipped), fails loudly on a fast path
that differs from the equations, and refuses bad input in one line."""

from __future__ import annotations

import json

import charlm.runtime.compiling
from charlm.cells.lstm import LSTM
from helpers import assert_fits, assert_one_line_error, cli, table_header, terminal_of


def check_json(*arguments):
    result = cli("check", "--device", "cpu", "--json", *arguments)
    return result, json.loads(result.stdout) if result.stdout.strip() else None


def test_check_passes_on_the_cpu_and_says_what_it_skipped():
    result, report = check_json("--cells", "lstm,rhn")
    assert result.returncode == 0, result.stderr
    assert report["failures"] == 0 and report["device"] == "cpu"
    rows = {row["check"]: row for row in report["rows"]}
    for cell in ("lstm", "rhn"):
        row = rows[f"{cell}: window, evaluation and sampling paths vs step (float64)"]
        assert row["result"] == "pass" and float(row["figure"]) < 1e-12 and row["tolerance"] == "1e-09"
        assert rows[f"{cell}: layer output types, bf16"]["result"] == "pass"
        assert rows[f"{cell}: training graph vs eager, 3 windows"]["result"] == "skipped: no CUDA device"
    assert rows["TensorFloat-32 off (--tf32 not given)"]["result"] == "pass"
    assert rows["synchronisations in one training step"]["result"] == "skipped: no CUDA device"


def test_a_fast_path_that_differs_from_the_equations_fails_the_check(monkeypatch):
    window = LSTM.forward

    def slightly_wrong(self, inputs, state, lookup=None):
        outputs, new_state = window(self, inputs, state, lookup)
        return outputs * (1 + 1e-6), new_state

    monkeypatch.setattr(LSTM, "forward", slightly_wrong)
    result, report = check_json("--cells", "lstm,gru")
    assert result.returncode == 1
    failed = [row for row in report["rows"] if row["result"] == "fail"]
    assert [row["check"] for row in failed] == [
        "lstm: window, evaluation and sampling paths vs step (float64)",
        "lstm in blocks (--wiring block): window, evaluation and sampling paths vs step (float64)",
        "lstm tied to its embedding (--tie-weights, a projection, --no-head-bias): window, evaluation and "
        "sampling paths vs step (float64)",
    ]
    assert float(failed[0]["figure"]) > 1e-9
    terminal_of(monkeypatch, 80)  # issue 34: the table fits, and a line sums it up at its end
    table = cli("check", "--device", "cpu", "--cells", "lstm,gru")
    assert table.returncode == 1 and "charlm check on cpu: 3 failure(s)" in table.stdout
    assert_fits(table.stdout)
    assert table_header(table.stdout)[:3] == ["check", "result", "figure"]
    results = [row["result"] for row in report["rows"]]
    skipped = sum(result.startswith("skipped:") for result in results)
    assert table.stdout.splitlines()[-1] == (
        f"{results.count('pass')} pass, 3 fail, {skipped} skipped, {results.count('info')} info"
    )
    assert results.count("pass") + 3 + skipped + results.count("info") == len(results) and skipped > 0


def test_compiled_steps_are_checked_with_recompilation_an_error(monkeypatch):
    monkeypatch.setattr(charlm.runtime.compiling, "BACKEND", "eager")  # tracing without code generation
    result, report = check_json("--cells", "gru", "--compile", "--precision", "fp32")
    assert result.returncode == 0, result.stderr
    (row,) = [row for row in report["rows"] if row["check"] == "gru: compiled step vs eager, 3 windows"]
    assert row["result"] == "pass" and float(row["figure"]) < 1e-5


def test_check_refuses_bad_input_in_one_line():
    assert_one_line_error(cli("check", "--device", "cpu", "--cells", "nope"), "unknown cell 'nope'")
    assert_one_line_error(
        cli("check", "--device", "cpu", "--precision", "fp16"), "--precision fp16 needs a CUDA device, not cpu"
    )
    assert_one_line_error(
        cli("check", "--device", "cpu", "--precision", "fp64"), "--precision 'fp64' is not one of fp32, bf16, fp16"
    )
    assert_one_line_error(cli("check", "--device", "cpu", "--cells", ","), "--cells names no cell")
