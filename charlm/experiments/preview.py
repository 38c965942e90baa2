"""What `charlm sweep --dry-run` shows of each point: its settings, hidden size and parameter count."""

from __future__ import annotations

import json

import torch

from charlm.experiments.plan import Point, task_config
from charlm.cells import CELLS
from charlm.corpora.catalog import vocabulary_size
from charlm.model import LanguageModel, count_parameters
from charlm.training.setup import model_config_for
from charlm.tasks.models import build_task_model


def describe_point(sweep, point: Point) -> dict:
    """What a dry run shows of a point: its settings, hidden size and parameter count."""
    if sweep.plan.task is not None:
        return _describe_task_point(sweep, point)
    config = sweep.config(point)
    vocabulary, assumed = vocabulary_size(config.corpus, sweep.data_dir)
    row = {
        "run": point.name,
        "corpus": config.corpus,
        "cell": config.cell,
        "layers": config.layers,
        "params": config.params,
        "state": sweep.state(point),
        "hidden": None,
        "parameters": None,
        "vocabulary": vocabulary,
        "vocabulary_assumed": assumed,
    }
    if vocabulary is not None and ":" not in config.cell:
        key = json.dumps(
            [
                vocabulary,
                config.cell,
                config.params,
                config.hidden_size,
                config.layers,
                config.embed_size,
                config.cell_options,
                config.wiring,
                config.block_conv,
                config.block_expansion,
                config.tie_weights,
                config.head_bias,
            ],
            sort_keys=True,
        )
        if key not in sweep.model_sizes:
            cell_class = CELLS.get(config.cell)
            model_config = model_config_for(config, vocabulary, cell_class)
            with torch.device("meta"):
                sweep.model_sizes[key] = (
                    model_config.hidden_size,
                    count_parameters(LanguageModel(model_config, cell_class)),
                )
        row["hidden"], row["parameters"] = sweep.model_sizes[key]
    return row


def _describe_task_point(sweep, point: Point) -> dict:
    config = task_config(sweep.plan, point).resolved()
    with torch.device("meta"):
        model = build_task_model(
            config.make_task(), config.cell, config.hidden_size, config.layers, config.tied, config.cell_options
        )
    tied = "tied" if (config.tied if config.tied is not None else config.cell == "grid-lstm") else "untied"
    return {
        "run": point.name,
        "corpus": sweep.plan.task,
        "cell": f"{config.cell} {tied}",
        "layers": config.layers,
        "params": f"{config.max_samples:,} samples",
        "state": sweep.state(point),
        "hidden": config.hidden_size,
        "parameters": count_parameters(model),
        "vocabulary": None,
        "vocabulary_assumed": False,
    }
