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
- ``check_optimizer_state``, ``check_schedule_state``, ``check_carried_state``,
  ``check_random_state``: the parts a resume puts back, which ``charlm.training.setup.check_training_state``
  holds against the run's own optimizer and schedule.

Each failure is one ``CharlmError`` that names the file.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from charlm.corpora.vocabulary import value_kind as _kind, vocabulary_problem
from charlm.errors import CharlmError, ConfigError, shown
from charlm.settings import validate

TRAINING_PARTS = ("optimizer", "scheduler", "rng", "progress", "hidden")
MODEL_FIELDS = {"hidden": "hidden_size", "layers": "layers", "embed_size": "embed_size", "dropout": "dropout"}


def check_parts(payload: dict, path) -> None:
    """The types of a (format 2) payload's parts, before any of them is used."""
    for name in ("model_config", "train_config", "tokenizer", "weights"):
        if not isinstance(payload.get(name), dict):
            raise CharlmError(
                f"{path} is a damaged charlm checkpoint: its {name} is {_kind(payload.get(name))}, not a mapping"
            )
    for name in ("training", "scores", "provenance", "dynamic"):
        if payload.get(name) is not None and not isinstance(payload[name], dict):
            raise CharlmError(
                f"{path} is a damaged charlm checkpoint: its {name} is {_kind(payload[name])}, not a mapping"
            )
    for name, tensor in payload["weights"].items():
        if not isinstance(name, str) or not torch.is_tensor(tensor):
            raise CharlmError(
                f"{path} is a damaged charlm checkpoint: its weight {str(name)[:60]!r} is {_kind(tensor)}, not a tensor"
            )
        problem = tensor_problem(tensor)
        if problem:
            raise CharlmError(f"{path} is a damaged charlm checkpoint: its weight {name[:60]} is {problem}")
    for name, value in (payload.get("scores") or {}).items():
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise CharlmError(
                f"{path} is a damaged charlm checkpoint: its score {str(name)[:40]!r} is {_kind(value)}, not a number"
            )
    training = payload.get("training")
    if training is not None:
        missing = [part for part in TRAINING_PARTS if part not in training]
        if missing or set(training) - set(TRAINING_PARTS):
            raise CharlmError(
                f"{path} is a damaged charlm checkpoint: its training state "
                + (
                    f"lacks {missing[0]}"
                    if missing
                    else f"holds an unknown part {sorted(set(training) - set(TRAINING_PARTS))[0]!r}"
                )
            )
        for part, kind in (
            ("optimizer", dict),
            ("scheduler", dict),
            ("rng", dict),
            ("progress", dict),
            ("hidden", list),
        ):
            if (training[part] is not None or part in ("rng", "progress")) and not isinstance(training[part], kind):
                raise CharlmError(f"{path} is a damaged charlm checkpoint: its {part} state is {_kind(training[part])}")
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
        validate(dataclasses.replace(train, **{name: getattr(model, field) for name, field in MODEL_FIELDS.items()}))
    except ConfigError as error:
        field = MODEL_FIELDS.get(error.field, error.field)
        raise CharlmError(f"{path} holds a setting out of its bounds: {field} {error.reason}") from None
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
    from charlm.model import LanguageModel

    path, config, weights = checkpoint.path, checkpoint.model_config, checkpoint.weights
    layers = {
        int(name.split(".")[1]) for name in weights if name.startswith("layers.") and name.split(".")[1].isdigit()
    }
    if layers != set(range(config.layers)):  # before a meta model of a million layers is built for nothing
        raise CharlmError(
            f"{path}: its settings say layers {config.layers:,}, but its weights are of {len(layers):,} "
            f"layer{'s' if len(layers) != 1 else ''}"
        )
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
    if tensor.is_nested or tensor.is_quantized:
        return f"a {'nested' if tensor.is_nested else 'quantized'} tensor, not a dense one"
    if tensor.device.type == "meta":
        return "a tensor without data (on the meta device)"
    return None


def check_optimizer_state(
    state: dict, parameters: list, path, groups_made=None, entry_made=None, which="optimizer"
) -> None:
    """An optimizer ``state_dict`` for ``parameters``: each parameter once, each moment of its shape.
    With the run's own optimizer's ``groups_made`` (``state_dict()["param_groups"]``) and the state one
    step of it makes per parameter (``entry_made``), also: its groups of those sizes, each setting of
    the kind the optimizer's is (a finite number, true or false), and each parameter's state with the
    entries the optimizer needs, finite, dense tensors of the parameter's shape (``step`` a count)."""
    groups, moments = state.get("param_groups"), state.get("state")
    if (
        not isinstance(groups, list)
        or not all(isinstance(group, dict) and isinstance(group.get("params"), list) for group in groups)
        or not isinstance(moments, dict)
    ):
        raise CharlmError(f"{path}: its optimizer state is damaged (no parameter groups)")
    indices = [index for group in groups for index in group["params"]]
    if sorted(indices, key=str) != sorted(range(len(parameters)), key=str):
        raise CharlmError(
            f"{path}: its optimizer state is for {len(indices):,} parameters, the model has {len(parameters):,}"
        )
    if any(type(index) is not int for index in indices):
        raise CharlmError(
            f"{path}: its optimizer state names a parameter {_shown(next(i for i in indices if type(i) is not int))}, "
            "not by its number"
        )
    if groups_made is not None:
        sizes, made = [len(group["params"]) for group in groups], [len(group["params"]) for group in groups_made]
        if sizes != made:
            raise CharlmError(
                f"{path}: its optimizer state holds {len(groups)} parameter group(s) of {sizes} parameters, "
                f"where the run's {which} has {len(made)} of {made}"
            )
        for group, fresh in zip(groups, groups_made):
            for key, value in fresh.items():
                problem = None if key in ("params", "initial_lr") else _setting_problem(group.get(key, _MISSING), value)
                if (
                    problem
                ):  # initial_lr: the schedule's, which format 1 has not, and which is not read once it has begun
                    raise CharlmError(
                        f"{path}: its optimizer setting {key!r} is {_shown(group.get(key, _MISSING))}, where "
                        f"the run's {which} needs {problem}"
                    )
    for index, entry in moments.items():
        if type(index) is not int or not 0 <= index < len(parameters) or not isinstance(entry, dict):
            raise CharlmError(
                f"{path}: its optimizer state holds an entry for parameter {str(index)[:20]}, which the model lacks"
            )
        for name, value in entry.items():
            if torch.is_tensor(value) and value.dim() > 0 and value.shape != parameters[index].shape:
                raise CharlmError(
                    f"{path}: its optimizer state {name} of parameter {index} has shape {_shape(value)}, "
                    f"the parameter {_shape(parameters[index])}"
                )
        if entry_made is None:
            continue
        missing = [key for key in entry_made if entry and key not in entry]
        if missing:
            raise CharlmError(
                f"{path}: its optimizer state of parameter {index} lacks {missing[0]}, which the run's {which} keeps"
            )
        for key, value in entry.items():
            problem = _moment_problem(key, value, parameters[index], entry_made.get(key, _MISSING))
            if problem:
                raise CharlmError(f"{path}: its optimizer state {str(key)[:40]} of parameter {index} is {problem}")


_MISSING = object()


def _setting_problem(saved, fresh) -> str | None:
    """What an optimizer's or a schedule's setting must be, as the same setting ``fresh`` of the run's
    own shows, when ``saved`` (read from a file) is not that; None when it is. A flag (true or false)
    or a choice (text) must be the run's own; a number must be one (not NaN; and finite, zero or more
    in an optimizer's settings); a list must be as long as the run's, of numbers where the run's are."""
    if isinstance(fresh, (bool, str)):  # a flag may be missing: torch gives it its default
        if (saved is _MISSING and isinstance(fresh, bool)) or (type(saved) is type(fresh) and saved == fresh):
            return None
        return repr(fresh)
    if fresh is None:
        return None if saved is _MISSING or saved is None or isinstance(saved, bool) else "none, true or false"
    if _is_number(fresh):
        return None if _is_finite(saved) and saved >= 0 else "a finite number, zero or more"
    if isinstance(fresh, (tuple, list)):
        if not isinstance(saved, (tuple, list)) or len(saved) != len(fresh):
            return f"a list of {len(fresh)}"
        if not all(_is_number(item) for item in fresh):  # a LambdaLR's lr_lambdas: [None] for a lambda
            return None if list(saved) == list(fresh) else repr(fresh)
        if not all(
            _is_finite(item) and 0 <= item and (isinstance(fresh, list) or item < 1) for item in saved
        ):  # betas (a tuple) below 1
            return f"{len(fresh)} finite number{'s' if len(fresh) != 1 else ''}, zero or more" + (
                "" if isinstance(fresh, list) else " and below 1"
            )
        return None
    return None


def _moment_problem(key, value, parameter, made) -> str | None:
    """Why one entry of a parameter's optimizer state cannot be put back, or None: ``step`` a count
    (a number or a one-number tensor, finite, zero or more); every other entry a finite, dense,
    floating-point tensor of the parameter's shape (a squared average zero or more), or None where
    one step makes it None."""
    if key == "step":
        number = (
            value.item()
            if torch.is_tensor(value)
            and value.dim() == 0
            and tensor_problem(value) is None
            and not value.is_complex()
            and value.dtype != torch.bool
            else value
        )
        return None if _is_finite(number) and number >= 0 else f"{_shown(value)}, not a count"
    if value is None and (made is None or made is _MISSING):
        return None
    if not torch.is_tensor(value):
        return f"{_kind(value)}, not a tensor"
    if tensor_problem(value):
        return tensor_problem(value)  # a sparse or meta tensor: nothing below applies
    if not value.is_floating_point():
        return f"of {value.dtype}, not floating-point numbers"
    if value.shape != parameter.shape:
        return f"of shape {_shape(value)}, the parameter {_shape(parameter)}"
    if not torch.isfinite(value).all():
        return "not all finite numbers (it holds NaN or infinity)"
    if ("sq" in str(key) or "square" in str(key)) and (value < 0).any():
        return "negative in places, where it is an average of squares"
    return None


def check_schedule_state(state: dict, scheduler, path) -> None:
    """A learning-rate schedule's ``state_dict``, loaded into ``scheduler`` (the run's own torch
    scheduler) by setting each key as its attribute: no key that names one of its methods or its
    optimizer; each key it has of the kind of its value (a number not NaN, true or false, a list of
    its length, the rates in it finite and zero or more, its own choice of text)."""
    made = scheduler.state_dict()
    for key, value in state.items():
        if key == "optimizer" or (isinstance(key, str) and key not in made and hasattr(type(scheduler), key)):
            raise CharlmError(
                f"{path}: its learning-rate schedule holds {str(key)[:40]!r}, which would replace the schedule's own"
            )
        if key not in made:  # a key an older torch kept ("verbose"): set, never read
            continue
        fresh = made[key]
        if _is_number(fresh):
            problem = (
                None if _is_finite(value) or (isinstance(value, float) and math.isinf(value)) else "a number"
            )  # best: inf
        elif isinstance(fresh, bool):
            problem = None if isinstance(value, bool) else "true or false"
        else:
            problem = _setting_problem(value, fresh)
        if problem:
            raise CharlmError(
                f"{path}: its learning-rate schedule's {key} is {_shown(value)}, where the run's schedule "
                f"needs {problem}"
            )


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_finite(value) -> bool:
    """A finite number that torch takes: a float, or an integer within 64 bits."""
    if isinstance(value, float):
        return math.isfinite(value)
    return _is_number(value) and -(2**63) <= value < 2**63  # 10**400: no float holds it


def _shown(value) -> str:
    if value is _MISSING:
        return "missing"
    if torch.is_tensor(value):
        return f"a tensor of shape {_shape(value)}" if value.dim() else f"{value.item()!r} (a tensor of {value.dtype})"
    return shown(value, 40)


def check_carried_state(hidden: list, expected: list, path, dtype=None) -> None:
    """The carried state: per layer, tensors of the shapes of the model's initial state; dense, of the
    model's ``dtype`` and finite (NaN carried into the next window would end the run as diverged)."""
    shapes = [[tuple(tensor.shape) for tensor in layer] for layer in expected]
    found = [
        [tuple(tensor.shape) if torch.is_tensor(tensor) else None for tensor in layer]
        if isinstance(layer, (list, tuple))
        else None
        for layer in hidden
    ]
    if found != shapes:
        raise CharlmError(
            f"{path}: its carried state does not fit the model it describes ({len(hidden)} layers of "
            f"{found[:1]}, where {len(shapes)} of {shapes[:1]} are needed)"
        )
    for layer in hidden:
        for tensor in layer:
            if tensor_problem(tensor) or (dtype is not None and tensor.dtype != dtype):
                raise CharlmError(
                    f"{path}: its carried state is {tensor_problem(tensor) or f'of {tensor.dtype}'}, "
                    f"where the model computes in {dtype}"
                )
            if not torch.isfinite(tensor).all():
                raise CharlmError(f"{path}: its carried state is not all finite numbers (it holds NaN or infinity)")


def check_random_state(rng, path) -> None:
    """The generators' states (the CPU's, each process's in ``ranks``, and a GPU's): states that torch's
    generator takes (a CPU state is tried on a generator of its own, never on the one in use)."""
    ranks = rng.get("ranks") if isinstance(rng, dict) else None
    if ranks is not None and not (isinstance(ranks, list) and all(isinstance(rank, dict) for rank in ranks)):
        raise CharlmError(f"{path}: its random-number state is damaged (its per-process states are {_kind(ranks)})")
    cpu = [rng.get("torch") if isinstance(rng, dict) else None] + [rank.get("torch") for rank in ranks or ()]
    cuda = rng.get("cuda") if isinstance(rng, dict) else None  # before 0.3: one state per GPU
    gpu = [rank["device"] for rank in ranks or () if rank.get("device") is not None]
    gpu += [] if cuda is None else list(cuda) if isinstance(cuda, (list, tuple)) else [cuda]
    if not all(_is_byte_state(state) for state in cpu + gpu) or not all(_takes_state(state) for state in cpu):
        raise CharlmError(f"{path}: its random-number state is damaged")


def _is_byte_state(state) -> bool:
    return torch.is_tensor(state) and tensor_problem(state) is None and state.dtype == torch.uint8 and state.dim() == 1


def _takes_state(state) -> bool:
    """Whether a CPU generator takes ``state``; tried on a new generator, never on the one in use."""
    try:
        torch.Generator().set_state(state)
    except (RuntimeError, TypeError, ValueError):
        return False
    return True


def _shape(tensor) -> str:
    return "[" + ", ".join(map(str, tensor.shape)) + "]"
