"""The models a server holds, by name: a run directory's name, or a checkpoint file's (its
directory's for best.pt and last.pt); a request names a model, never a path."""

from __future__ import annotations

from pathlib import Path

from charlm.api import Model
from charlm.errors import CharlmError


def model_name(reference: str | Path) -> str:
    path = Path(reference).resolve()
    if path.is_file() and path.stem in ("best", "last") and path.parent.name:
        return path.parent.name
    return path.stem if path.is_file() else path.name


def named(references, load) -> dict[str, Model]:
    """``load(reference)`` of each reference under its name; a repeated name gets -2, -3..."""
    models: dict[str, Model] = {}
    for reference in references:
        base = model_name(reference) or "model"
        name, number = base, 1
        while name in models:
            number += 1
            name = f"{base}-{number}"
        models[name] = load(reference)
    if not models:
        raise CharlmError("give at least one run directory or checkpoint to serve")
    return models


def describe(name: str, model: Model) -> dict:
    """What GET /v1/models says of a model."""
    config, checkpoint = model.config, model.checkpoint
    scores = {key: value for key, value in checkpoint.scores.items() if isinstance(value, (int, float))}
    memory = len(model.network.initial_state(1, device=model.device)[0]) > 1
    return {
        "name": name,
        "cell": config.cell,
        "layers": config.layers,
        "hidden_size": config.hidden_size,
        "parameters": model.parameters_count,
        "unit": model.unit,
        "corpus": checkpoint.train_config.corpus,
        "vocabulary": model.vocabulary,
        "scores": scores,
        "test_bpc": scores.get("test_bpc"),
        "has_memory": memory,
        "device": str(model.device),
    }
