"""`charlm runs`: one row per run directory, read through its files and its ``RunHistory``."""

from __future__ import annotations

from charlm.errors import CharlmError
from charlm.runs.retention import disk_usage

SUMMARY_KEYS = (
    "run",
    "corpus",
    "task_accuracy",
    "task_samples",
    "cell",
    "layers",
    "hidden",
    "parameters",
    "epochs",
    "train_fraction",
    "tokens_seen",
    "best_epoch",
    "best_valid_bpc",
    "test_bpc",
    "dynamic",
    "train_seconds",
    "status",
    "disk_bytes",
    "provenance",
    "damage",
)  # of summary_of()


def summary_of(run) -> dict:
    """One row of `charlm runs`: settings, size, progress, scores, time, status. A damaged run
    (config.json or metrics.jsonl unreadable, or of the wrong types) is a row with status
    ``damaged``, the reason in ``damage`` and every figure None: the other runs still show."""
    try:
        return _summary(run)
    except CharlmError as error:
        return {
            **{key: None for key in SUMMARY_KEYS},
            "run": str(run.path),
            "dynamic": {},
            "status": "damaged",
            "damage": str(error),
            "disk_bytes": disk_usage(run.path),
            "provenance": run.read_json(run.provenance_file),
        }


def _summary(run) -> dict:
    config = run.read_config()
    train, model = config.get("train", {}), config.get("model", {})
    history = run.history()
    best = history.best
    dynamic = {}
    for record in history.evaluations:
        if record.mode == "dynamic":
            method = (record.hyperparameters or {}).get("method", "dynamic")
            dynamic[f"{method} {record.split}" + (" #2" if record.adapt_on else "")] = record.dynamic_bpc
    task_evals = history.of("task_eval")  # a `charlm task` run: its held-out accuracy, no epochs
    return {
        "run": str(run.path),
        "corpus": train.get("corpus"),
        "task_accuracy": task_evals[-1].accuracy if task_evals else None,
        "task_samples": task_evals[-1].samples if task_evals else None,
        "cell": model.get("cell", train.get("cell")),
        "layers": model.get("layers"),
        "hidden": model.get("hidden_size"),
        "parameters": history.parameters,
        "epochs": len(history.full_epochs),
        "train_fraction": train.get("train_fraction"),
        "tokens_seen": next(
            (record.tokens_seen for record in reversed(history.of("epoch", "end")) if record.tokens_seen is not None),
            None,
        ),
        "best_epoch": best.epoch if best else None,
        "best_valid_bpc": best.valid_bpc if best else None,
        "test_bpc": history.test_bpc_at_best,
        "dynamic": dynamic,
        "train_seconds": task_evals[-1].seconds if task_evals else history.train_seconds,
        "status": run.status(history),
        "disk_bytes": disk_usage(run.path),
        "provenance": run.read_json(run.provenance_file),
        "damage": None,
    }
