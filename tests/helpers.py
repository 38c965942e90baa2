"""Shared helpers for tests that train small models: a prepared tiny corpus and CLI runs."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pydoc_data.topics

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
        assert result.returncode == check_code, f"exit {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    return result


def run_cli(*args, cwd=None, env=None, check_code=None, timeout=300) -> subprocess.CompletedProcess:
    """Run `python -m charlm ARGS` in a real subprocess (for exit codes, tracebacks, signals)."""
    environment = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    result = subprocess.run(
        [sys.executable, "-m", "charlm", *map(str, args)],
        cwd=cwd, env=environment, capture_output=True, text=True, timeout=timeout,
    )
    if check_code is not None:
        assert result.returncode == check_code, f"exit {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
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
    import torch

    eager_state, replayed_state = state, state
    for t in range(start, tokens.shape[1]):
        eager_logits, eager_state = step(tokens[:, t], eager_state)
        logits, replayed_state = graphed(tokens[:, t], replayed_state)
        torch.testing.assert_close(logits, eager_logits)
        for eager_layer, layer in zip(eager_state, replayed_state):
            for a, b in zip(eager_layer, layer):
                torch.testing.assert_close(b, a)
