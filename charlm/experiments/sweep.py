"""Running a plan: one ordinary run directory per point, under one sweep directory.

The sweep directory holds ``sweep.json`` (the plan, its profile and fingerprint) and a run
directory per point, named from its axis values. Running the same command again picks up where
it stopped: finished runs are skipped, interrupted ones resumed (``Trainer.resume``), runs another
process is training are left to it, diverged ones are kept as diverged, damaged ones (an unreadable
config.json or metrics.jsonl, a finished run's checkpoint cut short) are reported and skipped. Every
line the sweep prints is also appended to ``sweep.log`` in the sweep directory. ``--shard I/N`` takes
every N-th point from the I-th, so N processes (or a scheduler's array tasks) share a sweep
with no coordinator: the run-directory locks keep them apart.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from pathlib import Path

from charlm.config import TrainConfig, RESUMABLE_SETTINGS
from charlm.settings import from_dict
from charlm.errors import CharlmError, RunInUse, out_of_memory
from charlm.files import WriteError, append_text, atomic_write_text, make_directory, read_own_file
from charlm.logs import get_logger
from charlm.experiments.plan import EvalStep, Plan, Point, task_config
from charlm.experiments.sweep_checks import check_devices, check_on_corpora, damage
from charlm.runs.directory import Run
from charlm.experiments.preview import describe_point
from charlm.tasks.training import train_task
from charlm.training.trainer import StorageError, Trainer, TrainingDiverged, TrainingInterrupted
from charlm.corpora import load_corpus, prepare_corpus
from charlm.api import load


@dataclasses.dataclass
class Outcome:
    point: str
    status: str  # finished, diverged, in use, failed (not run, or its evaluation failed), damaged
    seconds: float = 0.0
    summary: dict = dataclasses.field(default_factory=dict)
    detail: str = ""  # why a failed or damaged point did not finish, in a few words


class Sweep:
    """A plan bound to a sweep directory."""

    def __init__(self, plan: Plan, directory: str | Path, *, data_dir=None, trust_code: bool = False):
        self.plan, self.directory, self.data_dir, self.trust_code = plan, Path(directory), data_dir, trust_code
        self.model_sizes = {}  # (model settings) → (hidden size, parameters) for dry runs: points often share a model
        user_cells = sorted(
            {p.settings.get("cell", "") for p in plan.points() if ":" in str(p.settings.get("cell", ""))}
        )
        if user_cells and not trust_code:
            module = user_cells[0].partition(":")[0]
            raise CharlmError(
                f"plan {plan.source} asks to import module {module!r} for its cell {user_cells[0]!r}; "
                "charlm never runs code named in a file: pass --trust-code"
            )

    @property
    def record_file(self) -> Path:
        return self.directory / "sweep.json"

    @property
    def log_file(self) -> Path:
        return self.directory / "sweep.log"

    def check(self, points: list[Point]) -> None:
        """What the plan's values ask of the prepared corpora (``sweep_checks.check_on_corpora``),
        before anything is written."""
        check_on_corpora(self, points)

    def bind(self) -> None:
        """Claim the directory for this plan, or refuse one that holds another plan's runs."""
        existing = self._read_record()
        if existing is not None and existing.get("fingerprint") != self.plan.fingerprint():
            raise CharlmError(
                f"sweep directory {self.directory} holds runs of another plan ({_plan_of(existing)}): "
                "choose another --dir"
            )
        if existing is not None and existing.get("budget") != self.plan.budget:  # a label only: not in the fingerprint
            atomic_write_text(
                self.record_file, json.dumps({**existing, "budget": self.plan.budget}, indent=2, sort_keys=True) + "\n"
            )
        if existing is None:
            make_directory(self.directory, action="create sweep directory")
            record = {
                "plan": self.plan.name,
                "profile": self.plan.profile,
                "source": self.plan.source,
                "fingerprint": self.plan.fingerprint(),
                "base": self.plan.base,
                "axes": self.plan.axes,
                "eval": [dataclasses.asdict(step) for step in self.plan.evals],
                "points": [point.name for point in self.plan.points()],
                "budget": self.plan.budget,
            }
            atomic_write_text(self.record_file, json.dumps(record, indent=2, sort_keys=True) + "\n")

    def _read_record(self) -> dict | None:
        if not os.path.lexists(self.record_file):
            return None
        try:
            record = json.loads(read_own_file(self.record_file, "sweep record").decode("utf-8"))
        except (CharlmError, ValueError, RecursionError):  # RecursionError: arrays nested thousands deep
            record = None
        if not isinstance(record, dict) or not isinstance(record.get("fingerprint"), str):  # what binds it to its plan
            raise CharlmError(f"{self.record_file} is damaged: remove it to start the sweep afresh")
        return record

    def config(self, point: Point) -> TrainConfig:
        settings = {**point.settings, "run_dir": str(self.directory / point.name)}
        if self.data_dir is not None:
            settings["data_dir"] = str(self.data_dir)
        return from_dict(TrainConfig, settings)

    def state(self, point: Point) -> str:
        """new, finished, interrupted, diverged, running (another process holds it) or damaged
        (``damage_of`` says why)."""
        run = Run(self.directory / point.name)
        if not os.path.lexists(run.config_file):
            return "new"
        if self.damage_of(point) is not None:
            return "damaged"
        status = run.status()
        return {"created": "interrupted"}.get(status, status)

    def damage_of(self, point: Point) -> str | None:
        """Why the run directory of ``point`` cannot be trusted, or None (``sweep_checks.damage``)."""
        return damage(Run(self.directory / point.name), check_checkpoints=self.plan.task is None)

    def describe(self, point: Point) -> dict:
        """What a dry run shows of a point: its settings, hidden size and parameter count."""
        return describe_point(self, point)

    def warnings(self, points: list[Point]) -> list[str]:
        """What would stop the real run that a dry run can see: a directory holding another plan's
        runs, corpora that are not prepared (the embedded one prepares itself)."""
        found = []
        existing = self._read_record()
        if existing is not None and existing.get("fingerprint") != self.plan.fingerprint():
            found.append(
                f"sweep directory {self.directory} holds runs of another plan ({_plan_of(existing)}): "
                "the sweep would refuse it; choose another --dir"
            )
        if self.plan.task is None:
            corpora = sorted({self.config(point).corpus for point in points} - {"pydoc"})
            for corpus in corpora:
                try:
                    load_corpus(corpus, self.data_dir)
                except CharlmError as error:
                    runs = sum(1 for point in points if self.config(point).corpus == corpus)
                    found.append(f"{error} (the sweep would fail on its {runs} run(s))")
        return found

    def _train_task(self, point: Point, state: str) -> dict:
        """Train or resume one point of a task plan; the summary the sweep prints."""
        run_dir = self.directory / point.name
        if state == "new":
            end = train_task(task_config(self.plan, point), run_dir=run_dir, progress_every=60.0)
        elif state == "interrupted":
            end = train_task(
                run_dir=run_dir,
                resume=True,
                max_samples=task_config(self.plan, point).resolved().max_samples,
                progress_every=60.0,
            )
        else:
            return {}
        return {"held-out accuracy": end["accuracy"], "samples": end["samples"]}

    def run(self, points: list[Point], log=None) -> list[Outcome]:
        """Train (or resume, or skip) each point, then its evaluation steps; a diverged run does not
        stop the sweep, Ctrl-C does (re-running the command continues). A point that cannot run, whose
        evaluation fails or whose directory is damaged is an outcome ``failed`` or ``damaged`` with
        its reason in the log (and sweep.log); the sweep goes on with the next."""
        self._prepare_embedded(points)
        self.check(points)  # before the sweep directory is made: a bad value is one line, nothing written
        check_devices(self, points)
        self.bind()
        log = self._logging_to_file(log or get_logger().info)
        outcomes, started, trained_seconds, trained = [], time.monotonic(), 0.0, 0
        for number, point in enumerate(points, start=1):
            prefix = f"[{number}/{len(points)}] {point.name}"
            state = self.state(point)
            clock = time.monotonic()
            if state == "damaged":
                log(
                    f"{prefix}: damaged, skipped: {self.damage_of(point)}; move {self.directory / point.name} away "
                    "and run the same command again to train it afresh"
                )
                outcomes.append(Outcome(point.name, "damaged", detail="damaged"))
                continue
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
                    log(
                        f"{prefix}: "
                        f"{'training' if state == 'new' else 'resuming' if state == 'interrupted' else 'done'}"
                    )
                    summary = self._train_task(point, state)
                elif state == "new":
                    log(f"{prefix}: training")
                    summary = Trainer(self.config(point)).fit()
                elif state == "interrupted":
                    log(f"{prefix}: resuming")
                    summary = Trainer.resume(
                        self.directory / point.name, trust_code=self.trust_code, **self._resumable(point)
                    ).fit()
                else:
                    summary = {}
            except TrainingDiverged as error:
                log(f"{prefix}: {error}")
                outcomes.append(Outcome(point.name, "diverged", time.monotonic() - clock))
                continue
            except TrainingInterrupted as error:
                raise TrainingInterrupted(
                    f"{error}; or run the same `charlm sweep` command again to go on with "
                    f"the whole sweep ({number - 1} of {len(points)} runs done)"
                ) from None
            except (WriteError, StorageError):  # a full disk or a file-size limit stops every point: stop here
                raise
            except CharlmError as error:  # this point cannot run (in use, too large, corpus missing): go on
                # another process took it since state() looked: it holds the run, or has trained it already
                if isinstance(error, RunInUse) or self.state(point) in ("running", "finished"):
                    log(f"{prefix}: another process is training it; skipped")
                    outcomes.append(Outcome(point.name, "in use"))
                else:
                    log(f"{prefix}: not run: {error}")
                    outcomes.append(Outcome(point.name, "failed", detail="not run"))
                continue
            try:
                try:
                    self._evaluate(point, log, prefix)
                except (RuntimeError, MemoryError) as error:  # scoring ran out of memory: this point's failure
                    raise out_of_memory(error, "give the plan's [[eval]] a smaller batch_size") or error
            except WriteError:
                raise
            except CharlmError as error:  # the trained run is kept; the next command evaluates it again
                if isinstance(error, RunInUse):
                    log(f"{prefix}: another process is evaluating it; skipped")
                    outcomes.append(Outcome(point.name, "in use"))
                    continue
                log(
                    f"{prefix}: trained, but its evaluation failed: {error}; the run is kept: run the same command "
                    "again to evaluate it"
                )
                outcomes.append(Outcome(point.name, "failed", time.monotonic() - clock, summary, "evaluation failed"))
                continue
            seconds = time.monotonic() - clock
            if state == "finished":
                log(f"{prefix}: finished earlier; skipped")
            else:
                trained_seconds, trained = trained_seconds + seconds, trained + 1
                remaining = sum(1 for p in points[number:] if self.state(p) in ("new", "interrupted"))
                estimate = f", about {_minutes(trained_seconds / trained * remaining)} left" if remaining else ""
                score = (
                    f"held-out accuracy {summary.get('held-out accuracy') or 0:.2%} after "
                    f"{summary.get('samples', 0):,} samples"
                    if self.plan.task
                    else f"best valid {summary.get('best_valid_bpc', float('nan')):.4f} bpc"
                )
                log(
                    f"{prefix}: done in {_minutes(seconds)} ({score}); "
                    f"sweep {number}/{len(points)}, {_minutes(time.monotonic() - started)} elapsed{estimate}"
                )
            outcomes.append(Outcome(point.name, "finished", seconds, summary))
        return outcomes

    def _logging_to_file(self, log):
        """``log``, also appending each line to ``sweep.log`` (what a batch job's user reads later)."""

        def both(line: str) -> None:
            log(line)
            append_text(self.log_file, line + "\n")

        return both

    def _prepare_embedded(self, points: list[Point]) -> None:
        """The embedded corpus needs no download: prepare it when a point trains on it."""
        if self.plan.task is None and any(
            point.settings.get("corpus", TrainConfig.corpus) == "pydoc" for point in points
        ):
            try:
                load_corpus("pydoc", self.data_dir)
            except CharlmError:
                prepare_corpus("pydoc", data_dir=self.data_dir)

    def _resumable(self, point: Point) -> dict:
        """The plan's settings a resumption may carry (a new --epochs or time budget in the plan)."""
        config = self.config(point)
        names = ("epochs", "max_minutes", "save_every") + (("data_dir",) if self.data_dir is not None else ())
        return {name: getattr(config, name) for name in names if name in RESUMABLE_SETTINGS}

    def _evaluate(self, point: Point, log, prefix: str) -> None:
        """The plan's evaluation steps a run has not had yet, recorded in its metrics.jsonl."""
        if not self.plan.evals:
            return
        run = Run(self.directory / point.name)
        if not self._missing_evals(run):
            return
        run.acquire()  # one process evaluates a run: another sweep process may have found it finished too
        try:
            missing = self._missing_evals(run)  # less what that process evaluated before this one took the lock
            if missing and not run.best.exists():
                raise CharlmError(f"{run.best} does not exist: there are no best weights to evaluate")
            model = load(run.path, trust_code=self.trust_code) if missing else None
            for step in missing:
                log(f"{prefix}: evaluating ({step.label})")
                model.evaluate(
                    step.split,
                    dynamic=step.dynamic,
                    adapt_on=step.adapt_on,
                    batch_size=step.batch_size,
                    data_dir=self.data_dir,
                )
                model.restore()
        finally:
            run.release()

    def _missing_evals(self, run: Run) -> list:
        """The plan's evaluation steps ``run`` has no record of."""
        done = {_eval_label(record) for record in run.history().evaluations}
        return [step for step in self.plan.evals if step.label not in done]


def _eval_label(record) -> str:
    """The label of the plan's evaluation step that wrote this ``eval`` record."""
    mode = record.mode
    if mode == "dynamic":
        mode = (record.hyperparameters or {}).get("method", "dynamic")
    return EvalStep(
        split="test" if record.split is None else record.split,
        dynamic=None if mode == "static" else mode,
        adapt_on=record.adapt_on,
    ).label


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min" if seconds < 5400 else f"{seconds / 3600:.1f} h"


def _plan_of(record: dict) -> str:
    """The plan a sweep.json names, with its profile where it has one: ``lru-table1, profile small``."""
    profile = record.get("profile")
    return f"{record.get('plan')}" + ("" if profile is None else f", profile {profile}")
