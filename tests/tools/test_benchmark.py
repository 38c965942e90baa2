"""`charlm bench`: interleaved rounds, medians, ratios against the fused LSTM, FLOPs from the equations."""

from __future__ import annotations

import json
import re
import statistics

import pytest
import torch

from charlm.tools.benchmark import training_flops_per_char
from charlm.model import LanguageModel, ModelConfig
from helpers import assert_fits, cli, table_header, table_lines, terminal_of


def test_flops_per_character_are_those_of_the_equations():
    """GRU: three gates of W x and U h (2dn + 2n² each), the softmax layer 2nV; × 3 for forward and backward."""
    n, vocab = 10, 7
    model = LanguageModel(ModelConfig("gru", vocab_size=vocab, hidden_size=n))
    assert training_flops_per_char(model) == 3 * (3 * (2 * n * n + 2 * n * n) + 2 * n * vocab)
    lstm = LanguageModel(ModelConfig("lstm", vocab_size=vocab, hidden_size=n))
    assert training_flops_per_char(lstm) == 3 * (4 * (2 * n * n + 2 * n * n) + 2 * n * vocab)


def test_bench_reports_medians_of_interleaved_rounds_as_json():
    result = cli(
        "bench",
        "--cells",
        "gru,lru",
        "--params",
        "20k",
        "--batch-size",
        "4",
        "--bptt",
        "5",
        "--steps",
        "1",
        "--repeat",
        "3",
        "--sample-length",
        "5",
        "--device",
        "cpu",
        "--json",
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["machine"]["threads"] >= 1 and report["settings"]["repeat"] == 3
    rows = {row["name"]: row for row in report["results"]}
    assert list(rows) == ["torch.nn.LSTM (fused)", "gru", "lru"]
    baseline = rows["torch.nn.LSTM (fused)"]
    assert baseline["train_ratio"] == 1.0 and "sample_chars_per_second" not in baseline
    for name in ("gru", "lru"):
        row = rows[name]
        assert abs(row["parameters"] - 20_000) / 20_000 < 0.1
        runs = row["train_chars_per_second"]["runs"]
        assert len(runs) == 3 and row["train_chars_per_second"]["median"] == statistics.median(runs)
        per_round = [a / b for a, b in zip(runs, baseline["train_chars_per_second"]["runs"])]
        assert row["train_ratio"] == pytest.approx(statistics.median(per_round))
        scale = row["flops_per_char"] / baseline["flops_per_char"]
        assert row["train_ratio_flop_normalised"] == pytest.approx(row["train_ratio"] * scale)
        assert len(row["sample_chars_per_second"]["runs"]) == 3


def test_bench_table_names_machine_load_and_threads():
    result = cli(
        "bench",
        "--cells",
        "mgu",
        "--params",
        "10k",
        "--batch-size",
        "2",
        "--bptt",
        "3",
        "--steps",
        "1",
        "--repeat",
        "1",
        "--sample-length",
        "3",
        "--device",
        "cpu",
    )
    assert result.returncode == 0, result.stderr
    assert (
        "load" in result.stdout
        and "thread" in result.stdout
        and "× fused/FLOP" in result.stdout
        and "mgu" in result.stdout
    )


def test_bench_table_fits_80_columns(monkeypatch):
    """Issue 34: at 80 columns the least needed columns go; each model keeps its training and
    evaluation throughput and their ratios to the fused LSTM, whole, on its one line."""
    terminal_of(monkeypatch, 80)
    result = cli(
        "bench",
        "--cells",
        "mgu,ps-lru",
        "--params",
        "10k",
        "--batch-size",
        "2",
        "--bptt",
        "3",
        "--steps",
        "1",
        "--repeat",
        "1",
        "--sample-length",
        "3",
        "--device",
        "cpu",
        check_code=0,
    )
    assert_fits(result.stdout)
    assert table_header(result.stdout) == ["model", "train chars/s", "× fused", "eval chars/s", "× fused"]
    lines = table_lines(result.stdout)
    assert [line[0] for line in lines] == ["torch.nn.LSTM (fused)", "mgu", "ps-lru"]  # a row a line
    for line in lines:
        assert re.fullmatch(r"[\d,]+ ±\d+%", line[1]) and re.fullmatch(r"[\d,]+ ±\d+%", line[3]), line
        assert re.fullmatch(r"\d+\.\d\d", line[2]) and re.fullmatch(r"\d+\.\d\d", line[4]), line


def test_bench_in_bf16_and_with_compiled_cells(monkeypatch):
    """--precision runs every contender under autocast; --compile trains each cell through
    torch.compile (traced here with TorchDynamo's eager backend) and reports the compile time."""
    import charlm.tools.benchmark
    import charlm.runtime.compiling

    monkeypatch.setattr(charlm.runtime.compiling, "BACKEND", "eager")
    result = cli(
        "bench",
        "--cells",
        "gru",
        "--params",
        "10k",
        "--batch-size",
        "2",
        "--bptt",
        "3",
        "--steps",
        "1",
        "--repeat",
        "1",
        "--sample-length",
        "3",
        "--device",
        "cpu",
        "--precision",
        "bf16",
        "--compile",
        "--json",
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["settings"]["precision"] == "bf16" and report["settings"]["compile"]
    baseline, gru = report["results"]
    assert "compile_seconds" not in baseline and gru["compile_seconds"] > 0
    assert gru["precision"] == "bf16"
    # the fused LSTM runs in bf16 where this CPU has the instructions for it, else in float32
    assert baseline["precision"] == (
        "bf16" if charlm.tools.benchmark.fused_lstm_runs_in("bf16", torch.device("cpu")) else "fp32"
    )
    assert gru["train_chars_per_second"]["median"] > 0


def test_bench_in_fp16_needs_a_gpu():
    result = cli("bench", "--cells", "gru", "--device", "cpu", "--precision", "fp16")
    assert result.returncode == 2 and result.stderr.strip() == (
        "charlm: error: --precision fp16 needs a CUDA device, not cpu (bf16 runs on the CPU)"
    )
