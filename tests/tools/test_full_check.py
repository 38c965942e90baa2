"""`charlm check --full`: every step on the CPU at its small sizes (the CUDA-only parts skipped,
saying so), a step that runs out of time named, and the verdicts on given figures."""

import json

import pytest

from charlm.tools.full_check_report import bench_problems, performance_notes, training_verdicts
from helpers import assert_one_line_error, cli


@pytest.mark.slow  # every step of --full in turn: each has tests of its own, and the next test runs --full's machinery
def test_full_check_runs_every_step_on_the_cpu_and_writes_both_reports(tmp_path):
    out = tmp_path / "report"
    result = cli("check", "--full", "--device", "cpu", "--cells", "gru", "--out", out, "--budget", "4")
    assert result.returncode == 0, result.stderr
    report = json.loads((out / "report.json").read_text())
    steps = {step["name"]: step["status"] for step in report["steps"]}
    assert steps == {
        "check": "pass",
        "cuda tests": "skipped: no CUDA device (the cuda tests are skipped there)",
        "benchmark": "pass",
        "training": "pass",
        "benchmark (compile)": "skipped: compiling every cell takes minutes on a CPU (charlm bench --compile)",
    }
    assert report["failures"] == [] and report["out_of_time"] == []
    assert report["environment"]["torch"] and report["environment"]["device"] == "cpu"
    assert {row["check"] for row in report["check"]} >= {"gru: window, evaluation and sampling paths vs step (float64)"}
    assert set(report["benchmark"]) == {"fp32", "bf16"}
    for table in report["benchmark"].values():
        assert [r["name"] for r in table["results"]] == ["torch.nn.LSTM (fused)", "gru"]
    (run,) = report["training"]
    assert run["cell"] == "gru" and run["mode"] == "eager" and 0 < run["valid_bpc"] < 10 and run["first_loss"] > 0
    markdown = (out / "report.md").read_text()
    for heading in ("## Steps", "## check", "## Benchmark, fp32", "## Benchmark, bf16", "## Training"):
        assert heading in markdown
    assert "report.md" in result.stdout
    assert not list(out.glob("runs/*/*.pt"))  # the records are kept, not the weights


def test_a_step_past_its_share_of_the_budget_is_named_and_the_run_fails(tmp_path):
    out = tmp_path / "report"
    result = cli("check", "--full", "--device", "cpu", "--cells", "gru", "--out", out, "--budget", "0.01")
    assert result.returncode == 1
    report = json.loads((out / "report.json").read_text())
    assert "check" in report["out_of_time"]
    assert any(line.startswith("failed: check: out of time (check ran past its") for line in result.stderr.splitlines())
    assert (out / "logs" / "check.txt").read_text().count("out of time after") == 1


def test_full_check_errors(tmp_path):
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "file").write_text("x")
    assert_one_line_error(
        cli("check", "--full", "--device", "cpu", "--out", tmp_path / "taken"),
        f"--out {tmp_path / 'taken'} already exists and is not an empty directory: give a new one",
    )
    assert_one_line_error(
        cli("check", "--device", "cpu", "--out", tmp_path / "new"),
        "--out is where --full writes its report: give --full too",
    )
    assert_one_line_error(
        cli("check", "--full", "--device", "cpu", "--compile"),
        "--full checks every precision and compiles in its benchmark",
    )
    assert_one_line_error(cli("check", "--full", "--device", "cpu", "--budget", "0"), "--budget is 0 minutes")


def test_a_graphed_training_fails_on_the_early_loss_and_notes_the_late_gap():
    eager = {"cell": "rnn", "mode": "eager", "first_loss": 3.58, "valid_bpc": 3.58}
    graph = {"active": True, "checked": True, "failure": None}
    rows = training_verdicts(
        [eager, {"cell": "rnn", "mode": "cuda graph", "first_loss": 3.58, "valid_bpc": 3.98, "cuda_graph": graph}],
        cuda=True,
    )
    assert "problem" not in rows[1] and rows[1]["note"].startswith("validation bpc 3.9800 against eager 3.5800")
    rows = training_verdicts(
        [
            dict(eager),
            {"cell": "rnn", "mode": "cuda graph", "first_loss": 3.70, "valid_bpc": 3.58, "cuda_graph": graph},
        ],
        cuda=True,
    )
    assert rows[1]["problem"] == "loss at step 10 3.70000 against eager 3.58000"
    rows = training_verdicts(
        [
            dict(eager),
            {
                "cell": "rnn",
                "mode": "cuda graph",
                "first_loss": 3.58,
                "valid_bpc": 3.58,
                "cuda_graph": {"active": False, "checked": False, "failure": "capture failed"},
            },
        ],
        cuda=True,
    )
    assert rows[1]["problem"] == "graphs not used: capture failed"
    assert (
        training_verdicts([{"cell": "lru", "mode": "eager", "error": "CharlmError: x"}], cuda=False)[0]["problem"]
        == "CharlmError: x"
    )


def result_row(name, rate, per_flop=1.0, train_path="eager", eval_path="cuda graph", dtypes=("float32",)):
    return {
        "name": name,
        "train_chars_per_second": {"median": rate},
        "train_ratio_flop_normalised": per_flop,
        "train_path": train_path,
        "eval_path": eval_path,
        "layer_dtypes": list(dtypes),
    }


def test_benchmark_verdicts_and_the_performance_goal():
    baseline = result_row("torch.nn.LSTM (fused)", 100.0, eval_path="eager")
    graphed = {
        "results": [
            baseline,
            result_row("gru", 90.0, 0.9, "cuda graph"),
            result_row("rhn", 30.0, 0.3, "cuda graph"),
            result_row("rnn", 40.0, 0.4, "eager (capture failed)", dtypes=("float16",)),
        ]
    }
    assert bench_problems("bf16 + graphs", graphed, cuda=True) == [
        "rnn: training eager (capture failed)",
        "rnn: a layer ran in float16 under bf16",
    ]
    assert bench_problems("fp32", {"results": [baseline, result_row("gru", 1.0, eval_path="eager")]}, cuda=False) == []
    eager = {"results": [baseline, result_row("gru", 50.0), result_row("rhn", 40.0), result_row("rnn", 40.0)]}
    notes = performance_notes({"bf16": eager, "bf16 + graphs": graphed})
    assert notes["below_goal_per_flop"] == [{"cell": "rhn", "ratio": 0.3}, {"cell": "rnn", "ratio": 0.4}]
    assert notes["graphs_slower_than_eager"] == [{"cell": "rhn", "graphs_over_eager": 0.75}]
