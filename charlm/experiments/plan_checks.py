"""The checks of a plan file (``charlm.experiments.plan``), all made before anything trains.

Two passes. ``check_document`` checks the shape of the whole TOML document, every profile included
(the type of each table, list and value the format fixes). ``check_points`` then builds the full
training (or task) config of every point of the expanded plan and checks it as `charlm train`
would: the setting's type and bounds, the cell and each of its options, the parameter budget, the
corpus name, and that no two points share a run directory. Every failure is one line naming the
plan file and the key path of the value at fault (``plan x.toml: axes.layers[2] must be an integer,
not 2.5 (run layers-2.5)``), so a bad value in the last point is found before the first trains.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import re

from charlm.errors import CharlmError, ConfigError
from charlm.files import is_plain_name

PLAN_KEYS = {"name", "description", "base", "axes", "eval", "profiles", "paper", "paper_parameters", "task", "budget"}
PROFILE_KEYS = {"base", "axes", "eval", "budget"}
EVAL_KEYS = {"split", "dynamic", "adapt_on", "batch_size"}
TEXT_KEYS = ("description", "paper", "task")
SWEEP_OWNED = {"run_dir", "init_from", "data_dir"}  # paths: the sweep (and --data-dir) choose them, never a plan
TASK_OWNED = {"task", "device"}  # a task plan names its task once; the device is the machine's
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


def shown(value) -> str:
    text = json.dumps(value, default=str) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _unknown(source: str, path: str, key: str, known) -> CharlmError:
    close = difflib.get_close_matches(str(key), sorted(known), n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return CharlmError(
        f"plan {source}: unknown key {key_path(path, key)!r} "
        f"({hint}{'a plan' if not path else path} has {', '.join(sorted(known))})"
    )


# --- the shape of the document ---------------------------------------------------------------------
def check_document(raw: dict, source: str) -> None:
    """Every key known and every table, list and value of the type the format gives it."""
    _check_numbers(raw, source, "")
    for key in raw:
        if key not in PLAN_KEYS:
            raise _unknown(source, "", key, PLAN_KEYS)
    for key in TEXT_KEYS:
        if key in raw and not isinstance(raw[key], str):
            raise CharlmError(f"plan {source}: {key} must be a string, not {shown(raw[key])}")
    _check_tables(raw, source, "")
    counts = raw.get("paper_parameters", {})
    if not isinstance(counts, dict):
        raise CharlmError(
            f"plan {source}: paper_parameters must be a table of cell names and counts, not {shown(counts)}"
        )
    for cell, count in counts.items():
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise CharlmError(
                f"plan {source}: {key_path('paper_parameters', cell)} must be a positive whole number, "
                f"not {shown(count)}"
            )
    profiles = raw.get("profiles", {})
    if not isinstance(profiles, dict):
        raise CharlmError(
            f"plan {source}: profiles must be a table of profiles ([profiles.NAME]), not {shown(profiles)}"
        )
    for name, profile in profiles.items():
        if not is_plain_name(name):  # part of the sweep directory's name
            raise CharlmError(
                f"plan {source}: profile name {shown(name)} is not a plain name (letters, digits, '.', "
                "'_' and '-', starting with a letter or a digit)"
            )
        path = key_path("profiles", name)
        if not isinstance(profile, dict):
            raise CharlmError(f"plan {source}: {path} must be a table (base, axes, eval, budget), not {shown(profile)}")
        for key in profile:
            if key not in PROFILE_KEYS:
                raise _unknown(source, path, key, PROFILE_KEYS)
        _check_tables(profile, source, path)


MAX_BITS = 4096  # an integer of a plan: no setting takes more than 64 bits; 0x and 20,000 digits cannot even be printed


def _check_numbers(document: dict, source: str, path: str) -> None:
    """No integer anywhere in the document beyond ``MAX_BITS`` (TOML's 0x, 0o and 0b spell any size);
    walked without recursion, however deep the document's lists go."""
    waiting = [(path, document)]
    while waiting:
        where, value = waiting.pop()
        if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > MAX_BITS:
            raise CharlmError(
                f"plan {source}: {where} is a number of {value.bit_length():,} bits, more than any setting takes"
            )
        items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
        waiting.extend((key_path(where, key), item) for key, item in items)


def _check_tables(table: dict, source: str, prefix: str) -> None:
    """``base``, ``axes``, ``eval`` and ``budget`` of the plan (prefix "") or of a profile."""

    def where(*parts):
        return key_path(prefix, *parts)

    if "budget" in table and not (isinstance(table["budget"], str) and table["budget"].strip()):
        raise CharlmError(
            f'plan {source}: {where("budget")} must be a label such as "0.9M per layer", not {shown(table["budget"])}'
        )
    base = table.get("base", {})
    if not isinstance(base, dict):
        raise CharlmError(f"plan {source}: {where('base')} must be a table of settings, not {shown(base)}")
    if not isinstance(base.get("cell_options", {}), dict):
        raise CharlmError(
            f"plan {source}: {where('base', 'cell_options')} must be a table of cell options, "
            f"not {shown(base['cell_options'])}"
        )
    axes = table.get("axes", {})
    if not isinstance(axes, dict):
        raise CharlmError(
            f"plan {source}: {where('axes')} must be a table of axes (NAME = [values]), not {shown(axes)}"
        )
    for name, values in axes.items():
        _check_axis(values, source, where("axes", name), name)
    steps = table.get("eval", [])
    if not isinstance(steps, list):
        raise CharlmError(f"plan {source}: {where('eval')} must be a list of tables ([[eval]]), not {shown(steps)}")
    for index, step in enumerate(steps):
        _check_eval_step(step, source, where("eval", index))


def _check_axis(values, source: str, path: str, name: str) -> None:
    if not isinstance(values, list) or not values:
        raise CharlmError(f"plan {source}: {path} must be a non-empty list of values, not {shown(values)}")
    paired = any(isinstance(value, dict) for value in values)
    for index, value in enumerate(values):
        if name == "cell_options" and not isinstance(value, dict):
            raise CharlmError(f"plan {source}: {path}[{index}] must be a table of cell options, not {shown(value)}")
        if paired and not isinstance(value, dict):
            raise CharlmError(
                f"plan {source}: {path}[{index}] must be a table of settings like the axis's other "
                f"values, not {shown(value)}"
            )
        if paired and not value:
            raise CharlmError(f"plan {source}: {path}[{index}] must name at least one setting")
        if paired and name != "cell_options" and not isinstance(value.get("cell_options", {}), dict):
            raise CharlmError(
                f"plan {source}: {path}[{index}].cell_options must be a table of cell options, "
                f"not {shown(value['cell_options'])}"
            )


def _check_eval_step(step, source: str, path: str) -> None:
    from charlm.config import DynamicOptions, EvalConfig
    from charlm.settings import validate

    if not isinstance(step, dict):
        raise CharlmError(
            f"plan {source}: {path} must be a table (split, dynamic, adapt_on, batch_size), not {shown(step)}"
        )
    for key in step:
        if key not in EVAL_KEYS:
            raise _unknown(source, path, key, EVAL_KEYS)
    split, dynamic = step.get("split", "test"), step.get("dynamic")
    if split not in ("valid", "test"):
        raise CharlmError(f"plan {source}: {path}.split must be valid or test, not {shown(split)}")
    if dynamic not in (None, "sgd", "rms"):
        raise CharlmError(f"plan {source}: {path}.dynamic must be sgd or rms, not {shown(dynamic)}")
    if "adapt_on" in step and step["adapt_on"] != "valid":
        raise CharlmError(f"plan {source}: {path}.adapt_on must be valid, not {shown(step['adapt_on'])}")
    if "adapt_on" in step and dynamic is None:
        raise CharlmError(
            f'plan {source}: {path}.adapt_on needs dynamic = "sgd" or "rms" (a static score adapts nothing)'
        )
    if "batch_size" in step:
        size = step["batch_size"]
        if isinstance(size, bool) or not isinstance(size, int):
            raise CharlmError(f"plan {source}: {path}.batch_size must be a whole number, not {shown(size)}")
        try:
            validate(
                EvalConfig(split=split, batch_size=size)
                if dynamic is None
                else DynamicOptions(method=dynamic, batch_size=size)
            )
        except ConfigError as error:
            raise CharlmError(f"plan {source}: {path}.batch_size {error.reason}") from None


# --- every point, as the training it will be ----------------------------------------------------
def check_setting_names(plan, fields: set, owned: set, command: str, why: str) -> None:
    """Every setting the plan names (in base, as an axis, in an axis of paired settings) is a setting
    of ``command`` that a plan may give."""
    allowed = sorted(fields - owned)
    for table, key in _named_settings(plan):
        name = "cell_options" if key.startswith(CELL_OPTION) else key
        if name in owned:
            raise CharlmError(f"plan {plan.source}: {key_path(*table, key)}: a plan cannot set {key!r} ({why})")
        if name not in fields:
            close = difflib.get_close_matches(key, allowed, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise CharlmError(
                f"plan {plan.source}: {key_path(*table, key)}: unknown setting {key!r} ({hint}any "
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
        values = plan.axes[axis]
        index = next(i for i, v in enumerate(values) if v is value)  # the very object: nan != nan
        table = plan.origins.get(("axes", axis), "axes")
        if option is not None:
            if axis == CELL_OPTION + option:
                return key_path(table, axis, index)
            if axis == "cell_options" and option in value:
                return key_path(table, axis, index, option)
            if isinstance(value, dict) and option in value.get("cell_options", {}):
                return key_path(table, axis, index, "cell_options", option)
        elif axis == field:
            return key_path(table, axis, index)
        elif isinstance(value, dict) and field in value and axis != "cell_options":
            return key_path(table, axis, index, field)
    if option is not None:
        if CELL_OPTION + option in plan.base:
            return key_path(plan.origins.get(("base", CELL_OPTION + option), "base"), CELL_OPTION + option)
        if option in plan.base.get("cell_options", {}):
            return key_path(plan.origins.get(("base", "cell_options"), "base"), "cell_options", option)
        return None
    if field in plan.base:
        return key_path(plan.origins.get(("base", field), "base"), field)
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
    from charlm.cells import CELLS, parse_cell_options
    from charlm.config import TrainConfig
    from charlm.corpora import RECIPES
    from charlm.settings import from_dict

    check_setting_names(
        plan,
        {field.name for field in dataclasses.fields(TrainConfig)},
        SWEEP_OWNED,
        "charlm train",
        "a sweep chooses its run directories and init_from; the data, with --data-dir",
    )
    budgets = {}
    for point in _distinct_points(plan):
        try:
            config = from_dict(TrainConfig, point.settings)
            config.validate()
        except ConfigError as error:
            raise point_error(plan, point, error, error.field) from None
        except CharlmError as error:
            raise point_error(plan, point, error, None) from None
        if config.corpus not in RECIPES and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", config.corpus):
            raise point_error(
                plan,
                point,
                CharlmError(f"{config.corpus!r} is not a corpus name (a built-in corpus or a plain name)"),
                "corpus",
            )
        if ":" in config.cell:  # a user cell is imported only when the sweep runs, and only if trusted
            continue
        try:
            cell_class = CELLS.get(config.cell)
        except CharlmError as error:
            raise point_error(plan, point, error, "cell") from None
        for option, value in config.cell_options.items():
            try:
                parse_cell_options(cell_class, {option: value})
            except CharlmError as error:
                raise point_error(plan, point, error, "cell_options", option) from None
        try:
            parse_cell_options(cell_class, config.cell_options)  # the options together
            if config.params is not None:
                key = (config.params, config.layers, config.embed_size)
                if key not in budgets:
                    budgets[key] = _check_budget(config)
        except CharlmError as error:
            raise point_error(plan, point, error, "params" if config.params is not None else "cell_options") from None


def _check_budget(config) -> bool:
    """A parameter budget's syntax (``1M``, ``lstm[peephole=full]@100``); its hidden size needs the
    corpus's vocabulary, and is chosen when the point trains."""
    from charlm.model import ModelConfig, budget_of

    budget_of(
        config.params,
        ModelConfig(
            cell=config.cell, vocab_size=256, hidden_size=1, layers=config.layers, embed_size=config.embed_size
        ),
    )
    return True


def check_task_points(plan, task_config) -> None:
    """Every setting a ``charlm task`` setting, and every point a network that can be built."""
    import torch

    from charlm.tasks.models import build_task_model
    from charlm.tasks.training import TaskConfig

    if plan.evals:
        raise CharlmError(f"plan {plan.source}: a task plan has no [[eval]] steps (every run is scored as it trains)")
    check_setting_names(
        plan,
        {field.name for field in dataclasses.fields(TaskConfig)},
        TASK_OWNED,
        "charlm task",
        "the plan's `task` names the task; the device is the machine's",
    )
    for point in _distinct_points(plan):
        try:
            config = task_config(plan, point).resolved()
            with torch.device("meta"):
                build_task_model(
                    config.make_task(), config.cell, config.hidden_size, config.layers, config.tied, config.cell_options
                )
        except ConfigError as error:
            raise point_error(plan, point, error, error.field) from None
        except CharlmError as error:
            raise point_error(plan, point, error, None) from None


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
