"""Sweep plans: TOML files that name a grid of training runs.

A plan holds the settings every run shares (``[base]``: any ``charlm train`` setting), the axes
to vary (``[axes]``: lists; the grid is their product, in the plan's order), optional evaluation
steps after training (``[[eval]]``) and profiles (``[profiles.NAME]``) that override base and axes
for a different scale (``small`` for a laptop; without ``--profile`` the plan runs as written)::

    name = "lru-table1"
    description = "The LRU paper's Table 1"

    [base]
    batch_size = 250
    epochs = 20

    [axes]
    cell = ["lru", "gru"]
    corpus = ["wp", "ptb-contiguous"]
    params = ["10M", "24M"]
    "cell_options.peephole" = [true, false]   # one cell option as an axis
    model = [{ cell = "gru", hidden = 387 }, { cell = "lstm", hidden = 335 }]  # settings that go together

    [[eval]]
    split = "test"
    dynamic = "sgd"        # optional: sgd or rms
    adapt_on = "valid"     # optional: dynamic #2

    [profiles.small]
    base = { batch_size = 32, max_minutes = 3 }
    axes = { corpus = ["pydoc"], params = ["200k"] }

Plans shipped with charlm live in ``charlm/experiments/plans/`` and are named without their ``.toml``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import re
from importlib import resources
from pathlib import Path

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

from charlm.config import TrainConfig
from charlm.settings import from_dict
from charlm.errors import CharlmError
from charlm.files import plain_name, read_text

PLAN_KEYS = {"name", "description", "base", "axes", "eval", "profiles", "paper", "paper_parameters", "task", "budget"}
EVAL_KEYS = {"split", "dynamic", "adapt_on", "batch_size"}
SWEEP_OWNED = {"run_dir", "init_from"}  # settings a sweep chooses itself, per point
CELL_OPTION = "cell_options."


@dataclasses.dataclass(frozen=True)
class EvalStep:
    """An evaluation of each trained run: static, or dynamic (``sgd``/``rms``; #2 with adapt_on="valid")."""

    split: str = "test"
    dynamic: str | None = None
    adapt_on: str | None = None
    batch_size: int | None = None

    @property
    def label(self) -> str:
        mode = self.dynamic or "static"
        return f"{mode} {self.split}" + (" #2" if self.adapt_on else "")


@dataclasses.dataclass(frozen=True)
class Point:
    """One run of a sweep: its directory name and its full training settings."""

    name: str
    values: dict  # the axis values that make this point
    settings: dict  # TrainConfig fields (run_dir aside)


@dataclasses.dataclass(frozen=True)
class Plan:
    name: str
    description: str
    profile: str
    base: dict
    axes: dict  # axis name → list of values, in the plan's order
    evals: tuple[EvalStep, ...]
    source: str  # where the plan was read from
    paper_parameters: dict = dataclasses.field(default_factory=dict)  # cell → the count its paper gives
    task: str | None = None  # a plan of `charlm task` runs (base and axes: TaskConfig fields), not `charlm train`
    budget: str | None = None  # the nominal budget of runs sized by --hidden (reports group them under it)

    def points(self) -> list[Point]:
        """Every point of the grid, in a fixed order (the axes' product)."""
        names = list(self.axes)
        points = []
        for combination in itertools.product(*(self.axes[name] for name in names)):
            values = dict(zip(names, combination))
            points.append(Point(point_name(values), values, settings_for(self.base, values)))
        return points

    def fingerprint(self) -> str:
        """What the runs of a sweep directory depend on: base, axes and evaluation steps."""
        identity = {"base": self.base, "axes": self.axes, "eval": [dataclasses.asdict(e) for e in self.evals]}
        if self.task is not None:
            identity["task"] = self.task
        return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]


def shipped_plans() -> dict[str, str]:
    """Name → one-line description of every plan shipped with charlm."""
    found = {}
    for entry in sorted(resources.files("charlm.experiments.plans").iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".toml"):
            raw = tomllib.loads(entry.read_text(encoding="utf-8"))
            found[entry.name.removesuffix(".toml")] = raw.get("description", "")
    return found


def load_plan(reference: str | Path, profile: str | None = None) -> Plan:
    """A plan from a TOML file, or a shipped plan by name, with ``profile``'s overrides applied."""
    text, source = _plan_text(str(reference))
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise CharlmError(f"plan {source} is not valid TOML: {error}") from None
    for key, kind in (("base", dict), ("axes", dict), ("profiles", dict), ("eval", list)):
        if key in raw and not isinstance(raw[key], kind):
            raise CharlmError(f"plan {source}: {key} must be a {'table' if kind is dict else 'list of tables'}")
    unknown = sorted(set(raw) - PLAN_KEYS)
    if unknown:
        raise CharlmError(f"plan {source}: unknown key {unknown[0]!r} (a plan has {', '.join(sorted(PLAN_KEYS))})")
    base, axes = dict(raw.get("base", {})), dict(raw.get("axes", {}))
    if profile is not None:
        profiles = raw.get("profiles", {})
        if profile not in profiles:
            known = ", ".join(sorted(profiles)) or "none"
            raise CharlmError(f"plan {source} has no profile {profile!r} (its profiles: {known})")
        plain_name(profile, f"plan {source}: profile")  # part of the sweep directory's name
        overrides = profiles[profile]
        if not isinstance(overrides, dict):
            raise CharlmError(f"plan {source}: profile {profile!r} must be a table")
        extra = sorted(set(overrides) - {"base", "axes", "eval", "budget"})
        if extra:
            raise CharlmError(f"plan {source}: profile {profile!r} has unknown key {extra[0]!r} (base, axes, eval or budget)")
        if "budget" in overrides:
            raw["budget"] = overrides["budget"]
        base.update(overrides.get("base", {}))
        axes.update(overrides.get("axes", {}))
        if "eval" in overrides:
            raw["eval"] = overrides["eval"]
    name = plain_name(raw.get("name", Path(source).stem), f"plan {source}: its name")  # sweeps/NAME-PROFILE
    if not isinstance(raw.get("description", ""), str):
        raise CharlmError(f"plan {source}: description must be a string, not {raw['description']!r}")
    plan = Plan(name=name, description=raw.get("description", ""),
                profile=profile or "paper", base=base, axes=axes, evals=_eval_steps(raw.get("eval", []), source),
                paper_parameters=_paper_parameters(raw.get("paper_parameters", {}), source),
                source=source, task=raw.get("task"), budget=raw.get("budget"))
    if plan.budget is not None and not (isinstance(plan.budget, str) and plan.budget.strip()):
        raise CharlmError(f"plan {source}: budget must be a label such as \"0.9M per layer\", not {plan.budget!r}")
    if plan.task is not None:
        _check_task_plan(plan)
    else:
        _check(plan)
    return plan


def _plan_text(reference: str) -> tuple[str, str]:
    path = Path(reference)
    if path.suffix == ".toml" or path.exists():
        return read_text(path, "plan file"), str(path)
    shipped = shipped_plans()
    if reference not in shipped:
        raise CharlmError(f"no plan {reference!r}: give a .toml file or one of {', '.join(shipped)} (charlm sweep --list)")
    return resources.files("charlm.experiments.plans").joinpath(f"{reference}.toml").read_text(encoding="utf-8"), reference


def _eval_steps(entries, source: str) -> tuple[EvalStep, ...]:
    if not isinstance(entries, list):
        raise CharlmError(f"plan {source}: eval must be a list of tables ([[eval]])")
    steps = []
    for entry in entries:
        if not isinstance(entry, dict):
            raise CharlmError(f"plan {source}: each eval step must be a table, not {entry!r}")
        unknown = sorted(set(entry) - EVAL_KEYS)
        if unknown:
            raise CharlmError(f"plan {source}: eval step has unknown key {unknown[0]!r} ({', '.join(sorted(EVAL_KEYS))})")
        step = EvalStep(**entry)
        if step.split not in ("valid", "test"):
            raise CharlmError(f"plan {source}: eval split must be valid or test, not {step.split!r}")
        if step.dynamic not in (None, "sgd", "rms"):
            raise CharlmError(f"plan {source}: eval dynamic must be sgd or rms, not {step.dynamic!r}")
        if step.adapt_on not in (None, "valid"):
            raise CharlmError(f"plan {source}: eval adapt_on must be valid, not {step.adapt_on!r}")
        steps.append(step)
    return tuple(steps)


def _check(plan: Plan) -> None:
    """Every setting a known training setting, every axis a non-empty list, every point a valid config."""
    from charlm.cells import CELLS
    from charlm.corpora import RECIPES

    fields = {field.name for field in dataclasses.fields(TrainConfig)}
    for key in _setting_keys(plan):
        name = key if not key.startswith(CELL_OPTION) else "cell_options"
        if name not in fields or name in SWEEP_OWNED:
            raise CharlmError(f"plan {plan.source}: unknown setting {key!r} (any `charlm train` setting but "
                              f"{', '.join(sorted(SWEEP_OWNED))}, or cell_options.NAME)")
    _check_axes(plan)
    for point in plan.points():
        try:
            config = from_dict(TrainConfig, point.settings)
            config.validate()
        except CharlmError as error:
            raise CharlmError(f"plan {plan.source}, run {point.name}: {error}") from None
        if ":" not in config.cell:  # a user cell is imported only when the sweep runs, and only if trusted
            CELLS.get(config.cell)
        if config.corpus not in RECIPES and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", config.corpus):
            raise CharlmError(f"plan {plan.source}: {config.corpus!r} is not a corpus name")


TASK_OWNED = {"task", "device"}  # a task plan names its task once; the device is the machine's


def task_config(plan: Plan, point: Point):
    """The ``TaskConfig`` of a point of a task plan."""
    from charlm.tasks.training import TaskConfig

    return from_dict(TaskConfig, {**point.settings, "task": plan.task})


def _check_task_plan(plan: Plan) -> None:
    """Every setting a ``charlm task`` setting, and every point a network that can be built."""
    import torch

    from charlm.tasks.models import build_task_model
    from charlm.tasks.training import TaskConfig

    if plan.evals:
        raise CharlmError(f"plan {plan.source}: a task plan has no [[eval]] steps (every run is scored as it trains)")
    fields = {field.name for field in dataclasses.fields(TaskConfig)} - TASK_OWNED
    for key in _setting_keys(plan):
        if key not in fields and not key.startswith(CELL_OPTION):
            raise CharlmError(f"plan {plan.source}: unknown setting {key!r} (any `charlm task` setting but "
                              f"{', '.join(sorted(TASK_OWNED))})")
    _check_axes(plan)
    for point in plan.points():
        try:
            config = task_config(plan, point).resolved()
            with torch.device("meta"):
                build_task_model(config.make_task(), config.cell, config.hidden_size, config.layers, config.tied,
                                 config.cell_options)
        except CharlmError as error:
            raise CharlmError(f"plan {plan.source}, run {point.name}: {error}") from None


def _setting_keys(plan: Plan) -> list[str]:
    """Every setting a plan names: in base, as an axis, or inside an axis of paired settings."""
    paired = [key for values in plan.axes.values() if isinstance(values, list)
              for value in values if isinstance(value, dict) for key in value]
    return [*plan.base, *[k for k, v in plan.axes.items() if not _is_paired(v)], *paired]


def _check_axes(plan: Plan) -> None:
    for key, values in plan.axes.items():
        if not isinstance(values, list) or not values:
            raise CharlmError(f"plan {plan.source}: axis {key!r} must be a non-empty list of values")


def _paper_parameters(table, source: str) -> dict:
    """``[paper_parameters]``: a cell name (or ``corpus/cell``) → the parameter count the paper gives."""
    if not isinstance(table, dict) or not all(isinstance(count, int) and count > 0 for count in table.values()):
        raise CharlmError(f"plan {source}: paper_parameters must be a table of cell names and positive counts")
    return dict(table)


def _is_paired(values) -> bool:
    return isinstance(values, list) and any(isinstance(value, dict) for value in values)


def settings_for(base: dict, values: dict) -> dict:
    """The training settings of a point: the base, then its axis values (cell options merged)."""
    settings = {key: value for key, value in base.items() if not key.startswith(CELL_OPTION)}
    given = base.get("cell_options", {})
    if not isinstance(given, dict):
        raise CharlmError(f"cell_options must be a table of option names and values, not {given!r}")
    options = dict(given)
    options.update({key[len(CELL_OPTION):]: value for key, value in base.items() if key.startswith(CELL_OPTION)})
    for key, value in values.items():
        if key.startswith(CELL_OPTION):
            options[key[len(CELL_OPTION):]] = value
        elif key == "cell_options":
            if not isinstance(value, dict):
                raise CharlmError(f"cell_options values must be tables, not {value!r}")
            options.update(value)
        elif isinstance(value, dict):  # paired settings: {cell = "gru", hidden = 387}
            settings.update(value)
        else:
            settings[key] = value
    if options:
        settings["cell_options"] = options
    return settings


def point_name(values: dict) -> str:
    """A run directory name from a point's axis values: ``cell-lru_corpus-wp_params-10M``."""
    parts = []
    for key, value in values.items():
        if isinstance(value, dict):
            shown = "-".join(_shown(item) for item in value.values())
        else:
            shown = _shown(value)
        parts.append(f"{key.removeprefix(CELL_OPTION)}-{shown}")
    return re.sub(r"[^A-Za-z0-9._=+-]+", "-", "_".join(parts)) or "run"


def _shown(value) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True)
    return str(value)
