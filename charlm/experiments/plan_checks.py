"""The checks of a plan file (``charlm.experiments.plan``), all made before anything trains.

Two passes. ``check_document`` checks the shape of the whole TOML document, every profile included:
every key known (a typo gets a suggestion), every table, list and value of the kind the format gives
it. ``check_train_points`` (``check_task_points``) then builds and checks the full config of every
point as `charlm train` (`charlm task`) would: each setting, the cell and its options, the parameter
budget, the corpus name (never a path), and that no two points share a run directory. Every failure is
one line naming the plan file and the key path of the value at fault (``plan x.toml: axes.layers[2]
must be an integer, not 2.5 (run layers-2.5)``), so a bad value in the last point is found before the
first trains.
"""

from __future__ import annotations

import dataclasses
import json
import re

import torch

from charlm.errors import CharlmError, ConfigError, closest, shown
from charlm.files import is_plain_name
from charlm.config import TrainConfig
from charlm.config_inference import DynamicOptions, EvalConfig
from charlm.settings import validate, from_dict
from charlm.cells import CELLS, parse_cell_options
from charlm.corpora import RECIPES
from charlm.model import ModelConfig
from charlm.sizing import budget_of
from charlm.tasks.models import build_task_model
from charlm.tasks.config import TaskConfig

PLAN_KEYS = {"name", "description", "base", "axes", "eval", "profiles", "paper", "paper_parameters", "task", "budget"}
PROFILE_KEYS = {"base", "axes", "eval", "budget"}
EVAL_KEYS = {"split", "dynamic", "adapt_on", "batch_size"}
SHAPES = {  # key of the plan, a profile or an eval step → the type (or the values) the format gives it, in words
    "description": (str, "a string"),
    "paper": (str, "a string"),
    "task": (str, "a string"),
    "budget": (str, 'a label such as "0.9M per layer"'),
    "paper_parameters": (dict, "a table of cell names and counts"),
    "profiles": (dict, "a table of profiles ([profiles.NAME])"),
    "base": (dict, "a table of settings"),
    "axes": (dict, "a table of axes (NAME = [values])"),
    "eval": (list, "a list of tables ([[eval]])"),
    "split": (("valid", "test"), "valid or test"),
    "dynamic": (("sgd", "rms"), "sgd or rms"),
    "adapt_on": (("valid",), "valid"),
}
OWNED = {  # the settings a plan of each command cannot set, and why
    "charlm train": (
        {"run_dir", "init_from", "data_dir"},
        "a sweep chooses its run directories and init_from; the data, with --data-dir",
    ),
    "charlm task": ({"task", "device"}, "the plan's `task` names the task; the device is the machine's"),
}
CELL_OPTION = "cell_options."
BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def key_path(start: str, *parts) -> str:
    """``axes."cell_options.peephole"[1]``: a value's place in the TOML document, from a path
    ``start`` ("axes", "profiles.small.base") and the keys and list positions below it."""
    text = start
    for part in parts:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            key = part if BARE_KEY.fullmatch(part) else json.dumps(part)
            text += f".{key}" if text else key
    return text


def _hint(key: str, known) -> str:
    close = closest(key, known)
    return f"did you mean {close!r}? " if close else ""


# --- the shape of the document ---------------------------------------------------------------------
def check_document(raw: dict, source: str) -> None:
    """Every key known and every table, list and value of the type the format gives it."""
    _check_tables(raw, source, "", PLAN_KEYS)
    for cell, count in raw.get("paper_parameters", {}).items():
        if type(count) is not int or count < 1:
            where = key_path("paper_parameters", cell)
            raise CharlmError(f"plan {source}: {where} must be a positive whole number, not {shown(count)}")
    for name, profile in raw.get("profiles", {}).items():  # its name is checked as the plan is expanded with it
        _check_tables(profile, source, key_path("profiles", name), PROFILE_KEYS)


def _check_keys(table, source: str, path: str, known: set) -> None:
    """``table`` a table of known keys only (a typo gets a suggestion), each value of the shape it has."""
    if not isinstance(table, dict):
        raise CharlmError(f"plan {source}: {path} must be a table ({', '.join(sorted(known))}), not {shown(table)}")
    for key, value in table.items():
        if key not in known:
            raise CharlmError(
                f"plan {source}: unknown key {key_path(path, key)!r} "
                f"({_hint(key, known)}{path or 'a plan'} has {', '.join(sorted(known))})"
            )
        shape, what = SHAPES.get(key, (object, ""))
        if not (value in shape if isinstance(shape, tuple) else isinstance(value, shape)):
            raise CharlmError(f"plan {source}: {key_path(path, key)} must be {what}, not {shown(value)}")


def _check_tables(table: dict, source: str, prefix: str, known: set) -> None:
    """The plan (prefix "") or a profile: its keys and their values, then its axes and eval steps."""
    _check_keys(table, source, prefix, known)
    options = table.get("base", {}).get("cell_options", {})
    if not isinstance(options, dict):
        where = key_path(prefix, "base", "cell_options")
        raise CharlmError(f"plan {source}: {where} must be a table of cell options, not {shown(options)}")
    for name, values in table.get("axes", {}).items():
        _check_axis(values, source, key_path(prefix, "axes", name), name)
    for index, step in enumerate(table.get("eval", [])):
        _check_eval_step(step, source, key_path(prefix, "eval", index))


def _check_axis(values, source: str, path: str, name: str) -> None:
    if not isinstance(values, list) or not values:
        raise CharlmError(f"plan {source}: {path} must be a non-empty list of values, not {shown(values)}")
    tables = "cell options" if name == "cell_options" else "settings like the axis's other values"
    for index, value in enumerate(values):  # paired settings, or cell options: every value a table
        where = f"plan {source}: {path}[{index}]"
        if (name == "cell_options" or any(isinstance(v, dict) for v in values)) and not isinstance(value, dict):
            raise CharlmError(f"{where} must be a table of {tables}, not {shown(value)}")
        if isinstance(value, dict) and name != "cell_options" and not isinstance(value.get("cell_options", {}), dict):
            raise CharlmError(
                f"{where}.cell_options must be a table of cell options, not {shown(value['cell_options'])}"
            )


def _check_eval_step(step, source: str, path: str) -> None:
    _check_keys(step, source, path, EVAL_KEYS)
    split, dynamic, size = step.get("split", "test"), step.get("dynamic"), step.get("batch_size")
    if "adapt_on" in step and dynamic is None:
        raise CharlmError(
            f'plan {source}: {path}.adapt_on needs dynamic = "sgd" or "rms" (a static score adapts nothing)'
        )
    if size is not None:  # its type and bounds as `charlm evaluate --batch-size` checks them
        options = EvalConfig(split, batch_size=size) if dynamic is None else DynamicOptions(dynamic, batch_size=size)
        try:
            validate(options)
        except ConfigError as error:
            raise CharlmError(f"plan {source}: {path}.batch_size {error.reason}") from None


# --- every point, as the training it will be ----------------------------------------------------
def check_setting_names(plan, config_class: type, command: str) -> None:
    """Every setting the plan names (in base, as an axis, in an axis of paired settings) is a setting
    of ``command`` (fields of ``config_class``) that a plan may give."""
    (owned, why), fields = OWNED[command], {field.name for field in dataclasses.fields(config_class)}
    allowed = sorted(fields - owned)
    for table, key in _named_settings(plan):
        name = "cell_options" if key.startswith(CELL_OPTION) else key
        if name in owned:
            raise CharlmError(f"plan {plan.source}: {key_path(*table, key)}: a plan cannot set {key!r} ({why})")
        if name not in fields:
            raise CharlmError(
                f"plan {plan.source}: {key_path(*table, key)}: unknown setting {key!r} ({_hint(key, allowed)}any "
                f"`{command}` setting but {', '.join(sorted(owned))}, or cell_options.NAME)"
            )


def _named_settings(plan) -> list[tuple[tuple, str]]:
    found = [((plan.origins.get(("base", key), "base"),), key) for key in plan.base]
    for axis, values in plan.axes.items():
        table = plan.origins.get(("axes", axis), "axes")
        if any(isinstance(value, dict) for value in values) and axis != "cell_options":
            found.extend(((table, axis, index), key) for index, value in enumerate(values) for key in value)
        else:
            found.append(((table,), axis))
    return found


def origin(plan, point, field: str, option: str | None = None) -> str | None:
    """The key path a point's setting ``field`` (or its cell option ``option``) came from."""
    for axis, value in point.values.items():
        index = next(i for i, v in enumerate(plan.axes[axis]) if v is value)  # the very object: nan != nan
        here = (plan.origins.get(("axes", axis), "axes"), axis, index)
        paired = isinstance(value, dict) and axis != "cell_options"
        if option is None and (axis == field or (paired and field in value)):
            return key_path(*here) if axis == field else key_path(*here, field)
        if option is not None and axis == CELL_OPTION + option:
            return key_path(*here)
        if option is not None and axis == "cell_options" and option in value:
            return key_path(*here, option)
        if option is not None and paired and option in value.get("cell_options", {}):
            return key_path(*here, "cell_options", option)
    key = field if option is None else CELL_OPTION + option
    if key in plan.base:
        return key_path(plan.origins.get(("base", key), "base"), key)
    if option is not None and option in plan.base.get("cell_options", {}):
        return key_path(plan.origins.get(("base", "cell_options"), "base"), "cell_options", option)
    return None


def point_error(plan, point, error: CharlmError, field: str | None, option: str | None = None) -> CharlmError:
    """``error`` of a point as one line naming the plan file and the key path of the value at fault."""
    path = origin(plan, point, field, option) if field else None
    if path is None:
        return CharlmError(f"plan {plan.source}, run {point.name}: {error}")
    if isinstance(error, ConfigError) and error.field == field:
        return CharlmError(f"plan {plan.source}: {path} {error.reason} (run {point.name})")
    return CharlmError(f"plan {plan.source}: {path}: {error} (run {point.name})")


def check_train_points(plan) -> None:
    """The full TrainConfig of every point built and checked, with its cell, options and budget."""
    check_setting_names(plan, TrainConfig, "charlm train")

    def build(point):
        config = from_dict(TrainConfig, point.settings)
        config.validate()
        return config

    budgets = set()
    for point in _distinct_points(plan):
        config = _checked(plan, point, lambda: build(point))
        if config.corpus not in RECIPES and not is_plain_name(config.corpus):  # a path: the sweep's --data-dir
            problem = CharlmError(f"{config.corpus!r} is not a corpus name (a built-in corpus or a plain name)")
            raise point_error(plan, point, problem, "corpus")
        if ":" in config.cell:  # a user cell is imported only when the sweep runs, and only if trusted
            continue
        cell_class = _checked(plan, point, lambda: CELLS.get(config.cell), "cell")
        for option, value in config.cell_options.items():  # one by one, to name the option at fault
            _checked(plan, point, lambda: parse_cell_options(cell_class, {option: value}), "cell_options", option)
        _checked(plan, point, lambda: parse_cell_options(cell_class, config.cell_options), "cell_options")  # together
        budget = (config.params, config.cell, config.layers, config.embed_size)
        if config.params is not None and budget not in budgets:  # its syntax: the hidden size needs the corpus
            budgets.add(budget)
            model = ModelConfig(config.cell, 256, 1, config.layers, config.embed_size)
            _checked(plan, point, lambda: budget_of(config.params, model), "params")


def check_task_points(plan, task_config) -> None:
    """Every setting a ``charlm task`` setting, and every point a network that can be built."""
    if plan.evals:
        raise CharlmError(f"plan {plan.source}: a task plan has no [[eval]] steps (every run is scored as it trains)")
    check_setting_names(plan, TaskConfig, "charlm task")

    def build(point):
        config = task_config(plan, point).resolved()
        with torch.device("meta"):
            task = config.make_task()
            build_task_model(task, config.cell, config.hidden_size, config.layers, config.tied, config.cell_options)

    for point in _distinct_points(plan):
        _checked(plan, point, lambda: build(point))


def _checked(plan, point, check, field: str | None = None, option: str | None = None):
    """``check()``, whose error becomes one line naming the key path of the value at fault: ``field``
    (and ``option``), else the setting a ``ConfigError`` names."""
    try:
        return check()
    except CharlmError as error:
        field = field or (error.field if isinstance(error, ConfigError) else None)
        raise point_error(plan, point, error, field, option) from None


def _distinct_points(plan) -> list:
    """The points, refusing two that would share a run directory (equal values, or values that differ
    only in characters a directory name cannot hold)."""
    points, seen = plan.points(), {}
    for point in points:
        if point.name in seen:
            raise CharlmError(
                f"plan {plan.source}: two runs would share the directory {point.name} "
                f"({shown(seen[point.name])} and {shown(point.values)}): give each axis distinct values"
            )
        seen[point.name] = point.values
    return points
