"""A run directory: resolved config, metrics.jsonl, a log, and the last/best checkpoints."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

from charlm.errors import CharlmError


class RunDirectory:
    def __init__(self, path: str | Path):
        self.path = Path(path)

    @property
    def last(self) -> Path:
        return self.path / "last.pt"

    @property
    def best(self) -> Path:
        return self.path / "best.pt"

    @property
    def metrics(self) -> Path:
        return self.path / "metrics.jsonl"

    @property
    def config(self) -> Path:
        return self.path / "config.json"

    @property
    def log_file(self) -> Path:
        return self.path / "train.log"

    def create(self) -> None:
        if self.last.exists() or self.best.exists():
            raise CharlmError(f"run directory {self.path} already holds a run: pass --resume {self.path}, or another --run-dir")
        self.path.mkdir(parents=True, exist_ok=True)

    def write_config(self, config: dict) -> None:
        temporary = self.config.with_suffix(".json.tmp")
        temporary.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        temporary.replace(self.config)

    def record(self, event: str, **fields) -> None:
        """Append one JSON object to metrics.jsonl."""
        row = {"event": event, "time": round(time.time(), 3), **fields}
        with self.metrics.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(row, default=_plain) + "\n")

    def log(self, message: str) -> None:
        """A line for the person watching (stderr) and for the run's log file."""
        print(message, file=sys.stderr, flush=True)
        with self.log_file.open("a", encoding="utf-8") as handle:
            handle.write(message + "\n")


def default_run_dir(corpus: str, cell: str) -> Path:
    safe_cell = cell.replace(":", "-").replace(".", "-").replace("/", "-")
    return Path("runs") / f"{corpus}-{safe_cell}-{time.strftime('%Y%m%d-%H%M%S')}"


def _plain(value):
    if isinstance(value, torch.Tensor):
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"cannot write {type(value).__name__} to metrics")
