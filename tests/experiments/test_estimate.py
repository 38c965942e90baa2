"""Issue 45, know before you start: `charlm sweep --dry-run` estimates each run's time from a short
measurement of its model on this machine, and `charlm train` states its estimate after its first
steps. The arithmetic is checked with speeds given; no assertion depends on how fast a step is."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest

from charlm.config import TrainConfig
from charlm.corpora import load_corpus
from charlm.experiments import estimate
from charlm.experiments.plan import EvalStep, load_plan
from charlm.experiments.speed import Speed, measure_speed, measure_task_speed
from charlm.tasks.config import TaskConfig
from charlm.training.reporting import StartEstimate, duration, tokens_to_train
from helpers import assert_fits, assert_one_line_error, cli, table_header, table_lines, terminal_of

PLAN = """
name = "timed"

[base]
corpus = "tiny"
hidden_size = 12
batch_size = 4
bptt = 16
epochs = 2
patience = 1
eval_batch_size = 8

[axes]
cell = ["gru", "lstm"]
seed = [1, 2]

[[eval]]
split = "test"
dynamic = "sgd"
"""
SPEED = Speed(train=1_000.0, score=4_000.0)


def test_a_runs_time_is_its_tokens_over_the_speeds_measured():
    config = TrainConfig(corpus="tiny", epochs=2, batch_size=4, bptt=10, eval_batch_size=5)
    splits = {"train": 4_000, "valid": 200, "test": 300}
    evals = (EvalStep("test", dynamic="sgd", adapt_on="valid"), EvalStep("valid"))
    work = estimate.run_work(config, 1_000, splits, evals)
    # 2 epochs of 1,000 tokens; validation after each; the test split once; static valid, dynamic #2 on valid + test
    assert work == estimate.Work(train=2_000, validation=400, scored=300 + 200, adapted=300 + 200)
    speed = Speed(train=100.0, score=1_000.0)
    assert estimate.run_seconds(work, speed) == pytest.approx(20 + 0.4 + 0.5 + 5)
    assert estimate.run_seconds(work, speed, max_minutes=0.25) == pytest.approx(15 + 0.5 + 5)  # training cut at 15 s
    capped = estimate.run_work(TrainConfig(corpus="tiny", epochs=2, max_tokens=1_500, eval_batch_size=5), 1_000, splits)
    assert capped == estimate.Work(train=1_500, validation=400, scored=300, adapted=0)  # the cut epoch is scored too
    resumed = estimate.run_work(config, 1_000, splits, done=1_200)  # an interrupted run: what it has left
    assert resumed == estimate.Work(train=800, validation=200, scored=300, adapted=0)
    every = TrainConfig(corpus="tiny", epochs=1, eval_every=10, test_every_epoch=True, eval_fraction=0.5)
    # 1,000 tokens in steps of 32 × 50: no step-validation fits; validation on half the split, test every epoch
    assert estimate.run_work(every, 1_000, splits) == estimate.Work(1_000, 100 + 300, 0, 0)
    assert estimate.run_work(every, 32_000, splits).validation == (1 + 2) * 100 + 300  # 20 steps: 2 validations more
    fast = Speed(train=100.0, score=1_000.0, adapt=50.0)  # a dynamic evaluation's segments measured on their own
    assert estimate.run_seconds(work, fast) == pytest.approx(20 + 0.4 + 0.5 + 10)
    rms = estimate.run_work(config, 1_000, {**splits, "train": 4_000}, (EvalStep("test", dynamic="rms"),))
    assert (rms.adapted, rms.statistics) == (300, 4_000)  # rms: statistics over the training split first
    assert estimate.run_seconds(rms, fast) == pytest.approx(20 + 0.4 + 0.3 + 40 + 6)
    # The H200 figure: 8 epochs of War and Peace's 2.88M training tokens at 377k tokens a second
    assert duration(tokens_to_train(8, 2_880_000, None) / 377_000) == "1 min"
    assert tokens_to_train(8, 2_880_000, 3_000_000) == 3_000_000


@pytest.mark.parametrize(
    "seconds, shown",
    [(0.2, "1 s"), (25.9, "26 s"), (59.4, "59 s"), (59.6, "1 min"), (86, "1 min 30 s"), (594, "9 min 50 s")]
    + [(596, "10 min"), (725, "12 min"), (7_800, "2 h 10 min")]
    + [(7_200, "2 h"), (100 * 3600, "100 h"), (1_234_567, "343 h")],
)
def test_durations_read_to_the_precision_of_an_estimate(seconds, shown):
    assert duration(seconds) == shown


@pytest.fixture
def plan_file(tmp_path):
    path = tmp_path / "timed.toml"
    path.write_text(PLAN, encoding="utf-8")
    return path


@pytest.fixture
def measured(monkeypatch):
    """Every measurement gives ``SPEED``; the settings measured are kept."""
    calls = []

    def measure(config, corpus, adapt_shape=None):
        calls.append(config)
        return SPEED

    monkeypatch.setattr(estimate, "measure_speed", measure)
    return calls


def expected_time(plan_file, tiny_corpus, point) -> str:
    config = TrainConfig(**{**point.settings, "data_dir": str(tiny_corpus)})
    corpus = load_corpus("tiny", tiny_corpus)
    splits = {split: len(corpus.split(split)) for split in ("valid", "test")}
    work = estimate.run_work(config, estimate.tokens_per_epoch(corpus, config), splits, load_plan(plan_file).evals)
    return duration(estimate.run_seconds(work, SPEED))


def test_a_dry_run_shows_each_runs_time_and_the_total(plan_file, tiny_corpus, tmp_path, measured):
    arguments = ("sweep", plan_file, "--dir", tmp_path / "sweep", "--data-dir", tiny_corpus, "--dry-run")
    cli(*arguments[:-1], "--only", "seed=1", "--only", "cell=gru", check_code=0)  # one run finished
    result = cli(*arguments, check_code=0)
    header, lines = table_header(result.stdout), table_lines(result.stdout)
    assert header[-2:] == ["estimate", "state"]
    points = load_plan(plan_file).points()
    shown = {line[0]: line[header.index("estimate")] for line in lines}
    assert shown == {
        point.name: "-" if point.name == "cell-gru_seed-1" else expected_time(plan_file, tiny_corpus, point)
        for point in points
    }
    assert len(measured) == 2  # gru and lstm: each model once, whatever its seed
    lines_after = result.stdout.split("└")[-1].splitlines()[1:]
    assert re.fullmatch(r"about (\d+ (s|min|h) )+for 3 run\(s\) on cpu \(.+, 1 thread\), measured now", lines_after[0])
    assert "(at most: early stopping, or a task solved, ends a run sooner)" in lines_after[1:]
    assert "estimating: timing 2 model(s) on cpu" in result.stderr


def test_the_estimate_stays_at_80_columns(plan_file, tiny_corpus, tmp_path, measured, monkeypatch):
    arguments = ("sweep", plan_file, "--dir", tmp_path / "sweep", "--data-dir", tiny_corpus, "--dry-run")
    wide = cli(*arguments, check_code=0).stdout
    terminal_of(monkeypatch, 80)
    narrow = cli(*arguments, check_code=0).stdout
    assert_fits(narrow)
    assert "estimate" in table_header(narrow)
    column = table_header(wide).index("estimate")
    assert [line[table_header(narrow).index("estimate")] for line in table_lines(narrow)] == [
        line[column] for line in table_lines(wide)
    ]
    assert re.search(r"^about .+ measured now$", narrow, re.M)


def test_no_estimate_measures_nothing(plan_file, tiny_corpus, tmp_path, measured):
    result = cli("sweep", plan_file, "--data-dir", tiny_corpus, "--dry-run", "--no-estimate", check_code=0)
    assert "estimate" not in table_header(result.stdout) and "measured now" not in result.stdout
    assert measured == [] and "estimating" not in result.stderr
    assert_one_line_error(cli("sweep", plan_file, "--no-estimate"), "--no-estimate goes with --dry-run")


def test_runs_on_corpora_not_prepared_have_no_estimate_and_the_dry_run_says_so(tiny_corpus, tmp_path, measured):
    plan = tmp_path / "two.toml"
    plan.write_text(PLAN.replace('cell = ["gru", "lstm"]', 'corpus = ["tiny", "absent"]'), encoding="utf-8")
    result = cli("sweep", plan, "--data-dir", tiny_corpus, "--dry-run", check_code=0)
    header, lines = table_header(result.stdout), table_lines(result.stdout)
    assert {line[0]: line[header.index("estimate")] for line in lines if "absent" in line[0]} == {
        "corpus-absent_seed-1": "?",
        "corpus-absent_seed-2": "?",
    }
    assert "(no estimate for 2 run(s): corpus absent is not prepared)" in result.stdout
    nothing = tmp_path / "nothing.toml"
    nothing.write_text(PLAN.replace('cell = ["gru", "lstm"]', 'corpus = ["absent"]'), encoding="utf-8")
    result = cli("sweep", nothing, "--data-dir", tiny_corpus, "--dry-run", check_code=0)
    assert "estimate" not in table_header(result.stdout) and "measured now" not in result.stdout
    assert "(no estimate for 2 run(s): corpus absent is not prepared)" in result.stdout


TASK_PLAN = """
task = "memorization"
[base]
length = 2
symbols = 3
hidden_size = 16
max_samples = 600
eval_every = 300
[axes]
model = [{ cell = "lstm", tied = true }, { cell = "grid-lstm" }]
seed = [1, 2]
"""


def test_a_task_plans_runs_take_their_samples_over_the_samples_a_second(tmp_path, monkeypatch):
    measured = []
    monkeypatch.setattr(estimate, "measure_task_speed", lambda config: measured.append(config) or 50.0)
    plan = tmp_path / "task.toml"
    plan.write_text(TASK_PLAN, encoding="utf-8")
    result = cli("sweep", plan, "--dir", tmp_path / "sweep", "--dry-run", check_code=0)
    header, lines = table_header(result.stdout), table_lines(result.stdout)
    assert [line[header.index("estimate")] for line in lines] == ["12 s"] * 4  # 600 samples at 50 a second
    assert len(measured) == 2 and re.search(r"^about 48 s for 4 run\(s\) on cpu", result.stdout, re.M)


def test_the_measurement_times_the_runs_own_model(tiny_corpus):
    config = TrainConfig(corpus="tiny", cell="gru", hidden_size=8, batch_size=4, bptt=8, data_dir=str(tiny_corpus))
    speed = measure_speed(config, load_corpus("tiny", tiny_corpus), adapt_shape=(1, 20))
    assert speed.train > 0 and speed.score > 0 and speed.adapt > 0
    task = TaskConfig(task="parity", bits=4, hidden_size=8, cell="grid-lstm", layers=2, max_samples=100).resolved()
    assert measure_task_speed(task) > 0


def test_the_train_estimate_says_when_max_minutes_ends_the_run_first():
    config = TrainConfig(corpus="tiny", epochs=100, max_minutes=2.0)
    budget = SimpleNamespace(max_minutes=2.0, spent=lambda: 10.0)  # 110 s of the budget left
    assert StartEstimate(config, 418_464, budget).line(41_000_000, 15_000.0, 2, 21) == (
        "estimate: about 1 min 50 s to go: --max-minutes 2 stops it before its 100 epochs (41,846,400 tokens), "
        "which would take about 46 min more at ~15,000 tokens/s, measured on steps 2-21"
    )
    assert StartEstimate(config, 418_464, budget).line(1_500_000, 15_000.0, 2, 21) == (
        "estimate: about 1 min 40 s to go for 100 epochs (41,846,400 tokens) at ~15,000 tokens/s, measured on "
        "steps 2-21 (validation not counted)"
    )


def train_lines(result, run_dir) -> tuple[list[str], list[str]]:
    said = [line for line in result.stderr.splitlines() if line.startswith("estimate:")]
    logged = [line for line in (run_dir / "train.log").read_text().splitlines() if line.startswith("estimate:")]
    return said, logged


def test_train_states_its_estimate_once_after_its_first_steps(tiny_corpus, tmp_path):
    train = ("train", "--corpus", "tiny", "--data-dir", tiny_corpus, "--cell", "gru", "--hidden", "8")
    shape = ("--batch-size", "8", "--bptt", "16", "--eval-batch-size", "8")
    predictions = len(load_corpus("tiny", tiny_corpus).split("train")) - 1
    epoch = 8 * (predictions // 8)  # 8 streams, the remainder dropped
    result = cli(*train, *shape, "--epochs", "2", "--run-dir", tmp_path / "full", check_code=0)
    said, logged = train_lines(result, tmp_path / "full")
    assert said == logged and len(said) == 1
    assert re.fullmatch(
        rf"estimate: about (\d+ (s|min|h) )+to go for 2 epochs \({2 * epoch:,} tokens\) at ~[\d,]+ tokens/s, "
        r"measured on steps 2-\d+ \(validation not counted\)",
        said[0],
    ), said[0]
    log = (tmp_path / "full" / "train.log").read_text().splitlines()
    assert log[0].startswith("training gru") and log[1] == said[0]  # after the first steps, before the first epoch
    budget = cli(*train, *shape, "--max-tokens", "5000", "--run-dir", tmp_path / "budget", check_code=0)
    said, _ = train_lines(budget, tmp_path / "budget")
    assert len(said) == 1 and " to go for its --max-tokens (5,000 tokens) at " in said[0]
