"""The Grid LSTM paper's algorithmic tasks (issue 23): the generators in the paper's format, the
masking, tied networks, resume, the thresholds, a tiny run that learns, and the errors."""

from __future__ import annotations

import csv
import io
import json

import pytest
import torch

from charlm.model import count_parameters
from charlm.tasks import Addition, Memorization, Parity, TaskConfig, build_task_model, make_task, train_task
from charlm.tasks.data import TaskBatch
from charlm.tasks.training import TaskProgress, score, update_thresholds
from helpers import assert_one_line_error, cli

DASH = "-"


def spell(task, row) -> str:
    return " ".join(task.vocab[int(i)] for i in row)


def marks(mask_row) -> str:
    return " ".join("^" if m else "." for m in mask_row)


# --- generators --------------------------------------------------------------------------------


def test_memorization_reads_then_writes_back_the_symbols():
    task = Memorization(length=3, symbols=5)
    batch = task.sample(torch.Generator().manual_seed(0), 4)
    assert batch.inputs.shape == batch.targets.shape == batch.mask.shape == (4, 8)
    for inputs, targets, mask in zip(batch.inputs, batch.targets, batch.mask):
        a, b, c = (task.vocab[int(i)] for i in inputs[1:4])
        assert spell(task, inputs) == f"- {a} {b} {c} - - - -"  # the paper's "- α β γ - - - -"
        assert spell(task, targets) == f"- - - - {a} {b} {c} -"  # and "- - - - α β γ -"
        assert marks(mask) == ". . . . ^ ^ ^ ."  # the symbols alone count
    assert task.vocab[-1] == DASH and len(task.vocab) == 6


@pytest.mark.parametrize(
    "a, b, target, mask",
    [
        # the paper's example: a 4-digit result, then the end-of-result "-"
        ("123", "899", "- - - - - - - - 1 0 2 2 -", ". . . . . . . . ^ ^ ^ ^ ^"),
        # a 3-digit result: its end is one step earlier and the last position is padding, not counted
        ("123", "456", "- - - - - - - - 5 7 9 - -", ". . . . . . . . ^ ^ ^ ^ ."),
        ("999", "999", "- - - - - - - - 1 9 9 8 -", ". . . . . . . . ^ ^ ^ ^ ^"),  # a carry through every column
        ("105", "395", "- - - - - - - - 5 0 0 - -", ". . . . . . . . ^ ^ ^ ^ ."),  # carries into zeros
    ],
)
def test_addition_in_the_papers_format(a, b, target, mask):
    task = Addition(digits=3)

    def digits(text):
        return torch.tensor([[int(c) for c in text]])

    batch = task.encode(digits(a), digits(b))
    assert spell(task, batch.inputs[0]) == f"- {' '.join(a)} - {' '.join(b)} - - - - -"
    assert spell(task, batch.targets[0]) == target
    assert marks(batch.mask[0]) == mask


def test_fifteen_digit_sums_have_fifteen_or_sixteen_digits_and_are_right():
    task = Addition()
    a, b = task.numbers(torch.Generator().manual_seed(3), 500)
    assert (a[:, 0] > 0).all() and (b[:, 0] > 0).all()  # 15-digit numbers: no leading zero
    batch = task.encode(a, b)

    def value(row):
        return int("".join(map(str, row.tolist())))

    lengths = set()
    for row in range(500):
        start = 2 * 15 + 2
        written = [int(t) for t, m in zip(batch.targets[row, start:], batch.mask[row, start:]) if m][:-1]
        lengths.add(len(written))
        assert int("".join(map(str, written))) == value(a[row]) + value(b[row])
        assert batch.targets[row, start + len(written)] == 10  # the end-of-result "-"
    assert lengths == {15, 16}


def test_parity_labels_the_odd_strings():
    batch = Parity(bits=7).sample(torch.Generator().manual_seed(0), 64)
    assert batch.inputs.shape == (64, 7) and batch.targets.shape == batch.mask.shape == (64, 1)
    assert torch.equal(batch.targets[:, 0], batch.inputs.sum(dim=1).long() % 2) and batch.mask.all()


@pytest.mark.parametrize("task", [Memorization(), Addition(), Parity()], ids=lambda t: t.name)
def test_the_same_seed_gives_the_same_samples_and_every_batch_is_new(task):
    first, again = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    one, two = task.sample(first, 15), task.sample(first, 15)
    assert torch.equal(one.inputs, task.sample(again, 15).inputs) and torch.equal(
        two.inputs, task.sample(again, 15).inputs
    )
    assert not torch.equal(one.inputs, two.inputs)


def test_the_papers_values_are_the_defaults():
    assert (Memorization().length, Memorization().symbols, Addition().digits) == (20, 64, 15)
    assert make_task("addition").positions == 3 * 15 + 4


# --- masking -----------------------------------------------------------------------------------


class Oracle(torch.nn.Module):
    """Certain of the target where it counts, of a wrong symbol everywhere else."""

    def __init__(self, batch, vocab):
        super().__init__()
        self.batch, self.vocab = batch, vocab

    def forward(self, inputs):
        wrong = (self.batch.targets + 1) % self.vocab
        chosen = torch.where(self.batch.mask, self.batch.targets, wrong)
        return torch.nn.functional.one_hot(chosen, self.vocab).float() * 1000.0


def test_only_target_positions_count():
    task = Memorization(length=4, symbols=6)
    batch = task.sample(torch.Generator().manual_seed(1), 10)
    figures = score(Oracle(batch, 7), batch)
    assert figures == {"loss": 0.0, "accuracy": 1.0, "sequence_accuracy": 1.0}
    wrong_on_targets = Oracle(TaskBatch(batch.inputs, (batch.targets + 1) % 7, batch.mask), 7)  # wrong where it counts
    assert score(wrong_on_targets, batch)["accuracy"] == 0.0


# --- networks ----------------------------------------------------------------------------------


@pytest.mark.parametrize("cell", ["lstm", "grid-lstm", "gru", "lru"])
def test_tied_networks_have_the_same_count_at_every_depth(cell):
    task = Memorization(length=3, symbols=8)
    counts = {layers: count_parameters(build_task_model(task, cell, 16, layers, tied=True)) for layers in (1, 4, 9)}
    assert len(set(counts.values())) == 1, counts
    untied = [count_parameters(build_task_model(task, cell, 16, layers, tied=False)) for layers in (1, 4)]
    assert untied[1] > untied[0]


def test_a_tied_stack_runs_one_block_at_every_layer():
    model = build_task_model(Memorization(length=3, symbols=8), "lstm", 16, 5, tied=True)
    layers = model.language_model.layers
    assert all(layer is layers[0] for layer in layers)


def test_parity_networks():
    task = Parity(bits=12)
    depth = [count_parameters(build_task_model(task, "grid-lstm", 20, layers)) for layers in (1, 10)]
    assert depth[0] == depth[1] == 12 * 40 + 40 + 20 * 80 + 80 + 20 * 2 + 2  # h₀/m₀ projection, tied gates, softmax
    relu = build_task_model(task, "relu", 20, 3)
    assert count_parameters(relu) == (12 * 20 + 20) + 2 * (20 * 20 + 20) + (20 * 2 + 2)
    logits = relu(task.sample(torch.Generator().manual_seed(0), 5).inputs)
    assert logits.shape == (5, 1, 2)


# --- thresholds and the training loop ------------------------------------------------------------


def test_thresholds_are_recorded_once_when_first_exceeded():
    progress = TaskProgress()
    trace = [(100, 0.4), (200, 0.5), (300, 0.81), (400, 0.7), (500, 0.995), (600, 1.0), (700, 1.0)]
    crossed = []
    for samples, accuracy in trace:
        progress.samples = samples
        crossed.append(update_thresholds(progress, accuracy))
    assert progress.reached == {"0.5": 300, "0.8": 300, "0.99": 500, "1.0": 600}  # 0.5 is exceeded, not met
    assert crossed == [[], [], [0.5, 0.8], [], [0.99], [1.0], []]


def tiny(**overrides) -> TaskConfig:
    values = dict(
        task="memorization",
        cell="grid-lstm",
        layers=2,
        length=2,
        symbols=3,
        hidden_size=32,
        max_samples=20_000,
        eval_every=500,
        device="cpu",
    )
    return TaskConfig(**{**values, **overrides})


def records(run_dir, event):
    return [
        row for row in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if row["event"] == event
    ]


def test_a_grid_lstm_learns_a_short_memorization_to_100_percent(tmp_path):
    end = train_task(tiny(), run_dir=tmp_path / "run")
    assert end["stopped_by"] == "solved" and end["accuracy"] == 1.0 and end["samples"] < 20_000
    assert set(end["reached"]) == {"0.5", "0.8", "0.99", "1.0"}
    assert end["reached"]["0.5"] <= end["reached"]["0.8"] <= end["reached"]["0.99"] <= end["reached"]["1.0"]
    evaluations = records(tmp_path / "run", "task_eval")
    assert evaluations[-1]["accuracy"] == 1.0 and evaluations[-1]["samples"] == end["samples"]
    assert records(tmp_path / "run", "task_end")[0]["reached"] == end["reached"]


def test_resume_continues_exactly(tmp_path):
    config = tiny(cell="lstm", tied=True, max_samples=1_200, eval_every=300)
    straight = train_task(config, run_dir=tmp_path / "straight")
    first = train_task(tiny(cell="lstm", tied=True, max_samples=600, eval_every=300), run_dir=tmp_path / "resumed")
    assert first["stopped_by"] == "samples" and first["samples"] == 600
    resumed = train_task(run_dir=tmp_path / "resumed", resume=True, max_samples=1_200)
    assert resumed["samples"] == straight["samples"] == 1_200
    assert resumed["accuracy"] == straight["accuracy"] and resumed["reached"] == straight["reached"]
    weights = [
        torch.load(tmp_path / name / "last.pt", weights_only=True)["weights"] for name in ("straight", "resumed")
    ]
    assert all(torch.equal(weights[0][key], weights[1][key]) for key in weights[0])
    assert [r["accuracy"] for r in records(tmp_path / "straight", "task_eval")] == [
        r["accuracy"] for r in records(tmp_path / "resumed", "task_eval")
    ]


def test_a_task_checkpoint_is_a_charlm_checkpoint_of_its_own_kind(tmp_path):
    """The task loop writes the language-model loop's format (kind "task", a TrainingState); the
    language-model readers say what it is, and a task checkpoint of charlm 0.3 still resumes."""
    train_task(tiny(cell="lstm", tied=True, max_samples=300, eval_every=300), run_dir=tmp_path / "run")
    payload = torch.load(tmp_path / "run" / "last.pt", weights_only=True)
    assert (payload["format"], payload["kind"]) == ("charlm-checkpoint", "task")
    assert set(payload["training"]) == {"optimizer", "scheduler", "rng", "progress", "hidden"}
    assert_one_line_error(cli("eval", tmp_path / "run" / "last.pt"), "is a checkpoint of `charlm task`")
    old = {  # the format charlm 0.3 wrote
        "format": "charlm-task-1",
        "config": payload["task_config"],
        "model": payload["weights"],
        "optimizer": payload["training"]["optimizer"],
        "generator": payload["training"]["rng"]["torch"],
        "progress": payload["training"]["progress"],
    }
    torch.save(old, tmp_path / "run" / "last.pt")
    assert train_task(run_dir=tmp_path / "run", resume=True, max_samples=600)["samples"] == 600


def test_the_command_line_trains_resumes_and_lists_the_run(tmp_path):
    run = tmp_path / "cli"
    result = cli(
        "task",
        "addition",
        "--digits",
        "2",
        "--hidden",
        "16",
        "--layers",
        "2",
        "--untied",
        "--cell",
        "lstm",
        "--max-samples",
        "300",
        "--eval-every",
        "150",
        "--run-dir",
        run,
        check_code=0,
    )
    assert f"{run}: stopped at --max-samples after 300 samples" in result.stdout
    cli("task", "--resume", run, "--max-samples", "450", check_code=0)
    assert records(run, "task_end")[-1]["samples"] == 450
    listing = cli("runs", tmp_path, check_code=0)
    assert "addition" in listing.stdout and "finished" in listing.stdout
    assert_one_line_error(cli("task", "--resume", run, "--max-samples", "450"), "has used its 450 samples")


@pytest.mark.parametrize(
    "args, message",
    [
        (["nope"], "unknown task 'nope': choose one of memorization, addition, parity"),
        (["memorization", "--length", "0"], "--length) must be an integer from 1 to 10,000, not 0"),
        (["memorization", "--length", "-3"], "not -3"),
        (["memorization", "--symbols", "1"], "--symbols) must be an integer from 2"),
        (["addition", "--digits", "5000"], "--digits) must be an integer from 1 to 1,000, not 5000"),
        (["parity", "--bits", "0"], "--bits) must be an integer from 1"),
        (["addition", "--length", "4"], "addition takes --digits, not --length"),
        (["memorization", "--cell", "scrn", "--layers", "2", "--tied"], "cell 'scrn' cannot tie its layers"),
        (["parity", "--cell", "relu", "--tied"], "the relu feed-forward baseline cannot tie its layers"),
        (["parity", "--cell", "lstm"], "parity is run with grid-lstm, relu, tanh"),
        (["memorization", "--cell", "nope"], "unknown cell 'nope'"),
        (["memorization", "--optimizer", "rmsprop"], "--optimizer must be one of adam, adagrad, sgd"),
        (["memorization", "--layers", "0"], "--layers must be in [1, 1024], not 0"),
        (["memorization", "--lr", "0"], "--lr must be in (0, 1000], not 0.0"),
        ([], "name a task"),
    ],
)
def test_bad_task_options_are_one_line(tmp_path, args, message):
    result = cli("task", *args, "--run-dir", tmp_path / "run", "--max-samples", "15")
    assert_one_line_error(result, message)
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


# --- plans, sweeps and the report ----------------------------------------------------------------

TINY_PLAN = """name = "tiny-memorization"
task = "memorization"
[base]
length = 2
symbols = 3
hidden_size = 16
max_samples = 600
eval_every = 300
[axes]
model = [{ cell = "lstm", tied = true }, { cell = "grid-lstm" }]
layers = [1, 2]
"""


def test_a_task_plan_sweeps_and_reports_samples_to_each_threshold(tmp_path):
    plan = tmp_path / "tiny.toml"
    plan.write_text(TINY_PLAN, encoding="utf-8")
    dry = cli("sweep", plan, "--dir", tmp_path / "sweep", "--dry-run", check_code=0)
    assert "grid-lstm tied" in dry.stdout and "lstm tied" in dry.stdout and "600 samples" in dry.stdout
    result = cli("sweep", plan, "--dir", tmp_path / "sweep", check_code=0)
    assert "4 finished" in result.stdout and "held-out accuracy" in result.stderr
    again = cli("sweep", plan, "--dir", tmp_path / "sweep", check_code=0)
    assert "finished earlier; skipped" in again.stderr
    report = cli("report", tmp_path / "sweep", check_code=0)
    assert "Samples to each held-out accuracy threshold" in report.stdout
    out = tmp_path / "sweep" / "report"
    assert sorted(path.name for path in out.iterdir()) == ["index.md", "tasks.csv", "tasks.md", "thresholds.png"]
    rows = list(csv.reader(io.StringIO((out / "tasks.csv").read_text())))
    assert rows[0][:9] == ["task", "network", "layers", "seeds", "parameters", ">50%", ">80%", ">99%", "100%"]
    by_network = {(row[1], int(row[2])): row for row in rows[1:]}
    assert set(by_network) == {("lstm tied", 1), ("lstm tied", 2), ("grid-lstm tied", 1), ("grid-lstm tied", 2)}
    for network in ("lstm tied", "grid-lstm tied"):  # a tied network has one count at every depth
        assert by_network[(network, 1)][4] == by_network[(network, 2)][4]
    end = records(tmp_path / "sweep" / "model-lstm-true_layers-1", "task_end")[0]
    for column, threshold in zip(range(5, 9), ("0.5", "0.8", "0.99", "1.0")):
        expected = f"{end['reached'][threshold]:,} (1/1)" if threshold in end["reached"] else "- (0/1)"
        assert by_network[("lstm tied", 1)][column] == expected


@pytest.mark.parametrize(
    "text, fragment",
    [
        ('task = "memorization"\n[base]\nepochs = 3\n', "unknown setting 'epochs' (any `charlm task` setting"),
        ('task = "memorization"\n[base]\nlength = 0\n', "--length) must be an integer from 1"),
        ('task = "nope"\n', "unknown task 'nope'"),
        (
            'task = "memorization"\n[axes]\nmodel = [{ cell = "scrn", tied = true, layers = 2 }]\n',
            "cannot tie its layers",
        ),
        ('task = "memorization"\n[[eval]]\nsplit = "test"\n', "a task plan has no [[eval]] steps"),
    ],
)
def test_bad_task_plans_are_one_line(tmp_path, text, fragment):
    plan = tmp_path / "bad.toml"
    plan.write_text(text, encoding="utf-8")
    assert_one_line_error(cli("sweep", plan, "--dir", tmp_path / "sweep", "--dry-run"), fragment)


# --- the wavefront -------------------------------------------------------------------------------


@pytest.mark.parametrize("cell", ["grid-lstm", "lstm", "gru", "delta-rnn", "lru", "rhn"])
def test_the_wavefront_computes_the_layer_by_layer_function(cell):
    task = Memorization(length=4, symbols=6)
    torch.manual_seed(0)
    model = build_task_model(task, cell, 12, 5, tied=True).double()
    assert model.use_wavefront == (cell == "grid-lstm")  # where it was measured faster
    model.use_wavefront = True
    tokens = task.sample(torch.Generator().manual_seed(2), 3).inputs
    fast = model(tokens)
    fast.sum().backward()
    fast_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    model.use_wavefront = False
    plain = model(tokens)
    plain.sum().backward()
    assert torch.allclose(fast, plain, rtol=0, atol=1e-12)
    assert all(torch.allclose(a, p.grad, rtol=0, atol=1e-10) for a, p in zip(fast_grads, model.parameters()))


def test_untied_and_single_layer_stacks_run_layer_by_layer():
    task = Memorization(length=3, symbols=4)
    assert not build_task_model(task, "grid-lstm", 8, 4, tied=False).use_wavefront
    assert not build_task_model(task, "grid-lstm", 8, 3, tied=True).use_wavefront  # too shallow to gain
    assert build_task_model(task, "grid-lstm", 8, 4, tied=True).use_wavefront
    assert not build_task_model(task, "lstm", 8, 8, tied=True).use_wavefront  # its own loop is faster


def test_a_run_checks_its_wavefront_and_records_the_check(tmp_path):
    train_task(tiny(layers=4, max_samples=300, eval_every=300), run_dir=tmp_path / "run")
    [check] = records(tmp_path / "run", "fast_path")
    assert check["path"] == "wavefront" and check["active"] and check["max_difference"] <= check["tolerance"] == 1e-4
    train_task(tiny(layers=4, max_samples=300, eval_every=300, wavefront=False), run_dir=tmp_path / "off")
    assert records(tmp_path / "off", "fast_path") == []


def test_a_wavefront_that_disagrees_is_turned_off(monkeypatch):
    from charlm.tasks import models

    task = Memorization(length=3, symbols=4)
    model = build_task_model(task, "grid-lstm", 8, 4, tied=True)
    monkeypatch.setattr(
        models,
        "wavefront",
        lambda block, depth, inputs: models.torch.zeros(inputs.shape[0], inputs.shape[1], block.output_size),
    )
    check = models.check_wavefront(model, task.sample(torch.Generator().manual_seed(0), 2).inputs)
    assert (
        not check["active"] and not model.use_wavefront and "differs from the layer-by-layer code" in check["failure"]
    )


# --- memory: a run no machine can hold is refused before anything is allocated or written ----------


@pytest.mark.parametrize(
    "task", [Memorization(length=5, symbols=7), Addition(digits=4), Parity(bits=9)], ids=lambda t: t.name
)
def test_a_samples_bytes_cover_the_tensors_it_is_drawn_as(task):
    batch = task.sample(torch.Generator().manual_seed(0), 6)
    assert sum(tensor.nbytes for tensor in (batch.inputs, batch.targets, batch.mask)) < 6 * task.sample_bytes


def test_the_memory_estimate_counts_the_network_one_batch_and_the_samples():
    from charlm.tasks.models import estimate_task_memory

    parity = Parity(bits=10)  # the 1-D Grid LSTM: one step whose input is the bits, 2 classes
    estimate = estimate_task_memory(parity, "grid-lstm", 8, 3, None, {}, batch_size=5, eval_samples=7)
    assert estimate.parameters == count_parameters(build_task_model(parity, "grid-lstm", 8, 3))
    assert estimate.state_bytes == 16 * estimate.parameters  # weights, gradients, two moments
    assert estimate.activation_bytes == 5 * 3 * 8 * 4 * 13 + 5 * (10 + 4 * 2) * 4
    assert estimate.sample_bytes == (5 + 7) * (12 * 10 + 17)
    memorization = Memorization(length=3, symbols=4)  # a window of 8 positions, 5 symbols, embedded in 8 units
    estimate = estimate_task_memory(memorization, "lstm", 8, 2, None, {}, batch_size=5, eval_samples=7)
    assert estimate.parameters == count_parameters(build_task_model(memorization, "lstm", 8, 2))
    assert estimate.activation_bytes == 5 * 8 * (2 * 8 * 4 * 15 + (8 + 4 * 5) * 4)
    assert estimate.sample_bytes == (5 + 7) * (8 * 3 + 17 * 8)
    assert estimate.total_bytes == estimate.state_bytes + estimate.activation_bytes + estimate.sample_bytes


def test_hidden_is_the_option_of_train_and_task_and_hidden_size_still_works(tmp_path, monkeypatch):
    """Issue 34: `charlm task` took --hidden-size where `charlm train` takes --hidden; --hidden now, the old name
    kept."""
    import charlm.tasks.training as training

    received = []
    monkeypatch.setattr(
        training, "build_task_model", lambda task, cell, hidden, *rest: received.append(hidden) or 1 / 0
    )
    for flag in ("--hidden", "--hidden-size"):
        # stopped where the network would be built (an unexpected error: exit code 70): the value got there
        result = cli("task", "parity", "--bits", "4", flag, "12", "--device", "cpu", "--run-dir", tmp_path / flag)
        assert result.returncode == 70 and "internal error: ZeroDivisionError" in result.stderr
    assert received == [12, 12]
    assert_one_line_error(cli("task", "parity", "--hidden", "0"), "--hidden must be in [1, 1048576], not 0")
    help_text = cli("task", "--help").stdout
    assert "--hidden" in help_text and "--hidden-size" in help_text


def test_a_task_run_that_does_not_fit_is_refused_naming_the_options_of_its_larger_part():
    from charlm.errors import CharlmError
    from charlm.tasks.models import estimate_task_memory
    from charlm.tasks.training import check_task_fits

    cpu = torch.device("cpu")
    for overrides, first in (
        (
            {"hidden_size": 2000},
            "use a smaller --hidden or fewer --layers, or a smaller --batch-size, --length or --eval-samples",
        ),
        (
            {"batch_size": 100_000},
            "use a smaller --batch-size, --length or --eval-samples, or a smaller --hidden or fewer --layers",
        ),
    ):
        config = tiny(**overrides).resolved()
        task = config.make_task()
        needed = estimate_task_memory(
            task,
            config.cell,
            config.hidden_size,
            config.layers,
            config.tied,
            {},
            config.batch_size,
            config.eval_samples,
        ).total_bytes
        check_task_fits(config, task, cpu, available=needed)  # just fits
        with pytest.raises(CharlmError) as refused:
            check_task_fits(config, task, cpu, available=needed - 1)
        assert str(refused.value).endswith(first) and "cpu has" in str(refused.value)
        assert "--bits" not in str(refused.value)


def test_a_run_too_large_leaves_no_directory_and_a_resumed_one_is_refused_untouched(tmp_path, monkeypatch):
    import charlm.runtime.memory as memory
    from charlm.errors import CharlmError

    monkeypatch.setattr(memory, "available_memory", lambda device: 10 * 1024**2)
    with pytest.raises(CharlmError, match="use a smaller --batch-size, --bits or --eval-samples"):
        train_task(TaskConfig(task="parity", batch_size=1_000_000, device="cpu"), run_dir=tmp_path / "new")
    assert not (tmp_path / "new").exists()
    run = tmp_path / "run"
    train_task(
        TaskConfig(task="parity", bits=4, hidden_size=4, max_samples=20, eval_every=20, eval_samples=4, device="cpu"),
        run_dir=run,
    )
    before = {path.name: path.read_bytes() for path in run.iterdir() if path.is_file()}
    monkeypatch.setattr(memory, "available_memory", lambda device: 1)
    with pytest.raises(CharlmError, match="resume it where more memory is free"):
        train_task(run_dir=run, resume=True, max_samples=40)
    assert {path.name: path.read_bytes() for path in run.iterdir() if path.is_file()} == before
    monkeypatch.undo()
    assert train_task(run_dir=run, resume=True, max_samples=40)["samples"] == 40  # the refusal let go of the run
