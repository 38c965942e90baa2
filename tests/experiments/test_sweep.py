"""`charlm sweep`: plans, the grid, skipping and resuming, shards, dry runs, the shipped plans, errors."""

from __future__ import annotations

import dataclasses
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from charlm.checkpoint import Checkpoint
from charlm.cells import CELLS
from charlm.errors import CharlmError
from charlm.experiments.plan import load_plan, shipped_plans
from charlm.model import LanguageModel, ModelConfig, count_parameters
from charlm.sizing import budget_of
from charlm.runs.directory import Run
from charlm.experiments.selection import select
from charlm.experiments.sweep import Sweep
from helpers import assert_fits, assert_one_line_error, cli, records, table_header, table_lines, terminal_of

TINY_PLAN = """
name = "tiny"
description = "two cells, two fractions"

[base]
corpus = "tiny"
hidden_size = 12
batch_size = 4
bptt = 16
epochs = 2
eval_batch_size = 8
log_every = 1
save_every = "20"

[axes]
cell = ["gru", "lstm"]
train_fraction = [0.05, 0.1]

[[eval]]
split = "valid"
"""


@pytest.fixture
def plan_file(tmp_path):
    path = tmp_path / "tiny.toml"
    path.write_text(TINY_PLAN, encoding="utf-8")
    return path


def sweep_args(plan_file, directory, data_dir, *extra):
    return ["sweep", plan_file, "--dir", directory, "--data-dir", data_dir, *extra]


def weights_of(run_dir):
    return Checkpoint.load(run_dir / "last.pt").weights


def test_sweep_survives_kill_9_and_a_rerun_skips_finished_and_resumes_interrupted(plan_file, tiny_corpus, tmp_path):
    killed = tmp_path / "killed"
    process = subprocess.Popen(
        [sys.executable, "-m", "charlm", *map(str, sweep_args(plan_file, killed, tiny_corpus))],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    second = killed / "cell-gru_train_fraction-0.1"

    def second_run_saved_mid_epoch():
        return bool(records(second, "checkpoint"))

    try:
        deadline = time.time() + 180
        while time.time() < deadline and not second_run_saved_mid_epoch() and process.poll() is None:
            time.sleep(0.05)
        process.send_signal(signal.SIGKILL)
        process.communicate(timeout=60)
    finally:
        process.kill()
    assert Run(killed / "cell-gru_train_fraction-0.05").status() == "finished"
    assert Run(second).status() == "interrupted"

    rerun = cli(*sweep_args(plan_file, killed, tiny_corpus), check_code=0)
    assert "[1/4] cell-gru_train_fraction-0.05: finished earlier; skipped" in rerun.stderr
    assert "[2/4] cell-gru_train_fraction-0.1: resuming" in rerun.stderr
    assert "sweep " in rerun.stdout and "4 finished" in rerun.stdout

    straight = tmp_path / "straight"
    cli(*sweep_args(plan_file, straight, tiny_corpus), check_code=0)
    for point in load_plan(plan_file).points():
        a, b = weights_of(killed / point.name), weights_of(straight / point.name)
        assert all((a[key] == b[key]).all() for key in a), point.name
        evals = records(killed / point.name, "eval")
        assert [(row["split"], row["mode"]) for row in evals] == [("valid", "static")]  # evaluated once

    again = cli(*sweep_args(plan_file, killed, tiny_corpus), check_code=0)
    assert again.stderr.count("finished earlier; skipped") == 4


def test_three_processes_on_one_sweep_directory_train_every_point_once(plan_file, tiny_corpus, tmp_path):
    """Several `charlm sweep` processes without --shard share a directory: each takes the next point nobody
    trains, and one process evaluates each. One that loses the race for a point (to train it, to evaluate
    it, or finding it trained since it looked) says it skipped it, never that the point could not run."""
    directory = tmp_path / "shared"
    command = [sys.executable, "-m", "charlm", *map(str, sweep_args(plan_file, directory, tiny_corpus))]
    processes = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(3)]
    outputs = [process.communicate(timeout=300) for process in processes]
    assert [process.returncode for process in processes] == [0, 0, 0]
    logs = "".join(stderr for _, stderr in outputs)
    assert "not run" not in logs
    points = [point.name for point in load_plan(plan_file).points()]
    assert sorted(line.split()[1].rstrip(":") for line in logs.splitlines() if ": done in " in line) == sorted(points)
    assert all(Run(directory / name).status() == "finished" for name in points)
    assert [len(records(directory / name, "eval")) for name in points] == [1] * len(points)  # evaluated once


def test_shards_cover_every_point_exactly_once(plan_file):
    points = load_plan(plan_file).points()
    for count in (1, 2, 3, 5):
        shares = [select(points, shard=(index, count)) for index in range(count)]
        names = sorted(point.name for share in shares for point in share)
        assert names == sorted(point.name for point in points)
    assert [p.name for p in select(points, ["cell=lstm"])] == [
        "cell-lstm_train_fraction-0.05",
        "cell-lstm_train_fraction-0.1",
    ]
    assert [p.name for p in select(points, ["cell=lstm", "train_fraction=0.1"])] == ["cell-lstm_train_fraction-0.1"]


def test_dry_run_lists_sizes_without_training(plan_file, tiny_corpus, tmp_path):
    text = plan_file.read_text().replace("hidden_size = 12", 'params = "5k"')
    plan_file.write_text(text)
    result = cli(*sweep_args(plan_file, tmp_path / "sweep", tiny_corpus, "--dry-run"), check_code=0)
    plan = load_plan(plan_file)
    sweep = Sweep(plan, tmp_path / "sweep", data_dir=tiny_corpus)
    for point in plan.points():
        row = sweep.describe(point)
        assert abs(row["parameters"] - 5000) < 0.1 * 5000 and row["state"] == "new"
        assert point.name in result.stdout and f"{row['parameters']:,}" in result.stdout
    assert not (tmp_path / "sweep").exists()


def test_diverged_run_is_recorded_and_the_sweep_goes_on(tiny_corpus, tmp_path):
    plan = tmp_path / "diverging.toml"
    plan.write_text(
        """
[base]
corpus = "tiny"
hidden_size = 12
batch_size = 8
epochs = 3
clip = 0.0
eval_batch_size = 8

[axes]
lr_decay = [1e38, 0.9]
""",
        encoding="utf-8",
    )
    result = cli(*sweep_args(plan, tmp_path / "sweep", tiny_corpus), check_code=0)
    assert "1 diverged, 1 finished" in result.stdout
    assert Run(tmp_path / "sweep" / "lr_decay-1e+38").status() == "diverged"
    again = cli(*sweep_args(plan, tmp_path / "sweep", tiny_corpus), check_code=0)
    assert "diverged earlier; kept as diverged" in again.stderr


LONG_DRY_RUNS = {("grid-lstm-parity", None)}  # 144 task points sized at up to 150 layers: about 10 s
DRY_RUNS = [
    pytest.param(
        name, profile, id=f"{profile}-{name}", marks=[pytest.mark.slow] if (name, profile) in LONG_DRY_RUNS else []
    )
    for profile in (None, "small")
    for name in sorted(shipped_plans())
]


@pytest.mark.parametrize("name, profile", DRY_RUNS)
def test_shipped_plans_pass_a_dry_run(name, profile, tmp_path):
    result = cli(
        "sweep",
        name,
        *(["--profile", profile] if profile else []),
        "--dir",
        tmp_path / "sweep",
        "--data-dir",
        tmp_path / "data",
        "--dry-run",
        "--no-estimate",  # the sizes, not the time (tests/experiments/test_estimate.py)
        check_code=0,
    )
    plan = load_plan(name, profile)
    sweep = Sweep(plan, tmp_path / "sweep", data_dir=tmp_path / "data")
    for point in plan.points():
        assert point.name in result.stdout
        row = sweep.describe(point)
        assert row["parameters"] is not None
        budget = point.settings.get("params")
        if budget:  # sized to the budget: within 1% of it at paper scale
            reference = ModelConfig(
                point.settings["cell"],
                vocab_size=row["vocabulary"],
                hidden_size=1,
                layers=point.settings.get("layers", 1),
                embed_size=point.settings.get("embed_size"),
            )
            count = budget_of(budget, reference)
            heads = point.settings.get("cell_options", {}).get("heads")
            step = 1 if heads is None else 2 * heads  # a transformer's n is a multiple of 2 × heads
            if step == 1:  # sized to the budget: within 1% of it at paper scale
                assert abs(row["parameters"] - count) < 0.01 * count + 2_000, point.name
            else:  # the closest of the sizes the cell can be built at
                sized = dataclasses.replace(reference, cell_options=point.settings["cell_options"])
                for other in (row["hidden"] - step, row["hidden"] + step):
                    total = count_parameters(LanguageModel(dataclasses.replace(sized, hidden_size=other)))
                    assert abs(total - count) >= abs(row["parameters"] - count), point.name
    assert not (tmp_path / "sweep").exists() and not (tmp_path / "data").exists()


def test_shipped_plans_match_the_papers():
    table1 = load_plan("lru-table1")
    assert len(table1.points()) == 7 * 4 * 2
    assert {p.settings["corpus"] for p in table1.points()} == {"ptb-contiguous", "wp", "enwik8", "text8"}
    depth = Sweep(load_plan("lru-depth"), "unused")
    hidden = {(row["cell"], row["layers"]): row["hidden"] for row in map(depth.describe, depth.plan.points())}
    assert {cell: hidden[(cell, 2)] for cell in ("gru", "lstm", "grid-lstm", "rg-lru")} == {
        "gru": 387,
        "lstm": 335,
        "grid-lstm": 237,
        "rg-lru": 300,
    }
    for cell, gates in (("gru", 3), ("lstm", 4)):  # about 0.9M recurrent weights per layer
        n = hidden[(cell, 2)]
        assert abs(gates * n * 2 * n - 0.9e6) < 0.01e6
    grid = Sweep(load_plan("grid-lstm-enwik8"), "unused")
    assert abs(grid.describe(grid.plan.points()[0])["parameters"] - 16.8e6) < 0.05e6
    assert [step.label for step in load_plan("delta-rnn-ptb").evals] == ["sgd test", "sgd test #2"]
    assert all(CELLS.get(p.settings["cell"]) for p in load_plan("delta-rnn-ptb").points())
    assert depth.plan.budget == "≈0.9M per layer" and load_plan("lru-depth", "small").budget == "≈56k per layer"
    assert all(abs(gates * n * 2 * n - 56e3) < 2e3 for gates, n in ((3, 97), (4, 84)))  # the small profile's widths


def test_list_shows_every_shipped_plan_with_its_description():
    result = cli("sweep", "--list", check_code=0)
    for name, description in shipped_plans().items():
        assert name in result.stdout and description[:30] in result.stdout


def test_dry_run_and_list_fit_80_columns(tmp_path, monkeypatch):
    """Issue 34: at 80 columns a dry run keeps each point's run, corpus, cell, parameters and state,
    the figures whole; --list wraps descriptions. Issue 42: a point's name (too long to share a line
    with its figures) is never broken: it stands whole on a line of its own above them."""
    arguments = ("sweep", "lru-table1", "--dir", tmp_path / "sweep", "--data-dir", tmp_path / "data", "--dry-run")
    wide = cli(*arguments, check_code=0).stdout  # piped: every column, a row a line
    terminal_of(monkeypatch, 80)
    narrow = cli(*arguments, check_code=0).stdout
    assert_fits(narrow)
    header, every = table_header(narrow), table_header(wide)
    assert header[:3] == ["run", "corpus", "cell"] and header[-2:] == ["parameters", "state"]
    assert table_lines(narrow) == [[line[every.index(name)] for name in header] for line in table_lines(wide)]
    assert "│ corpus-ptb-contiguous_params-10M_cell-lru\n" in narrow
    listing = cli("sweep", "--list", check_code=0).stdout
    assert_fits(listing)
    assert [line[0] for line in table_lines(listing) if line[0]] == list(shipped_plans())


@pytest.mark.parametrize(
    "text, fragment",
    [
        ('[base]\ncorpus = "tiny"\n[axes]\ncell = ["gru"]\n[extra]\nx = 1\n', "unknown key 'extra'"),
        ('[base]\nlearning_rate = 0.1\n[axes]\ncell = ["gru"]\n', "unknown setting 'learning_rate'"),
        ('[axes]\ncell = ["gru", "nope"]\n', "unknown cell 'nope'"),
        ('[axes]\ncorpus = ["../etc"]\n', "'../etc' is not a corpus name"),
        ("[axes]\ncell = []\n", "axes.cell must be a non-empty list"),
        ("[axes]\nlr = [0.001, -1.0]\n", "axes.lr[1] must be in (0, 1000], not -1.0 (run lr--1.0)"),
        ('[axes]\ncell = ["mycells:Cell"]\n', "asks to import module 'mycells'"),
        ("[axes\n", "is not valid TOML"),
        ("[base]\nhidden_size = " + "9" * 5000 + "\n", "is not valid TOML: Exceeds the limit (4300 digits)"),
        # 0x spells 20,000 bits in 5,000 digits: read, but too long to print, so refused as the plan is read
        ("[base]\nhidden_size = 0x" + "f" * 5000 + "\n", "is not valid TOML: Exceeds the limit (4300 digits)"),
        ("[axes]\ncell = " + "[" * 50_000 + "]" * 50_000 + "\n", "is not valid TOML: its values are nested too deeply"),
        (
            "",
            "has no axes: a plan names its runs with [axes] NAME = [values, ...]",
        ),  # empty, or cut short before its axes
        ('name = "cut"\n[base]\nhidden_size = 8\n', "has no axes"),
        ('[base]\nrun_dir = "x"\n', "base.run_dir: a plan cannot set 'run_dir'"),
        ('[[eval]]\nsplit = "train"\n', "eval[0].split must be valid or test"),
        ("base = 3\n", "base must be a table"),
        ("[base]\ncell_options = 3\n", "cell_options must be a table"),
        ("eval = [1]\n", "eval[0] must be a table"),
        ('budget = 3\n[axes]\ncell = ["gru"]\n', "budget must be a label"),
    ],
)
def test_bad_plans_are_one_line_errors(text, fragment, tmp_path, tiny_corpus):
    plan = tmp_path / "bad.toml"
    plan.write_text(text, encoding="utf-8")
    assert_one_line_error(cli(*sweep_args(plan, tmp_path / "sweep", tiny_corpus)), fragment)
    assert not (tmp_path / "sweep").exists()


def test_other_bad_sweep_input_is_one_line(plan_file, tiny_corpus, tmp_path):
    directory = tmp_path / "sweep"
    assert_one_line_error(cli("sweep", "nope"), "no plan 'nope'", "lru-table1")
    assert_one_line_error(cli("sweep"), "give a plan")
    assert_one_line_error(cli("sweep", tmp_path / "absent.toml"), "plan file", "does not exist")
    assert_one_line_error(
        cli("sweep", "lru-table1", "--profile", "huge", "--dry-run"), "has no profile 'huge'", "small"
    )
    assert_one_line_error(cli(*sweep_args(plan_file, directory, tiny_corpus, "--shard", "2/2")), "--shard 2/2")
    assert_one_line_error(cli(*sweep_args(plan_file, directory, tiny_corpus, "--shard", "x")), "--shard must be I/N")
    assert_one_line_error(
        cli(*sweep_args(plan_file, directory, tiny_corpus, "--only", "cell=rhn")), "no run of the plan matches"
    )
    directory.mkdir()
    (directory / "sweep.json").write_text('{"plan": "other", "profile": "paper", "fingerprint": "0"}', encoding="utf-8")
    assert_one_line_error(cli(*sweep_args(plan_file, directory, tiny_corpus)), "holds runs of another plan (other")
    dry = cli(*sweep_args(plan_file, directory, tiny_corpus, "--dry-run"), check_code=0)
    assert "warning: sweep directory" in dry.stderr and "holds runs of another plan (other" in dry.stderr
    for record in ("{}", '{"plan": "other", "fingerprint": 7}', "[" * 100_000 + "]" * 100_000):  # no plan, damage
        (directory / "sweep.json").write_text(record, encoding="utf-8")
        assert_one_line_error(
            cli(*sweep_args(plan_file, directory, tiny_corpus)),
            f"{directory / 'sweep.json'} is damaged: remove it to start the sweep afresh",
        )


def test_a_point_that_cannot_run_is_reported_and_the_sweep_goes_on(tiny_corpus, tmp_path):
    plan = tmp_path / "partly.toml"
    plan.write_text(
        "[base]\nhidden_size = 8\nbatch_size = 8\nepochs = 1\neval_batch_size = 8\n"
        '[axes]\ncorpus = ["absent", "tiny"]\n',
        encoding="utf-8",
    )
    dry = cli(*sweep_args(plan, tmp_path / "sweep", tiny_corpus, "--dry-run"), check_code=0)
    assert "warning: corpus 'absent' is not prepared" in dry.stderr and "fail on its 1 run(s)" in dry.stderr
    assert "corpus 'tiny'" not in dry.stderr and dry.stderr.count("warning:") == 1  # prepared: no warning
    result = cli(*sweep_args(plan, tmp_path / "sweep", tiny_corpus))
    assert "[1/2] corpus-absent: not run: corpus 'absent' is not prepared" in result.stderr
    assert "1 failed, 1 finished" in result.stdout
    assert_one_line_error(
        result,
        "1 of 2 runs did not finish: corpus-absent (not run); why: "
        f"{tmp_path / 'sweep' / 'sweep.log'} (and each run's train.log)",
        code=1,
    )
    assert (
        "[1/2] corpus-absent: not run: corpus 'absent' is not prepared"
        in (tmp_path / "sweep" / "sweep.log").read_text()
    )
    assert Run(tmp_path / "sweep" / "corpus-tiny").status() == "finished"


def test_the_delta_rnn_plans_follow_the_paper_and_the_dry_run_shows_its_counts(tmp_path):
    """Issue 22: the Delta-RNN plans carry the paper's protocol (section 4.2), an LSTM with full
    peepholes, and the small profiles give every run the same data; a dry run shows the paper's
    parameter count next to charlm's where the plan gives one."""
    for name in ("delta-rnn-ptb", "delta-rnn-ptb-word"):
        plan = load_plan(name)
        settings = plan.points()[0].settings
        assert (
            settings["batch_size"],
            settings["epochs"],
            settings["clip"],
            settings["schedule"],
            settings["patience"],
        ) == (64, 100, 5.0, "plateau-halving", 10)
        lstm = [p.settings for p in plan.points() if p.settings["cell"] == "lstm"]
        assert lstm and all(s["cell_options"] == {"peephole": "full"} for s in lstm)
        small = load_plan(name, "small")
        assert all(
            "max_minutes" not in p.settings and p.settings["patience"] >= p.settings["epochs"] for p in small.points()
        )
        assert len({p.settings["seed"] for p in small.points()}) >= 2
    for name in shipped_plans():
        assert all("max_minutes" not in p.settings for p in load_plan(name, "small").points()), name
    result = cli("sweep", "grid-lstm-enwik8", "--dir", tmp_path / "sweep", "--dry-run", check_code=0)
    assert "paper's count" in result.stdout and "16,800,000" in result.stdout and "16,828,205" in result.stdout


def test_a_plan_of_ones_own_is_not_labelled_a_paper(plan_file, tiny_corpus, tmp_path, monkeypatch):
    """Issue 34: a plan without profiles ran as profile "paper" (sweeps/NAME-paper, a "paper's count"
    column of dashes); only a plan that names its paper is one."""
    monkeypatch.chdir(tmp_path)
    plan = load_plan(plan_file)
    assert plan.profile is None and plan.label == "tiny"
    assert (
        load_plan("lru-table1").label == "lru-table1-paper"
        and load_plan("lru-table1", "small").label == "lru-table1-small"
    )
    dry = cli("sweep", plan_file, "--data-dir", tiny_corpus, "--dry-run", check_code=0)
    assert dry.stdout.startswith(f"4 run(s) of tiny in {Path('sweeps') / 'tiny'}\n")
    assert "paper" not in dry.stdout
    Sweep(plan, tmp_path / "sweep").bind()
    assert json.loads((tmp_path / "sweep" / "sweep.json").read_text())["profile"] is None
    other = tmp_path / "other.toml"
    other.write_text('[base]\ncorpus = "tiny"\n[axes]\ncell = ["rnn"]\n', encoding="utf-8")
    assert_one_line_error(
        cli("sweep", other, "--dir", tmp_path / "sweep", "--data-dir", tiny_corpus),
        "holds runs of another plan (tiny): choose another --dir",
    )


def test_the_plans_budget_label_is_recorded_in_sweep_json(plan_file, tmp_path):
    """The label is what `charlm report` groups runs sized by --hidden under; it is no part of the
    fingerprint, so naming it later relabels a sweep without refusing its runs."""
    Sweep(load_plan(plan_file), tmp_path / "sweep").bind()
    assert json.loads((tmp_path / "sweep" / "sweep.json").read_text())["budget"] is None
    plan_file.write_text('budget = "≈3k per layer"\n' + plan_file.read_text())
    Sweep(load_plan(plan_file), tmp_path / "sweep").bind()
    assert json.loads((tmp_path / "sweep" / "sweep.json").read_text())["budget"] == "≈3k per layer"


ONE_POINT = """
[base]
corpus = "tiny"
hidden_size = 8
batch_size = 4
bptt = 16
epochs = 1
train_fraction = 0.05
eval_batch_size = 4
save_every = "0"

[axes]
cell = ["gru"]

[[eval]]
split = "valid"
"""


def test_a_failed_evaluation_exits_1_naming_the_point_and_the_log_and_a_rerun_evaluates_it(
    tiny_corpus, tmp_path, monkeypatch
):
    import charlm.api

    plan, directory = tmp_path / "one.toml", tmp_path / "sweep"
    plan.write_text(ONE_POINT, encoding="utf-8")

    def failing(self, *args, **kwargs):
        raise CharlmError("the valid split vanished")

    with monkeypatch.context() as patched:
        patched.setattr(charlm.api.Model, "evaluate", failing)
        result = cli(*sweep_args(plan, directory, tiny_corpus))
    assert_one_line_error(
        result, f"1 of 1 runs did not finish: cell-gru (evaluation failed); why: {directory / 'sweep.log'}", code=1
    )
    line = "[1/1] cell-gru: trained, but its evaluation failed: the valid split vanished; the run is kept"
    assert line in result.stderr and line in (directory / "sweep.log").read_text()
    assert "sweep " in result.stdout and "1 failed" in result.stdout
    assert Run(directory / "cell-gru").status() == "finished" and not records(directory / "cell-gru", "eval")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["one.toml", "sweep"]  # nothing written elsewhere

    again = cli(*sweep_args(plan, directory, tiny_corpus), check_code=0)
    assert "[1/1] cell-gru: evaluating (static valid)" in again.stderr and "1 finished" in again.stdout
    assert [(row["split"], row["mode"]) for row in records(directory / "cell-gru", "eval")] == [("valid", "static")]


def test_an_evaluation_that_runs_out_of_memory_fails_its_point_not_the_sweep(tiny_corpus, tmp_path, monkeypatch):
    import charlm.api

    plan, directory = tmp_path / "one.toml", tmp_path / "sweep"
    plan.write_text(ONE_POINT, encoding="utf-8")

    def out_of_memory(self, *args, **kwargs):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:116] DefaultCPUAllocator: can't allocate memory")

    monkeypatch.setattr(charlm.api.Model, "evaluate", out_of_memory)
    result = cli(*sweep_args(plan, directory, tiny_corpus))
    assert_one_line_error(result, "1 of 1 runs did not finish: cell-gru (evaluation failed)", code=1)
    assert "its evaluation failed: out of memory on cpu: give the plan's [[eval]] a smaller batch_size" in result.stderr


def test_a_sweep_of_charlm_0_3_keeps_its_fingerprint_with_hidden_renamed(tmp_path):
    """0.3 plans named the hidden size `hidden`; the fingerprint of a sweep directory names it so still."""
    import hashlib

    path = tmp_path / "plan.toml"
    path.write_text('[base]\nhidden_size = 8\n[axes]\nmodel = [{ cell = "gru", hidden_size = 9 }]\n', encoding="utf-8")
    identity = {"base": {"hidden": 8}, "axes": {"model": [{"cell": "gru", "hidden": 9}]}, "eval": []}
    written_by_0_3 = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]
    assert load_plan(path).fingerprint() == written_by_0_3


def _damage_config(run):
    (run / "config.json").write_text("[1, 2]", encoding="utf-8")


def _damage_metrics(run):
    lines = (run / "metrics.jsonl").read_text().splitlines()
    epoch = next(index for index, line in enumerate(lines) if json.loads(line)["event"] == "epoch")
    lines[epoch] = json.dumps({**json.loads(lines[epoch]), "valid_bpc": "low"})
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")


def _damage_best(run):
    best = (run / "best.pt").read_bytes()
    (run / "best.pt").write_bytes(best[: len(best) // 2])


def test_damaged_runs_are_reported_and_skipped_and_the_others_are_kept(trained_run, tmp_path):
    """Copies of a finished run as the sweep's four points, three of them damaged: nothing trains,
    each damaged one is one line with its reason, the intact one is finished, the exit code is 1."""
    import shutil

    plan, directory = tmp_path / "seeds.toml", tmp_path / "sweep"
    plan.write_text('[base]\ncorpus = "tiny"\n[axes]\nseed = [1, 2, 3, 4]\n', encoding="utf-8")
    Sweep(load_plan(plan), directory).bind()
    for seed, damage in ((1, None), (2, _damage_config), (3, _damage_metrics), (4, _damage_best)):
        shutil.copytree(trained_run, directory / f"seed-{seed}")
        if damage:
            damage(directory / f"seed-{seed}")
    result = cli(*sweep_args(plan, directory, tmp_path / "no-data"))
    assert "[1/4] seed-1: finished earlier; skipped" in result.stderr
    reasons = {
        2: f"{directory / 'seed-2' / 'config.json'} must hold a JSON object, not a list",
        3: f"{directory / 'seed-3' / 'metrics.jsonl'} line",
        4: f"{directory / 'seed-4' / 'best.pt'} is cut short or is not a checkpoint",
    }
    for seed, reason in reasons.items():
        line = next(line for line in result.stderr.splitlines() if line.startswith(f"[{seed}/4] seed-{seed}: "))
        assert line.startswith(f"[{seed}/4] seed-{seed}: damaged, skipped: {reason}"), line
        assert line.endswith(
            f"move {directory / f'seed-{seed}'} away and run the same command again to train it afresh"
        )
    assert "3 damaged, 1 finished" in result.stdout
    assert_one_line_error(
        result, "3 of 4 runs did not finish: seed-2 (damaged), seed-3 (damaged), seed-4 (damaged)", code=1
    )
    dry = cli(*sweep_args(plan, directory, tmp_path / "no-data", "--dry-run"), check_code=0)
    states = [line.split("│")[-2].strip() for line in dry.stdout.splitlines() if line.startswith("│ seed-")]
    assert states == ["finished", "damaged", "damaged", "damaged"]


def test_a_plan_cannot_make_a_sweep_write_outside_its_directory(tmp_path):
    """Names from a plan are plain names; values that are paths become parts of one directory name."""
    plan = tmp_path / "climbing.toml"
    plan.write_text(
        '[axes]\nwandb_project = ["../../../escape", "/etc/passwd", "..", "a\\\\..\\\\b"]\n', encoding="utf-8"
    )
    sweep = Sweep(load_plan(plan), tmp_path / "sweep")
    runs = [sweep.config(point).run_dir for point in sweep.plan.points()]
    assert [name.rpartition("/")[2] for name in runs] == [
        "wandb_project-..-..-..-escape",
        "wandb_project--etc-passwd",
        "wandb_project-..",
        "wandb_project-a-..-b",
    ]
    assert all(Path(run).resolve().parent == (tmp_path / "sweep").resolve() for run in runs)
    for text, refused in (
        ('name = "../up"\n', "its name '../up'"),
        ('[base]\nrun_dir = "/tmp/x"\n', "a plan cannot set 'run_dir'"),
        ('[base]\ninit_from = "/tmp/x.pt"\n', "a plan cannot set 'init_from'"),
        ('[base]\ndata_dir = "/tmp"\n', "a plan cannot set 'data_dir'"),
        ('[profiles."../up"]\n', "profile '../up' is not a plain name"),
    ):
        plan.write_text(
            text + '[axes]\ncell = ["gru"]\n' if "profiles" not in text else '[axes]\ncell = ["gru"]\n' + text
        )
        assert_one_line_error(cli("sweep", plan, "--dry-run"), refused)
