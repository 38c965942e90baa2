"""What a checkpoint must be before anything is built from it: the checks of its one reader.

``Checkpoint.load`` reads a file weights-only (no code runs); its contents are then untrusted input,
checked here before torch is asked to allocate anything for them:

- ``check_parts``: every part has its type (the weights a mapping of names to tensors, the
  vocabulary a list of distinct strings, one character each in a character or byte vocabulary);
- ``check_consistency``: the settings pass the same bounds as the command line's
  (``charlm.settings.validate``; their types were checked by ``from_dict`` already), and the
  vocabulary, ``vocab_size`` and the rows of the embedding and of the output layer agree;
- ``check_against_model``: every weight has the shape of the model the settings describe, built on
  the ``meta`` device (nothing allocated);
- the parts a resume puts back are put back, before the run starts, into its own optimizer and
  schedule on the meta device (``charlm.training.setup.check_training_state``).

Each failure is one ``CharlmError`` that names the file.
"""

from __future__ import annotations

import dataclasses
import torch

from charlm.corpora.vocabulary import vocabulary_problem
from charlm.errors import CharlmError, ConfigError, kind_of, shown
from charlm.settings import validate
from charlm.model import LanguageModel
from charlm.regularisers import REGULARISER_FIELDS

# The model's settings, as TrainConfig names them and bounds them.
MODEL_FIELDS = (
    "hidden_size",
    "layers",
    "embed_size",
    "dropout",
    "wiring",
    "block_conv",
    "block_expansion",
    "tie_weights",
    "head_bias",
    *REGULARISER_FIELDS,
)


def check_parts(payload: dict, path) -> None:
    """The types of a (format 2) payload's parts, before any of them is used."""
    for name in ("model_config", "train_config", "tokenizer", "weights"):
        if not isinstance(payload.get(name), dict):
            raise CharlmError(
                f"{path} is a damaged charlm checkpoint: its {name} is {kind_of(payload.get(name))}, not a mapping"
            )
    for name in ("training", "scores", "provenance", "dynamic"):
        if payload.get(name) is not None and not isinstance(payload[name], dict):
            raise CharlmError(
                f"{path} is a damaged charlm checkpoint: its {name} is {kind_of(payload[name])}, not a mapping"
            )
    for name, tensor in payload["weights"].items():
        if not isinstance(name, str) or not torch.is_tensor(tensor):
            raise CharlmError(
                f"{path} is a damaged charlm checkpoint: its weight {shown(name, 60)} is {kind_of(tensor)}, "
                "not a tensor"
            )
        problem = tensor_problem(tensor)
        if problem:
            raise CharlmError(f"{path} is a damaged charlm checkpoint: its weight {name[:60]} is {problem}")
    check_vocabulary(payload["tokenizer"], path)


def check_vocabulary(tokenizer: dict, path) -> None:
    """The vocabulary as ``charlm.corpora.vocabulary`` says every file's must be."""
    problem = vocabulary_problem(tokenizer)
    if problem is not None:
        raise CharlmError(f"{path}: its {problem}")


def check_consistency(checkpoint) -> None:
    """The settings within their bounds, and vocabulary, ``vocab_size`` and the weights' rows in agreement."""
    path, model, train = checkpoint.path, checkpoint.model_config, checkpoint.train_config
    try:
        validate(train)
        validate(dataclasses.replace(train, **{name: getattr(model, name) for name in MODEL_FIELDS}))
    except ConfigError as error:
        raise CharlmError(f"{path} holds a setting out of its bounds: {error.field} {error.reason}") from None
    if not isinstance(model.cell_options, dict) or not all(isinstance(key, str) for key in model.cell_options):
        raise CharlmError(f"{path}: its cell options are not a mapping of option names to values")
    symbols = len(checkpoint.tokenizer["vocab"])
    if model.vocab_size != symbols:
        raise CharlmError(
            f"{path}: its settings say vocab_size {model.vocab_size:,}, but its vocabulary has {symbols:,} entries"
        )
    for name, what in (
        ("head.weight", "output layer"),
        ("head.bias", "output layer"),
        ("embedding.weight", "embedding"),
    ):
        tensor = checkpoint.weights.get(name)
        if tensor is not None and (tensor.dim() == 0 or tensor.shape[0] != symbols):
            rows = "no rows" if tensor.dim() == 0 else f"{tensor.shape[0]:,} rows"
            raise CharlmError(f"{path}: its vocabulary has {symbols:,} entries, but its {what} ({name}) has {rows}")


def check_against_model(checkpoint, cell_class) -> torch.nn.Module:
    """The model ``checkpoint`` describes, built on the meta device, with every weight, the optimizer's
    state and the carried state checked against its shapes; returned for sizing (nothing is allocated)."""
    path, config, weights = checkpoint.path, checkpoint.model_config, checkpoint.weights
    try:
        with torch.device("meta"):
            model = LanguageModel(config, cell_class)
    except CharlmError as error:
        raise CharlmError(f"{path}: {error}") from None
    compare_weights(weights, model.state_dict(), path)
    return model


def compare_weights(weights: dict, expected: dict, path) -> None:
    """``weights`` name for name and shape for shape those of ``expected`` (a model's state_dict)."""
    missing = [name for name in expected if name not in weights]
    if missing:
        raise CharlmError(f"{path}: its weights lack {missing[0]}, which the model it describes has")
    extra = [name for name in weights if name not in expected]
    if extra:
        raise CharlmError(f"{path}: its weights hold {extra[0][:60]}, which the model it describes has no place for")
    for name, tensor in expected.items():
        if weights[name].shape != tensor.shape:
            raise CharlmError(
                f"{path}: its weight {name} has shape {_shape(weights[name])}, the model it describes "
                f"needs {_shape(tensor)}"
            )
        if tensor.is_floating_point() and not weights[name].is_floating_point():
            raise CharlmError(f"{path}: its weight {name} holds {weights[name].dtype}, not floating-point numbers")


def tensor_problem(tensor) -> str | None:
    """Why a tensor read from a file is not an ordinary dense tensor holding its numbers ("a sparse
    tensor, not a dense one"), or None."""
    if tensor.layout != torch.strided:
        return f"a {str(tensor.layout).removeprefix('torch.').replace('_', ' ')} tensor, not a dense one"
    if tensor.is_nested:
        return "a nested tensor, not a dense one"
    if tensor.device.type == "meta":
        return "a tensor without data (on the meta device)"
    return None


def _shape(tensor) -> str:
    return "[" + ", ".join(map(str, tensor.shape)) + "]"
