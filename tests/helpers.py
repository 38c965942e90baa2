"""Shared helpers for tests that train small models: a prepared tiny corpus and CLI runs."""

from __future__ import annotations

import contextlib
import io
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pydoc_data.topics
import torch

from charlm.checkpoint import Checkpoint
from charlm.config import TrainConfig

REPO = Path(__file__).resolve().parents[1]
SHARED_CORPORA = REPO.parent / "shared" / "corpora"


def pydoc_text(characters: int) -> str:
    text = "".join(pydoc_data.topics.topics[key] for key in sorted(pydoc_data.topics.topics))
    return text[:characters]


def prepare_tiny_corpus(data_dir: Path, name: str = "tiny", characters: int = 40_000) -> str:
    """A `text` corpus of real prose, prepared through the library into ``data_dir``."""
    from charlm.corpora import prepare_corpus

    source = data_dir.parent / f"{name}.txt"
    source.write_text(pydoc_text(characters), encoding="utf-8")
    prepare_corpus("text", data_dir=data_dir, paths=[source], output_name=name, unknown="unk", progress=False)
    return name


@dataclass
class CliResult:
    """What an in-process run of the command line printed, and its exit code."""

    returncode: int
    stdout: str
    stderr: str


def cli(*args, check_code=None, stdin: str | None = None) -> CliResult:
    """Run `charlm ARGS` in this process (no torch import per call): exit code, stdout, stderr."""
    from charlm.cli.app import run

    out, err = io.StringIO(), io.StringIO()
    old_stdin = sys.stdin
    if stdin is not None:
        sys.stdin = io.TextIOWrapper(io.BytesIO(stdin.encode("utf-8")), encoding="utf-8")
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = run([str(a) for a in args])
    finally:
        sys.stdin = old_stdin
    result = CliResult(code, out.getvalue(), err.getvalue())
    if check_code is not None:
        assert result.returncode == check_code, (
            f"exit {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
        )
    return result


def terminal_of(monkeypatch, columns: int = 80) -> None:
    """Print as on a terminal of ``columns`` columns (``COLUMNS=80 charlm ...``): charlm's stdout
    console is created at import, so its width is set too; typer's --help reads COLUMNS itself."""
    from charlm.cli import output

    monkeypatch.setenv("COLUMNS", str(columns))
    monkeypatch.setattr(output.stdout, "width", columns)


def assert_fits(text: str, columns: int = 80) -> None:
    """No line of ``text`` is wider than ``columns``."""
    wide = [line for line in text.splitlines() if len(line) > columns]
    assert not wide, f"{len(wide)} line(s) wider than {columns} columns:\n" + "\n".join(wide)


def table_header(text: str) -> list[str]:
    """The column names of the (first) table in ``text``, as its first header line shows them (the
    first column's name first where it stands on a line of its own above the others)."""
    lines = [line for line in text.splitlines() if line.startswith("┃")]
    if not lines[0].endswith("┃"):
        return [lines[0][1:].strip(), *[cell.strip() for cell in lines[1].split("┃")[1:-1]]]
    return [cell.strip() for cell in lines[0].split("┃")[1:-1]]


def table_lines(text: str) -> list[list[str]]:
    """The cells of each body line of the tables in ``text`` (a row that wraps takes several lines).
    Where each row's name stands on a line of its own above its other cells, it is read as the first
    cell of the row's first line (and an empty one on the row's other lines)."""
    lines, name = [], None
    for line in text.splitlines():
        if line.startswith("└"):  # the end of a table
            name = None
        if not line.startswith("│"):
            continue
        if not line.endswith("│"):  # a row's name, above its other cells
            name = line[1:].strip()
            continue
        cells = [cell.strip() for cell in line.split("│")[1:-1]]
        lines.append(cells if name is None else [name, *cells])
        name = None if name is None else ""
    return lines


def run_cli(*args, cwd=None, env=None, check_code=None, timeout=300) -> subprocess.CompletedProcess:
    """Run `python -m charlm ARGS` in a real subprocess (for exit codes, tracebacks, signals)."""
    environment = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    result = subprocess.run(
        [sys.executable, "-m", "charlm", *map(str, args)],
        cwd=cwd,
        env=environment,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check_code is not None:
        assert result.returncode == check_code, (
            f"exit {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
        )
    return result


def assert_one_line_error(result, *fragments: str, code: int = 2) -> None:
    assert result.returncode == code, f"exit {result.returncode}\nstderr:\n{result.stderr}"
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines and lines[-1].startswith("charlm: error: "), result.stderr
    for fragment in fragments:
        assert fragment in lines[-1], f"{fragment!r} not in {lines[-1]!r}"


def assert_replays_the_step(step, graphed, tokens, state, start: int) -> None:
    """``graphed`` (a captured ``step``) gives the logits and state that ``step`` gives, symbol
    after symbol from ``tokens[:, start]`` on, each fed its own previous state."""

    eager_state, replayed_state = state, state
    for t in range(start, tokens.shape[1]):
        eager_logits, eager_state = step(tokens[:, t], eager_state)
        logits, replayed_state = graphed(tokens[:, t], replayed_state)
        torch.testing.assert_close(logits, eager_logits)
        for eager_layer, layer in zip(eager_state, replayed_state):
            for a, b in zip(eager_layer, layer):
                torch.testing.assert_close(b, a)


# --- training runs compared bit for bit ---------------------------------------------------------


TINY = dict(  # a small model of the tiny corpus, trained in seconds
    corpus="tiny", cell="lstm", hidden_size=24, batch_size=8, bptt=16, epochs=2, log_every=5, lr=1e-3, eval_batch_size=4
)


def assert_drops_its_embedding_alone(model, p: float) -> None:
    """``model``, a stack of residual blocks in training mode whose blocks pass the stream on unchanged, is
    softmax(norm(drop(embedding))): dropout on the embedding once, none between blocks or at the top."""
    tokens = torch.randint(model.config.vocab_size, (2, 7), generator=torch.Generator().manual_seed(3))
    torch.manual_seed(4)
    logits, _ = model(tokens, model.initial_state(2))
    torch.manual_seed(4)
    dropped = torch.nn.functional.dropout(model.embedding(tokens.t()), p)  # time-major, as the model draws it
    torch.testing.assert_close(logits, model.head(model.final_norm(dropped)).transpose(0, 1))


def tiny_config(corpus_dir, run_dir, **overrides) -> TrainConfig:
    return TrainConfig(**{**TINY, "data_dir": str(corpus_dir), "run_dir": str(run_dir), **overrides})


def tiny_train(corpus_dir, run_dir=None, *extra, **overrides) -> list:
    """The arguments of ``charlm train`` for ``tiny_config``'s run: its settings as flags (``overrides`` by
    field name; None leaves a setting to charlm's default, True and False are a flag and its --no- form),
    then ``extra``."""
    from charlm.settings import flag_of

    arguments = ["train"]
    for name, value in {**TINY, "data_dir": corpus_dir, "run_dir": run_dir, **overrides}.items():
        flag = flag_of(TrainConfig, name)
        if isinstance(value, bool):
            arguments.append(flag if value else f"--no-{flag[2:]}")
        elif value is not None:
            arguments += [flag, value]
    return [*arguments, *extra]


def weights(run_dir, name="last.pt"):
    return Checkpoint.load(run_dir / name).weights


def assert_same_weights(a, b):
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


def assert_same_state(a, b):
    """Equal nested containers of tensors and plain values, tensors bit for bit."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), (a.keys(), b.keys())
        for key in a:
            assert_same_state(a[key], b[key])
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b)
        for x, y in zip(a, b):
            assert_same_state(x, y)
    else:
        assert a == b, (a, b)


def assert_same_run_end(straight, resumed):
    """The same weights, and the same learning-rate schedule and optimizer state, bit for bit."""
    a, b = Checkpoint.load(straight / "last.pt"), Checkpoint.load(resumed / "last.pt")
    assert_same_weights(a.weights, b.weights)
    assert a.training.scheduler is not None
    assert_same_state(a.training.scheduler, b.training.scheduler)
    lrs = [[group["lr"] for group in c.training.optimizer["param_groups"]] for c in (a, b)]
    assert lrs[0] == lrs[1]
    assert_same_state(a.training.optimizer, b.training.optimizer)
    assert a.training.progress["epoch"] == b.training.progress["epoch"]
    assert a.training.progress["step"] == b.training.progress["step"]


def readme_cell_source() -> str:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    match = re.search(r"```python\n# mycells.py\n(.*?)```", readme, re.S)
    assert match, "README.md lost its user-cell example"
    return match.group(1)


def records(run_dir, *events: str) -> list[dict]:
    """A run's metrics.jsonl records as JSON objects, read through the one reader (RunHistory);
    only those of ``events`` when given."""
    from charlm.runs.history import RunHistory

    history = RunHistory.read(Path(run_dir) / "metrics.jsonl")
    return [record.to_dict() for record in (history.of(*events) if events else history.records)]
