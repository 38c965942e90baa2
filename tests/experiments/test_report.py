"""`charlm report`: the papers' tables and figures over a small trained sweep, checked against the
runs' own metrics.jsonl; unfinished runs, dynamic evaluation, one run, byte-identical reruns, errors."""

from __future__ import annotations

import csv
import json
import re
import shutil
import statistics
import struct
from pathlib import Path

import pytest

import charlm
from charlm.experiments.report.compare import data_needed
from charlm.experiments.report.reading import budget_label, device_label, read_runs
from charlm.experiments.report.write import build_report
from charlm.training.trainer import Trainer
from helpers import assert_one_line_error, cli, prepare_tiny_corpus, records, table_lines

SWEEP_FILES = {
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
}
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def config(data_dir, run_dir, **changes) -> charlm.TrainConfig:
    values = dict(
        corpus="tiny",
        cell="lstm",
        params="3k",
        batch_size=8,
        bptt=16,
        eval_batch_size=4,
        epochs=2,
        lr=3e-3,
        log_every=5,
        test_every_epoch=True,
        data_dir=str(data_dir),
        run_dir=str(run_dir),
    )
    return charlm.TrainConfig(**{**values, **changes})


def best_epoch_record(run: Path) -> dict:
    """The epoch record of the best validation loss: the last one flagged best."""
    return [row for row in records(run, "epoch") if row["best"]][-1]


def keep_records(run: Path, keep) -> None:
    rows = [row for row in records(run) if keep(row)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> Path:
    """A sweep directory: on `tiny`, lstm and gru × train fractions 0.5 and 1 × seeds 1 and 2; on
    `small`, a finished lstm, a copy of it that diverged at once, and a gru interrupted after its
    first epoch. The first tiny lstm is also evaluated dynamically (sgd, #1 and #2)."""
    root = tmp_path_factory.mktemp("report")
    data = root / "data"
    prepare_tiny_corpus(data, "tiny", characters=12_000)
    prepare_tiny_corpus(data, "small", characters=8_000)
    runs = root / "sweep"
    for cell in ("lstm", "gru"):
        for fraction in (0.5, 1.0):
            for seed in (1, 2):
                Trainer(
                    config(
                        data, runs / f"tiny-{cell}-f{fraction:g}-s{seed}", cell=cell, train_fraction=fraction, seed=seed
                    )
                ).fit()
    for cell in ("lstm", "gru"):
        Trainer(config(data, runs / f"small-{cell}", corpus="small", cell=cell)).fit()
    keep_records(
        runs / "small-gru", lambda row: row["event"] != "end" and not (row["event"] == "epoch" and row["epoch"] == 2)
    )
    shutil.copytree(runs / "small-lstm", runs / "small-lstm-diverged")
    keep_records(runs / "small-lstm-diverged", lambda row: row["event"] == "start")
    with (runs / "small-lstm-diverged" / "metrics.jsonl").open("a") as handle:
        handle.write(json.dumps({"event": "diverged", "epoch": 1, "step": 3, "loss": float("nan")}) + "\n")
    model = charlm.load(runs / "tiny-lstm-f1-s1")
    model.evaluate("test", dynamic="sgd", data_dir=data)
    model.restore()
    model.evaluate("test", dynamic="sgd", data_dir=data, adapt_on="valid")
    return runs


@pytest.fixture(scope="module")
def report(sweep, tmp_path_factory) -> tuple[Path, str]:
    """The sweep's report directory, and what the command printed."""
    out = tmp_path_factory.mktemp("report-out") / "report"
    result = cli("report", sweep, "--out", out, check_code=0)
    return out, result.stdout


def read_csv(path: Path) -> list[dict]:
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE and data[12:16] == b"IHDR", path
    return struct.unpack(">II", data[16:24])


def test_report_writes_every_table_and_figure(report):
    out, stdout = report
    assert {path.name for path in out.iterdir()} == SWEEP_FILES
    index = (out / "index.md").read_text()
    for name in SWEEP_FILES - {"index.md"}:
        assert f"]({name})" in index, name
    assert "Report on 11 runs" in index and "| small-gru | small | gru |" in index
    assert "Table 1, 3k parameters" in stdout and f"report: {out / 'index.md'} (13 files)" in stdout


def test_table1_is_the_test_loss_at_the_best_validation_epoch(report, sweep):
    out, _ = report
    rows = {(row["corpus"], row["cell"]): row for row in read_csv(out / "table1.csv")}
    assert set(rows) == {("tiny", "lstm"), ("tiny", "gru"), ("small", "lstm"), ("small", "gru")}
    for cell in ("lstm", "gru"):
        best = [best_epoch_record(sweep / f"tiny-{cell}-f1-s{seed}") for seed in (1, 2)]
        row = rows[("tiny", cell)]
        assert row["runs"] == "2" and row["status"] == "finished" and row["budget"] == "3k"
        assert float(row["test_loss"]) == pytest.approx(statistics.fmean(r["test_loss"] for r in best), rel=1e-12)
        assert float(row["test_loss_std"]) == pytest.approx(statistics.stdev(r["test_loss"] for r in best), rel=1e-9)
        assert float(row["test_bpc"]) == pytest.approx(statistics.fmean(r["test_bpc"] for r in best), rel=1e-12)
    lower = min(("lstm", "gru"), key=lambda cell: float(rows[("tiny", cell)]["test_loss"]))
    assert {cell: rows[("tiny", cell)]["best"] for cell in ("lstm", "gru")} == {
        cell: "true" if cell == lower else "false" for cell in ("lstm", "gru")
    }
    table = (out / "table1.md").read_text()
    assert f"**{float(rows[('tiny', lower)]['test_loss']):.4f} ±" in table and "(2 runs)" in table


def test_unfinished_runs_are_shown_with_their_status(report, sweep):
    out, stdout = report
    rows = {(row["corpus"], row["cell"]): row for row in read_csv(out / "table1.csv")}
    gru = rows[("small", "gru")]
    assert (
        gru["status"] == "interrupted"
        and float(gru["test_loss"]) == best_epoch_record(sweep / "small-gru")["test_loss"]
    )
    lstm = rows[("small", "lstm")]
    assert lstm["runs"] == "2" and lstm["status"] == "1 finished, 1 diverged" and lstm["test_loss_std"] == ""
    assert float(lstm["test_loss"]) == best_epoch_record(sweep / "small-lstm")["test_loss"]
    table = (out / "table1.md").read_text()
    assert re.search(r"bpc(\*\*)? \(interrupted\) \|", table)
    assert re.search(r"bpc(\*\*)? \(2 runs; 1 finished, 1 diverged\) \|", table)
    terminal = {(line[0], line[1]): line for line in table_lines(stdout)}  # a row per corpus and cell
    assert terminal[("small †", "gru")][2:] == [
        f"{float(gru['test_loss']):.4f}",
        f"{float(gru['test_bpc']):.4f}",
        "best; interrupted",
    ]
    assert terminal[("small †", "lstm")][4] == "2 runs; 1 finished, 1 diverged"
    convergence = {row["run"]: row for row in read_csv(out / "convergence.csv")}
    assert (
        convergence["small-lstm-diverged"]["status"] == "diverged"
        and convergence["small-lstm-diverged"]["best_epoch"] == ""
    )
    assert convergence["small-gru"]["epochs"] == "1"


def test_convergence_is_the_epoch_of_best_validation(report, sweep):
    out, _ = report
    rows = read_csv(out / "convergence.csv")
    assert sorted(row["run"] for row in rows) == sorted(path.name for path in sweep.iterdir() if path.is_dir())
    for row in rows:
        if row["status"] == "finished":
            best = best_epoch_record(sweep / row["run"])
            assert int(row["best_epoch"]) == best["epoch"] and float(row["test_bpc"]) == best["test_bpc"]
            seconds = sum(r["train_seconds"] for r in records(sweep / row["run"], "epoch"))
            assert float(row["train_seconds"]) == pytest.approx(seconds)


def test_efficiency_compares_fractions_with_the_reference(report, sweep):
    out, _ = report
    rows = read_csv(out / "efficiency.csv")
    assert {(row["cell"], row["fraction"]) for row in rows} == {(c, f) for c in ("lstm", "gru") for f in ("0.5", "1.0")}
    assert {row["corpus"] for row in rows} == {"tiny"}  # small has no partial-data run
    half = next(row for row in rows if row["cell"] == "gru" and row["fraction"] == "0.5")
    losses = [best_epoch_record(sweep / f"tiny-gru-f0.5-s{seed}")["test_loss"] for seed in (1, 2)]
    assert float(half["test_loss"]) == pytest.approx(statistics.fmean(losses), rel=1e-12)
    text = (out / "efficiency.md").read_text()
    assert "## tiny, 3k parameters, 1 layer" in text and "data to match gru (" in text


def test_data_needed_interpolates_between_fractions():
    points = [(0.2, 1.6), (0.6, 1.2), (1.0, 1.0)]
    assert data_needed(points, 1.4) == (pytest.approx(0.4), False)
    assert data_needed(points, 1.0) == (pytest.approx(1.0), False)
    assert data_needed(points, 1.7) == (0.2, True)
    assert data_needed(points, 0.9) == (None, False)


def test_runs_sized_by_hidden_share_a_budget_of_their_rounded_count():
    assert budget_label("10M", 9_998_123) == ("10M", 1e7)
    assert budget_label(None, 1_849_123) == ("≈1.8M", 1.8e6) and budget_label(None, 1_812_000)[0] == "≈1.8M"
    assert budget_label(None, 2_512) == ("≈2.5k", 2500.0) and budget_label(None, 96) == ("≈96", 96.0)


def test_a_plans_nominal_budget_groups_runs_sized_by_hidden(sweep, tmp_path):
    """lru-depth sizes each cell by --hidden to ≈0.9M per layer: its totals differ (GRU 1.84M, Grid
    LSTM 0.95M at 2 layers), and the report groups them under the plan's label, not their counts."""
    assert budget_label(None, 948_050, "≈0.9M per layer") == ("≈0.9M per layer", 9e5)
    assert budget_label("10M", 9_998_123, "≈0.9M per layer") == ("10M", 1e7)  # --params wins
    copied = tmp_path / "depth"
    for name, parameters in (("tiny-lstm-f1-s1", 3_000), ("tiny-gru-f1-s1", 5_000)):
        shutil.copytree(sweep / name, copied / name)
        settings = json.loads((copied / name / "config.json").read_text())
        settings["train"]["params"] = None  # sized by --hidden, to counts that differ
        (copied / name / "config.json").write_text(json.dumps(settings))
        rows = [{**row, "parameters": parameters} if "parameters" in row else row for row in records(copied / name)]
        (copied / name / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    assert len({run.budget for run in read_runs([copied])}) == 2  # ≈ their own, different counts
    (copied / "sweep.json").write_text(json.dumps({"plan": "depth", "budget": "≈3k per layer"}))
    assert {run.budget for run in read_runs([copied])} == {"≈3k per layer"}


def test_dynamic_table_holds_both_protocols(report, sweep):
    out, _ = report
    evaluations = records(sweep / "tiny-lstm-f1-s1", "eval")
    (row,) = read_csv(out / "dynamic.csv")
    assert row["run"] == "tiny-lstm-f1-s1" and row["split"] == "test"
    assert float(row["static_bpc"]) == evaluations[-1]["static_bpc"]
    assert float(row["sgd_1_bpc"]) == evaluations[0]["dynamic_bpc"]
    assert float(row["sgd_2_bpc"]) == evaluations[1]["dynamic_bpc"]
    assert "| static bpc | sgd #1 | sgd #2 |" in (out / "dynamic.md").read_text()


def test_figures_are_pngs_of_their_size(report):
    out, _ = report
    assert png_size(out / "curves.png") == (1000, 700)  # two corpora: a row each
    assert png_size(out / "progress.png") == (1000, 700)
    assert png_size(out / "convergence.png") == (600, 400)
    assert png_size(out / "efficiency.png") == (500, 400)  # one corpus with partial-data runs
    assert png_size(out / "gradnorms.png") == (800, 500)  # more than four runs: one heat map per cell


def test_a_second_report_is_byte_identical(report, sweep, tmp_path):
    out, _ = report
    cli("report", sweep, "--out", tmp_path / "again", check_code=0)
    for name in SWEEP_FILES:
        assert (tmp_path / "again" / name).read_bytes() == (out / name).read_bytes(), name


def test_one_run_gets_its_summary_curves_and_gradient_norms(sweep, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(sweep / "tiny-gru-f1-s1", run)
    result = cli("report", run, check_code=0)
    out = run / "report"
    assert {path.name for path in out.iterdir()} == {
        "index.md",
        "summary.md",
        "summary.csv",
        "curves.png",
        "progress.png",
        "gradnorms.png",
    }
    summary = {row["setting"]: row["value"] for row in read_csv(out / "summary.csv")}
    best = best_epoch_record(run)
    assert summary["run"] == "run" and summary["cell"] == "gru" and summary["status"] == "finished"
    assert (
        float(summary["test loss (nats) at best"]) == best["test_loss"] and int(summary["best epoch"]) == best["epoch"]
    )
    assert png_size(out / "curves.png") == (1000, 350) and png_size(out / "gradnorms.png") == (800, 250)
    assert ["test bpc at best", f"{best['test_bpc']:.4f}"] in table_lines(result.stdout)  # 4 decimals, as elsewhere
    assert "no dynamic table" in (out / "index.md").read_text()


def test_a_run_without_gradient_norms_says_so_and_stale_files_go(sweep, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(sweep / "tiny-lstm-f1-s2", run)
    keep_records(run, lambda row: row["event"] != "step")
    out = tmp_path / "out"
    build_report([sweep], out=out)
    report = build_report([run], out=out)
    assert sorted(report.files) == ["curves.png", "index.md", "progress.png", "summary.csv", "summary.md"]
    assert {path.name for path in out.iterdir()} == set(report.files)
    assert "No step record holds per-layer gradient norms" in (out / "index.md").read_text()


@pytest.mark.parametrize(
    "arguments, fragments",
    [
        (["{missing}", "--out", "{out}"], ["no such directory: ", "missing"]),
        (["{empty}", "--out", "{out}"], ["no runs under ", "empty"]),
        (
            ["{sweep}", "--out", "{out}", "--reference", "lru"],
            ["reference cell lru has no run here (cells: gru, lstm)"],
        ),
        (["{sweep}", "{empty}"], ["several directories: say where the report goes with --out REPORT_DIR"]),
    ],
)
def test_bad_input_is_one_line(arguments, fragments, sweep, tmp_path):
    (tmp_path / "empty").mkdir()
    places = {"missing": tmp_path / "missing", "empty": tmp_path / "empty", "sweep": sweep, "out": tmp_path / "out"}
    result = cli("report", *[argument.format(**places) for argument in arguments])
    assert_one_line_error(result, *fragments)
    assert not (tmp_path / "out").exists() and not (sweep / "report").exists()


def test_test_loss_scored_once_at_the_end_is_read_from_its_record(tiny_corpus, tmp_path):
    """Without --test-every-epoch, the best epoch's test loss is the run's one `test` record."""
    run = tmp_path / "runs" / "once"
    charlm.Trainer(config(tiny_corpus, run, test_every_epoch=False)).fit()
    (tested,) = records(run, "test")
    assert "test_loss" not in best_epoch_record(run)
    cli("report", run, "--out", tmp_path / "report", check_code=0)
    summary = {row["setting"]: row["value"] for row in read_csv(tmp_path / "report" / "summary.csv")}
    assert float(summary["test loss (nats) at best"]) == tested["test_loss"]


def test_a_comparison_of_runs_that_saw_different_data_is_marked(report, sweep):
    """Issue 22: the interrupted small gru trained one epoch, the small lstm two; the tiny runs all saw
    the same tokens. The report marks the first row, says why each run stopped, and says whether the
    tiny row's ordering is larger than its seed spread."""
    out, _ = report
    table = (out / "table1.md").read_text()
    assert "| small † |" in table and "| tiny |" in table
    tokens = {run: records(sweep / run, "epoch")[-1]["tokens_seen"] for run in ("small-lstm", "small-gru")}
    assert tokens["small-lstm"] == 2 * tokens["small-gru"]
    assert (
        f"† small: the runs saw different amounts of training data ({tokens['small-gru']:,}, "
        f"{tokens['small-lstm']:,} tokens)"
    ) in table
    assert re.search(
        r"- tiny: (lstm leads gru|gru leads lstm) by \d\.\d{4} nats, (larger than|within) their seed "
        r"spread \(±\d\.\d{4}, ±\d\.\d{4}\)",
        table,
    )
    index = (out / "index.md").read_text()
    assert "| tokens | stopped by |" in index
    rows = {line.split(" | ")[0].strip("| "): line for line in index.splitlines() if line.startswith("| ")}
    assert rows["tiny-lstm-f1-s1"].rstrip(" |").endswith("epochs")
    assert rows["small-gru"].rstrip(" |").endswith("interrupted")
    assert rows["small-lstm-diverged"].rstrip(" |").endswith("diverged")


def test_a_report_without_full_data_runs_still_prints_a_table(sweep, tmp_path):
    """Issue 24: with no run on all of the training data there is no Table 1; the runs are shown instead."""
    partial = tmp_path / "partial"
    for name in ("tiny-lstm-f0.5-s1", "tiny-gru-f0.5-s1"):
        shutil.copytree(sweep / name, partial / name)
    result = cli("report", partial, "--out", tmp_path / "out", check_code=0)
    assert "Runs (no run trained on all of the training data: no Table 1)" in result.stdout
    assert "tiny-lstm-f0.5-s1" in result.stdout and "0.5" in result.stdout


def test_an_axis_with_one_value_is_widened():
    from matplotlib.figure import Figure

    from charlm.experiments.report.figures import sensible_limits

    axes = Figure().subplots()
    axes.plot([50], [1.8], marker="o")
    sensible_limits(axes)
    assert axes.get_xlim() == (25.0, 75.0) and axes.get_ylim() == (0.8, 2.8)
    wide = Figure().subplots()
    wide.plot([1, 2], [1.5, 1.9])
    before = wide.get_xlim()
    sensible_limits(wide)
    assert wide.get_xlim() == before


def figures_saved(monkeypatch) -> list:
    """The matplotlib figures the report's figure functions save (their PNG files are written too)."""
    from charlm.experiments.report import figures

    saved, save = [], figures._save
    monkeypatch.setattr(figures, "_save", lambda figure, path: (saved.append(figure), save(figure, path)))
    return saved


def test_one_fraction_of_the_data_is_drawn_on_an_axis_from_0_to_1(monkeypatch, tmp_path):
    """Issue 42: a single fraction (0.25) was widened like any single value, to -0.75 … 1.25."""
    from charlm.experiments.report import figures

    saved = figures_saved(monkeypatch)
    figures.efficiency_lines({"tiny": [figures.Line("gru", "#1f77b4", [0.25], [4.5], [0.0])]}, tmp_path / "e.png")
    (axes,) = saved[0].axes
    assert axes.get_xlim() == (0.0, 1.05)


def test_the_triangles_of_validations_above_the_range_have_a_legend_entry(monkeypatch, tmp_path):
    from charlm.experiments.report import figures
    from charlm.experiments.report.reading import Point

    saved = figures_saved(monkeypatch)
    trained = [Point(tokens, tokens / 100, bpc) for tokens, bpc in ((100, 6.0), (1000, 3.0), (2000, 2.5), (3000, 2.4))]
    run = figures.Progress("gru", "#1f77b4", trained, [Point(1500, 15, 8.5), Point(3000, 30, 2.45)])
    figures.progress_curves({"tiny": ("cpu", [run])}, tmp_path / "p.png")
    by_tokens = saved[0].axes[0]
    assert [text.get_text() for text in by_tokens.get_legend().get_texts()] == ["gru", figures.ABOVE_THE_RANGE]
    calm = figures.Progress("gru", "#1f77b4", trained, [Point(3000, 30, 2.45)])
    figures.progress_curves({"tiny": ("cpu", [calm])}, tmp_path / "calm.png")
    assert [text.get_text() for text in saved[1].axes[0].get_legend().get_texts()] == ["gru"]


def test_step_records_say_how_far_training_has_come(sweep):
    """Each step record carries the run's training tokens and seconds so far; they grow, and end at
    most at the epochs' own counts."""
    run = sweep / "tiny-lstm-f1-s1"
    steps, epochs = records(run, "step"), records(run, "epoch")
    assert len(steps) >= 4
    tokens, seconds = [row["tokens"] for row in steps], [row["seconds"] for row in steps]
    assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens) and seconds == sorted(seconds)
    assert tokens[-1] <= epochs[-1]["tokens_seen"]
    assert seconds[-1] <= sum(row["train_seconds"] for row in epochs) + 1e-3
    per_step = steps[0]["tokens"] / steps[0]["step"]  # a batch of whole windows, until an epoch's last
    inside = [row for row in steps if row["step"] < epochs[0]["step"]]
    assert [row["tokens"] for row in inside] == [row["step"] * per_step for row in inside]


def test_progress_of_runs_written_before_0_4_is_placed_between_epoch_ends(sweep, tmp_path):
    """Step records without tokens and seconds (charlm 0.3) are placed by their step between the epoch
    ends; with steps of (nearly) equal size that is about where the newer records say they are."""
    run = tmp_path / "old"
    shutil.copytree(sweep / "tiny-lstm-f1-s1", run)
    (exact,) = read_runs([run])
    keep_records(run, lambda row: True)
    rows = [
        {k: v for k, v in row.items() if row["event"] != "step" or k not in ("tokens", "seconds")}
        for row in records(run)
    ]
    (run / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    (placed,) = read_runs([run])
    assert [p.tokens for p in placed.trained] == pytest.approx([p.tokens for p in exact.trained], rel=0.02)
    assert [p.bpc for p in placed.trained] == [p.bpc for p in exact.trained]
    assert [p.tokens for p in placed.validated] == [row["tokens_seen"] for row in records(run, "epoch")]


def test_the_device_labels_the_time_axis():
    assert device_label({"device": "cuda", "device_name": "NVIDIA H200", "threads": 16}) == "NVIDIA H200"
    assert device_label({"device": "cpu", "device_name": "x86_64", "threads": 2}) == "cpu (x86_64, 2 threads)"
    assert device_label({"device": "cpu", "device_name": "x86_64", "threads": 1}) == "cpu (x86_64, 1 thread)"
    assert device_label({}) is None


def test_cells_at_their_own_depths_share_a_row(sweep, tmp_path):
    """The eras plan compares cells at equal parameters, each at its own depth (rhn 1 layer, the
    transformer 4): one row per corpus, the depth beside each cell."""
    copied = tmp_path / "eras"
    for name in ("tiny-lstm-f1-s1", "tiny-gru-f1-s1"):
        shutil.copytree(sweep / name, copied / name)
    settings = json.loads((copied / "tiny-gru-f1-s1" / "config.json").read_text())
    settings["model"]["layers"] = 2
    (copied / "tiny-gru-f1-s1" / "config.json").write_text(json.dumps(settings))
    build_report([copied], out=tmp_path / "out")
    table = (tmp_path / "out" / "table1.md").read_text()
    assert "| corpus | gru (2 layers) | lstm (1 layer) |" in table
    assert len([line for line in table.splitlines() if line.startswith("| tiny")]) == 1


def test_runs_from_several_machines_report_together_and_protocols_apart(sweep, tmp_path):
    """Two directories of runs copied without their weights, as from other machines, make one report; runs of
    one cell under another protocol (here a larger batch) never share a cell of its tables."""
    here, there = tmp_path / "here", tmp_path / "there"
    for name, target in (("tiny-lstm-f1-s1", here), ("tiny-gru-f1-s1", here), ("tiny-lstm-f1-s2", there)):
        shutil.copytree(sweep / name, target / name, ignore=shutil.ignore_patterns("*.pt"))
    merged = cli("report", here, there, "--out", tmp_path / "merged", check_code=0)
    table1 = read_csv(tmp_path / "merged" / "table1.csv")
    assert "warning" not in merged.stderr and {row["cell"] for row in table1} >= {"lstm", "gru"}
    config = json.loads((there / "tiny-lstm-f1-s2" / "config.json").read_text())
    config["train"]["batch_size"] = 4
    (there / "tiny-lstm-f1-s2" / "config.json").write_text(json.dumps(config))
    apart = cli("report", here, there, "--out", tmp_path / "apart", check_code=0)
    assert "warning: the lstm runs on tiny trained under 2 protocols" in apart.stderr
    cells = {row["cell"] for row in read_csv(tmp_path / "apart" / "table1.csv")}
    assert "lstm" not in cells and len([cell for cell in cells if cell.startswith("lstm@")]) == 2
