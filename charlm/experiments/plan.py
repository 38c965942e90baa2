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
    model = [{ cell = "gru", hidden_size = 387 }, { cell = "lstm", hidden_size = 335 }]  # settings that go together

    [[eval]]
    split = "test"
    dynamic = "sgd"        # optional: sgd or rms
    adapt_on = "valid"     # optional: dynamic #2

    [profiles.small]
    base = { batch_size = 32, max_minutes = 3 }
    axes = { corpus = ["pydoc"], params = ["200k"] }

Plans shipped with charlm live in ``charlm/experiments/plans/`` and are named without their ``.toml``.
A plan names no paths: its name and profile names are plain names (the sweep directory's), each
point's directory is named from its values, and run_dir, init_from and data_dir are the sweep's
(--dir, --data-dir). ``load_plan`` checks everything before anything trains (``plan_checks``).
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import itertools
import json
import math
import re
from importlib import resources
from pathlib import Path

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

from charlm.settings import from_dict
from charlm.errors import CharlmError
from charlm.experiments.plan_checks import CELL_OPTION, check_document, check_task_points, check_train_points, key_path
from charlm.files import plain_name, read_text
from charlm.tasks.config import TaskConfig

MAX_POINT_NAME = 200  # a longer run directory name is cut, with a digest of its values to keep it unique
MAX_POINTS = 10_000  # runs in one plan: far beyond any paper's grid, and checked point by point before anything trains


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
    profile: str | None  # None: a plan of the user's own run as written (``paper``: a shipped paper's, as written)
    base: dict
    axes: dict  # axis name → list of values, in the plan's order
    evals: tuple[EvalStep, ...]
    source: str  # where the plan was read from
    paper_parameters: dict = dataclasses.field(default_factory=dict)  # cell → the count its paper gives
    task: str | None = None  # a plan of `charlm task` runs (base and axes: TaskConfig fields), not `charlm train`
    budget: str | None = None  # the nominal budget of runs sized by --hidden (reports group them under it)
    origins: dict = dataclasses.field(default_factory=dict)  # ("base"|"axes", key) → the table a profile gave it in

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
        if self.task is None:  # `charlm train`'s hidden size as charlm 0.3 named it: its sweeps go on
            identity = json.loads(json.dumps(identity).replace('"hidden_size":', '"hidden":'))
        else:
            identity["task"] = self.task
        return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]

    @property
    def label(self) -> str:
        """``NAME-PROFILE`` (the default sweep directory's name), or ``NAME`` for a plan of one's own run as written."""
        return self.name if self.profile is None else f"{self.name}-{self.profile}"


def shipped_plans() -> dict[str, str]:
    """Name → one-line description of every plan shipped with charlm."""
    found = {}
    for entry in sorted(resources.files("charlm.experiments.plans").iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".toml"):
            raw = tomllib.loads(entry.read_text(encoding="utf-8"))
            found[entry.name.removesuffix(".toml")] = raw.get("description", "")
    return found


def load_plan(reference: str | Path, profile: str | None = None) -> Plan:
    """A plan from a TOML file, or a shipped plan by name, with ``profile``'s overrides applied.

    The one reader of plan files: the whole document is checked (``plan_checks.check_document``,
    every profile included), then every point of the expanded plan as the training it will be
    (``check_train_points``), so a bad value anywhere is one line before anything trains."""
    text, source = _plan_text(str(reference))
    try:
        raw = tomllib.loads(text)
        json.dumps(raw, default=str)  # 0x, 0o and 0b spell integers too long to print: refused here, not in a message
    except ValueError as error:  # TOMLDecodeError, or an integer of more digits than Python converts
        raise CharlmError(f"plan {source} is not valid TOML: {error}") from None
    except RecursionError:  # arrays or tables nested thousands deep
        raise CharlmError(f"plan {source} is not valid TOML: its values are nested too deeply") from None
    check_document(raw, source)
    if profile is not None:
        profiles = raw.get("profiles", {})
        if profile not in profiles:
            known = ", ".join(sorted(profiles)) or "none"
            raise CharlmError(f"plan {source} has no profile {profile!r} (its profiles: {known})")
    for other in raw.get("profiles", {}):  # every profile's points checked, chosen or not: a plan is checked whole
        if other != profile:
            _expanded(copy.deepcopy(raw), source, other)
    return _expanded(raw, source, profile)


def _expanded(raw: dict, source: str, profile: str | None) -> Plan:
    """The plan ``raw`` (a checked document) describes with ``profile``'s overrides, every point checked."""
    base, axes, origins = dict(raw.get("base", {})), dict(raw.get("axes", {})), {}
    if profile is not None:
        plain_name(profile, f"plan {source}: profile")  # part of the sweep directory's name
        overrides = raw.get("profiles", {})[profile]
        if "budget" in overrides:
            raw["budget"] = overrides["budget"]
        for table, merged in (("base", base), ("axes", axes)):
            merged.update(overrides.get(table, {}))
            origins.update({(table, key): key_path("profiles", profile, table) for key in overrides.get(table, {})})
        if "eval" in overrides:
            raw["eval"] = overrides["eval"]
            origins[("eval", "")] = key_path("profiles", profile, "eval")
    name = plain_name(raw.get("name", Path(source).stem), f"plan {source}: its name")  # sweeps/NAME-PROFILE
    as_written = "paper" if "paper" in raw else None  # a plan that names its paper runs that paper's settings
    plan = Plan(
        name=name,
        description=raw.get("description", ""),
        profile=profile or as_written,
        base=base,
        axes=axes,
        evals=tuple(EvalStep(**step) for step in raw.get("eval", [])),
        paper_parameters=dict(raw.get("paper_parameters", {})),
        source=source,
        task=raw.get("task"),
        budget=raw.get("budget"),
        origins=origins,
    )
    runs = math.prod(len(values) for values in plan.axes.values())
    if runs > MAX_POINTS:  # before the grid is made: 29 values on each of 9 axes would never be enumerated
        raise CharlmError(
            f"plan {source}: its axes make {runs:,} runs ({' x '.join(str(len(v)) for v in plan.axes.values())}), "
            f"more than the {MAX_POINTS:,} a sweep runs: split it into several plans"
        )
    if plan.task is not None:
        check_task_points(plan, task_config)
    else:
        check_train_points(plan)
    if not plan.axes:  # an empty file, or one cut short before its axes: it would train one run of every default
        raise CharlmError(
            f"plan {source} has no axes: a plan names its runs with [axes] NAME = [values, ...] "
            "(one value for a single run)"
        )
    return plan


def _plan_text(reference: str) -> tuple[str, str]:
    path = Path(reference)
    if path.suffix == ".toml" or path.exists():
        return read_text(path, "plan file"), str(path)
    shipped = shipped_plans()
    if reference not in shipped:
        raise CharlmError(
            f"no plan {reference!r}: give a .toml file or one of {', '.join(shipped)} (charlm sweep --list)"
        )
    return resources.files("charlm.experiments.plans").joinpath(f"{reference}.toml").read_text(
        encoding="utf-8"
    ), reference


def task_config(plan: Plan, point: Point):
    """The ``TaskConfig`` of a point of a task plan."""
    return from_dict(TaskConfig, {**point.settings, "task": plan.task})


def settings_for(base: dict, values: dict) -> dict:
    """The training settings of a point: the base, then its axis values (cell options merged)."""
    settings = {key: value for key, value in base.items() if not key.startswith(CELL_OPTION)}
    given = base.get("cell_options", {})
    if not isinstance(given, dict):
        raise CharlmError(f"cell_options must be a table of option names and values, not {given!r}")
    options = dict(given)
    options.update({key[len(CELL_OPTION) :]: value for key, value in base.items() if key.startswith(CELL_OPTION)})
    for key, value in values.items():
        if key.startswith(CELL_OPTION):
            options[key[len(CELL_OPTION) :]] = value
        elif key == "cell_options":
            if not isinstance(value, dict):
                raise CharlmError(f"cell_options values must be tables, not {value!r}")
            options.update(value)
        elif isinstance(value, dict):  # paired settings: {cell = "gru", hidden_size = 387}
            settings.update({name: item for name, item in value.items() if name != "cell_options"})
            options.update(value.get("cell_options", {}))
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
            label = "-".join(_name_part(item) for item in value.values())
        else:
            label = _name_part(value)
        parts.append(f"{key.removeprefix(CELL_OPTION)}-{label}")
    name = re.sub(r"[^A-Za-z0-9._=+-]+", "-", "_".join(parts)) or "run"
    if len(name) > MAX_POINT_NAME:  # a file name has at most 255 bytes
        digest = hashlib.sha256(json.dumps(values, sort_keys=True, default=str).encode()).hexdigest()[:16]
        name = f"{name[: MAX_POINT_NAME - 17]}-{digest}"
    return name


def _name_part(value) -> str:
    """An axis value as it reads in a run directory's name: ``true``, ``10M``, ``[1, 2]``."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True)
    return str(value)
