"""Running a plan: one ordinary run directory per point, under one sweep directory.

The sweep directory holds ``sweep.json`` (the plan, its profile and fingerprint) and a run
directory per point, named from its axis values. Running the same command again picks up where
it stopped: finished runs are skipped, interrupted ones resumed (``Trainer.resume``), runs another
process is training are left to it, diverged ones are kept as diverged. ``--shard I/N`` takes
every N-th point from the I-th, so N processes (or a scheduler's array tasks) share a sweep
with no coordinator: the run-directory locks keep them apart.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from pathlib import Path

from charlm.config import TrainConfig
from charlm.settings import from_dict
from charlm.errors import CharlmError
from charlm.files import WriteError, atomic_write_text, read_bytes
from charlm.logs import get_logger
from charlm.experiments.plan import EvalStep, Plan, Point, task_config
from charlm.runs.directory import Run


@dataclasses.dataclass
class Outcome:
    point: str
    status: str  # finished, diverged, in use, interrupted
    seconds: float = 0.0
    summary: dict = dataclasses.field(default_factory=dict)


def parse_shard(text: str | None) -> tuple[int, int] | None:
    """``"2/4"`` → (2, 4): the third of four disjoint shares (I counts from 0, as Slurm arrays do)."""
    if text is None:
        return None
    try:
        index, count = (int(part) for part in text.split("/"))
    except ValueError:
        raise CharlmError(f"--shard must be I/N, such as 0/4, not {text!r}") from None
    if count < 1 or not 0 <= index < count:
        raise CharlmError(f"--shard {text}: I must be from 0 to N-1 and N at least 1")
    return index, count


def select(points: list[Point], only: list[str] = (), shard: tuple[int, int] | None = None) -> list[Point]:
    """The points matching every ``KEY=VALUE`` of ``only`` (axis values or settings), then the share."""
    wanted = []
    for condition in only:
        key, separator, value = condition.partition("=")
        if not separator:
            raise CharlmError(f"--only {condition!r} is not of the form KEY=VALUE")
        wanted.append((key.strip(), value.strip()))
    chosen = [point for point in points if all(_matches(point, key, value) for key, value in wanted)]
    if wanted and not chosen:
        raise CharlmError(f"no run of the plan matches {' '.join(only)}")
    if shard is not None:
        index, count = shard
        chosen = [point for position, point in enumerate(chosen) if position % count == index]
    return chosen


def _matches(point: Point, key: str, value: str) -> bool:
    found = point.settings.get(key, point.values.get(key, point.settings.get("cell_options", {}).get(key)))
    if isinstance(found, bool):
        return str(found).lower() == value.lower()
    return found is not None and str(found) == value


class Sweep:
    """A plan bound to a sweep directory."""

    def __init__(self, plan: Plan, directory: str | Path, *, data_dir=None, trust_code: bool = False):
        self.plan, self.directory, self.data_dir, self.trust_code = plan, Path(directory), data_dir, trust_code
        self._sizes = {}  # (model settings) → (hidden size, parameters): points often share a model
        user_cells = sorted({p.settings.get("cell", "") for p in plan.points() if ":" in str(p.settings.get("cell", ""))})
        if user_cells and not trust_code:
            module = user_cells[0].partition(":")[0]
            raise CharlmError(f"plan {plan.source} asks to import module {module!r} for its cell {user_cells[0]!r}; "
                              "charlm never runs code named in a file: pass --trust-code")

    @property
    def record_file(self) -> Path:
        return self.directory / "sweep.json"

    def bind(self) -> None:
        """Claim the directory for this plan, or refuse one that holds another plan's runs."""
        existing = self._read_record()
        if existing is not None and existing.get("fingerprint") != self.plan.fingerprint():
            raise CharlmError(f"sweep directory {self.directory} holds runs of another plan ({existing.get('plan')}, "
                              f"profile {existing.get('profile')}): choose another --dir")
        if existing is not None and existing.get("budget") != self.plan.budget:  # a label only: not in the fingerprint
            atomic_write_text(self.record_file, json.dumps({**existing, "budget": self.plan.budget}, indent=2, sort_keys=True) + "\n")
        if existing is None:
            try:
                self.directory.mkdir(parents=True, exist_ok=True)
            except OSError as error:
                raise WriteError(self.directory, error.strerror, error.errno, action="create sweep directory") from None
            record = {"plan": self.plan.name, "profile": self.plan.profile, "source": self.plan.source,
                      "fingerprint": self.plan.fingerprint(), "base": self.plan.base, "axes": self.plan.axes,
                      "eval": [dataclasses.asdict(step) for step in self.plan.evals],
                      "points": [point.name for point in self.plan.points()], "budget": self.plan.budget}
            atomic_write_text(self.record_file, json.dumps(record, indent=2, sort_keys=True) + "\n")

    def _read_record(self) -> dict | None:
        if not os.path.lexists(self.record_file):
            return None
        try:
            record = json.loads(read_bytes(self.record_file, "sweep record").decode("utf-8"))  # a FIFO: refused
        except (CharlmError, ValueError):
            record = None
        if not isinstance(record, dict):
            raise CharlmError(f"{self.record_file} is damaged: remove it to start the sweep afresh")
        return record

    def config(self, point: Point) -> TrainConfig:
        settings = {**point.settings, "run_dir": str(self.directory / point.name)}
        if self.data_dir is not None:
            settings["data_dir"] = str(self.data_dir)
        return from_dict(TrainConfig, settings)

    def state(self, point: Point) -> str:
        """new, finished, interrupted, diverged or running (another process holds it)."""
        run = Run(self.directory / point.name)
        if not run.config_file.exists():
            return "new"
        status = run.status()
        return {"created": "interrupted"}.get(status, status)

    def describe(self, point: Point) -> dict:
        """What a dry run shows of a point: its settings, hidden size and parameter count."""
        from charlm.cells import CELLS
        from charlm.corpora.catalog import vocabulary_size
        from charlm.model import LanguageModel, count_parameters
        from charlm.training.setup import model_config_for

        if self.plan.task is not None:
            return self._describe_task(point)
        config = self.config(point)
        vocabulary, assumed = vocabulary_size(config.corpus, self.data_dir)
        row = {"run": point.name, "corpus": config.corpus, "cell": config.cell, "layers": config.layers,
               "params": config.params, "state": self.state(point), "hidden": None, "parameters": None,
               "vocabulary": vocabulary, "vocabulary_assumed": assumed}
        if vocabulary is not None and ":" not in config.cell:
            key = json.dumps([vocabulary, config.cell, config.params, config.hidden, config.layers, config.embed_size,
                              config.cell_options], sort_keys=True)
            if key not in self._sizes:
                import torch

                cell_class = CELLS.get(config.cell)
                model_config = model_config_for(config, vocabulary, cell_class)
                with torch.device("meta"):
                    self._sizes[key] = model_config.hidden_size, count_parameters(LanguageModel(model_config, cell_class))
            row["hidden"], row["parameters"] = self._sizes[key]
        return row

    def warnings(self, points: list[Point]) -> list[str]:
        """What would stop the real run that a dry run can see: a directory holding another plan's
        runs, corpora that are not prepared (the embedded one prepares itself)."""
        found = []
        existing = self._read_record()
        if existing is not None and existing.get("fingerprint") != self.plan.fingerprint():
            found.append(f"sweep directory {self.directory} holds runs of another plan ({existing.get('plan')}, "
                         f"profile {existing.get('profile')}): the sweep would refuse it; choose another --dir")
        if self.plan.task is None:
            from charlm.corpora import load_corpus

            corpora = sorted({self.config(point).corpus for point in points} - {"pydoc"})
            for corpus in corpora:
                try:
                    load_corpus(corpus, self.data_dir)
                except CharlmError as error:
                    runs = sum(1 for point in points if self.config(point).corpus == corpus)
                    found.append(f"{error} (the sweep would fail on its {runs} run(s))")
        return found

    def _describe_task(self, point: Point) -> dict:
        import torch

        from charlm.model import count_parameters
        from charlm.tasks.models import build_task_model

        config = task_config(self.plan, point).resolved()
        with torch.device("meta"):
            model = build_task_model(config.make_task(), config.cell, config.hidden_size, config.layers, config.tied,
                                     config.cell_options)
        tied = "tied" if (config.tied if config.tied is not None else config.cell == "grid-lstm") else "untied"
        return {"run": point.name, "corpus": self.plan.task, "cell": f"{config.cell} {tied}", "layers": config.layers,
                "params": f"{config.max_samples:,} samples", "state": self.state(point), "hidden": config.hidden_size,
                "parameters": count_parameters(model), "vocabulary": None, "vocabulary_assumed": False}

    def _train_task(self, point: Point, state: str) -> dict:
        """Train or resume one point of a task plan; the summary the sweep prints."""
        from charlm.tasks.training import train_task

        run_dir = self.directory / point.name
        if state == "new":
            end = train_task(task_config(self.plan, point), run_dir=run_dir, progress_every=60.0)
        elif state == "interrupted":
            end = train_task(run_dir=run_dir, resume=True, max_samples=task_config(self.plan, point).resolved().max_samples,
                             progress_every=60.0)
        else:
            return {}
        return {"held-out accuracy": end["accuracy"], "samples": end["samples"]}

    def run(self, points: list[Point], log=None) -> list[Outcome]:
        """Train (or resume, or skip) each point, then its evaluation steps; a diverged run does not
        stop the sweep, Ctrl-C does (re-running the command continues)."""
        from charlm.training.trainer import StorageError, Trainer, TrainingDiverged, TrainingInterrupted

        log = log or get_logger().info
        self.bind()
        self._prepare_embedded(points)
        outcomes, started, trained_seconds, trained = [], time.monotonic(), 0.0, 0
        for number, point in enumerate(points, start=1):
            prefix = f"[{number}/{len(points)}] {point.name}"
            state = self.state(point)
            clock = time.monotonic()
            if state == "running":
                log(f"{prefix}: another process is training it; skipped")
                outcomes.append(Outcome(point.name, "in use"))
                continue
            if state == "diverged":
                log(f"{prefix}: diverged earlier; kept as diverged")
                outcomes.append(Outcome(point.name, "diverged"))
                continue
            try:
                if self.plan.task is not None:
                    log(f"{prefix}: {'training' if state == 'new' else 'resuming' if state == 'interrupted' else 'done'}")
                    summary = self._train_task(point, state)
                elif state == "new":
                    log(f"{prefix}: training")
                    summary = Trainer(self.config(point)).fit()
                elif state == "interrupted":
                    log(f"{prefix}: resuming")
                    summary = Trainer.resume(self.directory / point.name, trust_code=self.trust_code,
                                             **self._resumable(point)).fit()
                else:
                    summary = {}
                self._evaluate(point, log, prefix)
            except TrainingDiverged as error:
                log(f"{prefix}: {error}")
                outcomes.append(Outcome(point.name, "diverged", time.monotonic() - clock))
                continue
            except TrainingInterrupted as error:
                raise TrainingInterrupted(f"{error}; or run the same `charlm sweep` command again to go on with "
                                          f"the whole sweep ({number - 1} of {len(points)} runs done)") from None
            except (WriteError, StorageError):  # a full disk or a file-size limit stops every point: stop here
                raise
            except CharlmError as error:  # this point cannot run (in use, too large, corpus missing): go on
                log(f"{prefix}: not run: {error}")
                outcomes.append(Outcome(point.name, "in use" if "in use by another training" in str(error) else "failed"))
                continue
            seconds = time.monotonic() - clock
            if state == "finished":
                log(f"{prefix}: finished earlier; skipped")
            else:
                trained_seconds, trained = trained_seconds + seconds, trained + 1
                remaining = sum(1 for p in points[number:] if self.state(p) in ("new", "interrupted"))
                estimate = f", about {_minutes(trained_seconds / trained * remaining)} left" if remaining else ""
                score = (f"held-out accuracy {summary.get('held-out accuracy') or 0:.2%} after {summary.get('samples', 0):,} samples"
                         if self.plan.task else f"best valid {summary.get('best_valid_bpc', float('nan')):.4f} bpc")
                log(f"{prefix}: done in {_minutes(seconds)} ({score}); "
                    f"sweep {number}/{len(points)}, {_minutes(time.monotonic() - started)} elapsed{estimate}")
            outcomes.append(Outcome(point.name, "finished", seconds, summary))
        return outcomes

    def _prepare_embedded(self, points: list[Point]) -> None:
        """The embedded corpus needs no download: prepare it when a point trains on it."""
        from charlm.corpora import load_corpus, prepare_corpus

        if self.plan.task is None and any(point.settings.get("corpus", TrainConfig.corpus) == "pydoc" for point in points):
            try:
                load_corpus("pydoc", self.data_dir)
            except CharlmError:
                prepare_corpus("pydoc", data_dir=self.data_dir)

    def _resumable(self, point: Point) -> dict:
        """The plan's settings a resumption may carry (a new --epochs or time budget in the plan)."""
        from charlm.config import RESUMABLE_SETTINGS

        config = self.config(point)
        names = ("epochs", "max_minutes", "save_every") + (("data_dir",) if self.data_dir is not None else ())
        return {name: getattr(config, name) for name in names if name in RESUMABLE_SETTINGS}

    def _evaluate(self, point: Point, log, prefix: str) -> None:
        """The plan's evaluation steps a run has not had yet, recorded in its metrics.jsonl."""
        if not self.plan.evals:
            return
        from charlm.api import load

        run = Run(self.directory / point.name)
        done = {_eval_label(record) for record in run.history().evaluations}
        missing = [step for step in self.plan.evals if step.label not in done]
        if not missing or not run.best.exists():
            return
        model = load(run.path, trust_code=self.trust_code)
        for step in missing:
            log(f"{prefix}: evaluating ({step.label})")
            model.evaluate(step.split, dynamic=step.dynamic, adapt_on=step.adapt_on, batch_size=step.batch_size,
                           data_dir=self.data_dir)
            model.restore()


def _eval_label(record) -> str:
    """The label of the plan's evaluation step that wrote this ``eval`` record."""
    mode = record.mode
    if mode == "dynamic":
        mode = (record.hyperparameters or {}).get("method", "dynamic")
    return EvalStep(split="test" if record.split is None else record.split, dynamic=None if mode == "static" else mode,
                    adapt_on=record.adapt_on).label


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min" if seconds < 5400 else f"{seconds / 3600:.1f} h"
