"""Reading runs back for a report: each run directory (through its ``RunHistory``) as a
``RunRecord``: its settings, status, parameter budget, epochs, the device it trained on, and its
training and validation bpc as points by tokens and training seconds. A damaged run is left out with
a warning, never hiding the others."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
from pathlib import Path

from charlm.config import RESUMABLE_SETTINGS, TrainConfig
from charlm.errors import CharlmError
from charlm.files import read_own_file
from charlm.logs import get_logger
from charlm.sizing import parse_budget
from charlm.runs.directory import Run, find_runs
from charlm.runs.records import EpochRecord, EvalRecord, StepRecord


@dataclasses.dataclass(frozen=True)
class Point:
    """A bpc measured after ``tokens`` training tokens and ``seconds`` of training."""

    tokens: float
    seconds: float
    bpc: float


@dataclasses.dataclass(frozen=True)
class RunRecord:
    """One run read back from its directory: its settings, status and the records a report needs."""

    name: str
    corpus: str
    cell: str
    layers: int | None
    hidden: int | None
    parameters: int | None
    budget: str
    budget_size: float
    fraction: float
    seed: int | None
    status: str
    epochs: tuple[EpochRecord, ...]  # the last record written for each epoch, in order
    best: EpochRecord | None  # the epoch record of the best validation loss (the last one flagged best)
    test_loss: float | None  # the test score of the best epoch's weights
    test_bpc: float | None
    steps: tuple[StepRecord, ...]  # step records with per-layer gradient norms
    evaluations: tuple[EvalRecord, ...]  # dynamic "eval" records
    tokens_seen: int | None = None  # training tokens of the whole run (None: written before it was counted)
    stopped_by: str | None = None  # epochs, patience, tokens, time, diverged, interrupted; None while it runs
    device: str | None = None  # what it trained on, from provenance.json: ``NVIDIA H200``, ``cpu (x86_64, 2 threads)``
    trained: tuple[Point, ...] = ()  # training bpc of the step records, by tokens and training seconds
    validated: tuple[Point, ...] = ()  # validation bpc of the valid and epoch records
    corpus_fingerprint: str | None = None  # the version of its corpus, from provenance.json
    corpus_content: str | None = None  # ... and the digest of its content (since 0.4)
    protocol: str = ""  # the digest of the settings that define how it trained (protocol_of)

    @property
    def completed_epochs(self) -> int:
        return sum(1 for epoch in self.epochs if not epoch.partial)

    @property
    def best_epoch(self) -> int | None:
        return self.best.epoch if self.best else None

    def seconds(self, through_epoch: int | None = None) -> float:
        """Training time (the sum of the epochs' train_seconds) through ``through_epoch``, or in all."""
        return sum(
            epoch.train_seconds or 0.0 for epoch in self.epochs if through_epoch is None or epoch.epoch <= through_epoch
        )


NOT_PROTOCOL = {  # what may change between sessions, but the budgets a comparison shares; and the sweep's axes
    *(set(RESUMABLE_SETTINGS) - {"epochs", "max_minutes", "max_tokens", "patience"}),
    *("seed", "run_dir", "data_dir", "init_from", "text", "corpus", "cell", "cell_options"),
    *("params", "hidden_size", "layers", "train_fraction"),
}


def read_runs(directories: list[str | Path], skipped: list | None = None) -> list[RunRecord]:
    """Every run at or below the directories, named by its path relative to their common parent.

    A damaged run (its config.json or metrics.jsonl unreadable, or of the wrong types) is left out
    with a warning, and (name, reason) appended to ``skipped``: it does not hide the others."""
    found = {}
    for directory in directories:
        runs = [
            run for run in find_runs(directory) if "task" not in run.read_json(run.config_file)
        ]  # `charlm task` runs: report/tasks.py
        if not runs:
            raise CharlmError(f"no runs under {directory} (no directory there holds config.json and metrics.jsonl)")
        found.update({run.path.resolve(): run for run in runs})
    base = Path(os.path.commonpath([Path(directory).resolve() for directory in directories]))
    if base in found:
        base = base.parent
    records, damaged = [], []
    for path, run in found.items():
        name = Path(os.path.relpath(path, base)).as_posix()
        try:
            records.append(read_run(run, name))
        except CharlmError as error:
            damaged.append((name, str(error)))
    if not records:
        raise CharlmError(
            f"no readable runs under {', '.join(map(str, directories))}: "
            + "; ".join(f"{name}: {reason}" for name, reason in sorted(damaged))
        )
    for name, reason in sorted(damaged):
        get_logger().warning(f"warning: skipped the damaged run {name}: {reason}")
    if skipped is not None:
        skipped.extend(sorted(damaged))
    return sorted(protocols_apart(corpus_versions_apart(records)), key=lambda record: record.name)


def protocols_apart(records: list[RunRecord]) -> list[RunRecord]:
    """``records``, the runs that a table would put in one cell (corpus, budget, layers, cell, fraction) but
    that trained under different protocols (batch, window, rates, schedule, layout, regularisers: every
    setting that defines a run but the sweep's axes and the seed) labelled ``cell@PROTOCOL``, with a warning:
    runs gathered from several machines or sweeps never share a cell of a table unless they share a protocol."""
    groups = {}
    for record in records:
        key = (record.corpus, record.budget_size, record.budget, record.layers or 0, record.cell, record.fraction)
        groups.setdefault(key, []).append(record)
    mixed = {key for key, runs in groups.items() if len({run.protocol for run in runs}) > 1}
    for key in sorted(mixed, key=str):
        get_logger().warning(
            f"warning: the {key[4]} runs on {key[0]} trained under {len({r.protocol for r in groups[key]})} protocols "
            f"(settings other than the seed differ): they are reported apart, as {key[4]}@PROTOCOL"
        )
    return [
        dataclasses.replace(record, cell=f"{record.cell}@{record.protocol}")
        if (record.corpus, record.budget_size, record.budget, record.layers or 0, record.cell, record.fraction) in mixed
        else record
        for record in records
    ]


def protocol_of(train: dict, model: dict) -> str:
    """A short digest of the settings that define how a run trained, besides what a sweep varies (corpus,
    cell, size, fraction, seed) and what may change between sessions (``RESUMABLE_SETTINGS``); the settings
    a run of an earlier charlm does not record count at their defaults."""
    try:
        train = TrainConfig.from_dict(train).to_dict()
    except CharlmError:
        pass
    defining = {key: value for key, value in train.items() if key not in NOT_PROTOCOL}
    defining["cell_options"] = model.get("cell_options", train.get("cell_options", {}))
    return hashlib.sha256(json.dumps(defining, sort_keys=True, default=str).encode("utf-8")).hexdigest()[:8]


def corpus_versions_apart(records: list[RunRecord]) -> list[RunRecord]:
    """``records``, the runs of a corpus that trained on different versions of it (prepared again between
    them) labelled ``name@VERSION`` so that no table or figure puts them together, with a warning. The
    version is the content digest where every run of the corpus records one, else the fingerprint."""
    by_corpus = {}
    for record in records:
        by_corpus.setdefault(record.corpus, []).append(record)
    versions = {}
    for corpus, runs in by_corpus.items():
        by_content = all(run.corpus_content for run in runs)
        versions[corpus] = {run.name: run.corpus_content if by_content else run.corpus_fingerprint for run in runs}
    mixed = {corpus for corpus, of_run in versions.items() if len(set(of_run.values()) - {None}) > 1}
    for corpus in sorted(mixed):
        get_logger().warning(
            f"warning: the runs on corpus {corpus!r} trained on {len(set(versions[corpus].values()) - {None})} "
            f"versions of it (prepared again between them): they are reported apart, as {corpus}@VERSION"
        )
    return [
        dataclasses.replace(record, corpus=f"{record.corpus}@{version[:8]}")
        if record.corpus in mixed and (version := versions[record.corpus][record.name])
        else record
        for record in records
    ]


def read_run(run: Run, name: str) -> RunRecord:
    """A run's settings from config.json and its records from metrics.jsonl (a ``CharlmError`` when either is
    damaged)."""
    config = run.read_config()
    train, model = config.get("train", {}), config.get("model", {})
    history = run.history()
    provenance = run.read_json(run.provenance_file)
    parameters = history.parameters
    budget, budget_size = budget_label(train.get("params"), parameters, nominal_budget(run))
    return RunRecord(
        name=name,
        corpus=str(train.get("corpus", "?")),
        cell=str(model.get("cell", train.get("cell", "?"))),
        layers=model.get("layers", train.get("layers")),
        hidden=model.get("hidden_size", train.get("hidden")),
        parameters=parameters,
        budget=budget,
        budget_size=budget_size,
        fraction=float(train.get("train_fraction", 1.0)),
        seed=train.get("seed"),
        status=run.status(history),
        epochs=tuple(history.epochs),
        best=history.best,
        test_loss=history.test_loss_at_best,
        test_bpc=history.test_bpc_at_best,
        steps=tuple(step for step in history.steps if step.grad_norm),
        evaluations=tuple(evaluation for evaluation in history.evaluations if evaluation.mode == "dynamic"),
        tokens_seen=_tokens_seen(history),
        stopped_by=_stopped_by(history, run.status(history)),
        device=device_label(provenance),
        corpus_fingerprint=_text(provenance.get("corpus_fingerprint")),
        corpus_content=_text(provenance.get("corpus_content")),
        protocol=protocol_of(train, model),
        **progress_points(history),
    )


def device_label(provenance: dict) -> str | None:
    """``NVIDIA H200`` for a GPU, ``cpu (x86_64, 2 threads)`` for a CPU; None when not recorded."""
    device, name, threads = provenance.get("device"), provenance.get("device_name"), provenance.get("threads")
    if not isinstance(device, str):
        return None
    if device.startswith("cuda") and isinstance(name, str):
        return name
    details = [str(part) for part in (name, threads and f"{threads} thread{'' if threads == 1 else 's'}") if part]
    return f"{device} ({', '.join(details)})" if details else device


def progress_points(history) -> dict[str, tuple[Point, ...]]:
    """The run's training bpc (``trained``) and validation bpc (``validated``) as points by tokens and
    training seconds. Step and valid records carry both (since the release after 0.3.0); older ones are
    placed by their step between the epoch ends, which record them, as if each epoch trained at an even
    pace. Runs written before epochs counted their tokens (charlm 0.2) have no points."""
    anchors, ends, seconds = [(0, 0, 0.0)], [], 0.0  # (step, tokens, seconds) at the start and each epoch end
    for epoch in history.epochs:
        seconds += epoch.train_seconds or 0.0
        if epoch.tokens_seen is not None:
            ends.append(Point(epoch.tokens_seen, seconds, epoch.valid_bpc))
            if epoch.step is not None:
                anchors.append((epoch.step, epoch.tokens_seen, seconds))

    def placed(record, bpc) -> Point | None:
        if record.tokens is not None and record.seconds is not None:
            return Point(record.tokens, record.seconds, bpc)
        for (step0, tokens0, seconds0), (step1, tokens1, seconds1) in zip(anchors, anchors[1:]):
            if record.step is not None and step0 <= record.step <= step1 and step1 > step0:
                share = (record.step - step0) / (step1 - step0)
                return Point(tokens0 + share * (tokens1 - tokens0), seconds0 + share * (seconds1 - seconds0), bpc)
        return None  # past the last epoch end of a run written before step records carried their tokens

    trained = [placed(record, record.bpc) for record in history.steps]
    validated = [placed(record, record.valid_bpc) for record in history.of("valid")] + ends
    return {
        "trained": tuple(point for point in trained if point is not None and _finite(point.bpc)),
        "validated": tuple(
            sorted((point for point in validated if point is not None and _finite(point.bpc)), key=lambda p: p.tokens)
        ),
    }


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def _tokens_seen(history) -> int | None:
    counted = [record.tokens_seen for record in history.of("epoch", "end") if record.tokens_seen is not None]
    return counted[-1] if counted else None


def _stopped_by(history, status: str) -> str | None:
    """Why the run's training last stopped: its ``end`` record says, or its status (diverged, interrupted)."""
    if status in ("diverged", "interrupted"):
        return status
    ends = history.of("end")
    if ends and ends[-1].stopped_by:
        return ends[-1].stopped_by
    return None


def nominal_budget(run: Run) -> str | None:
    """The ``budget`` label of the plan whose sweep made the run (sweep.json beside it), if any."""
    record = run.path.parent / "sweep.json"
    if not os.path.lexists(record):
        return None
    try:
        label = json.loads(read_own_file(record, "sweep record").decode("utf-8")).get("budget")
    except (CharlmError, ValueError, AttributeError, RecursionError):  # RecursionError: arrays nested thousands deep
        return None
    return label if isinstance(label, str) and label.strip() else None


def budget_label(params, parameters, nominal: str | None = None) -> tuple[str, float]:
    """The parameter budget a run belongs to, and a number to sort by: its ``--params`` as given, else
    the nominal budget its plan names for runs sized by ``--hidden`` (``0.9M per layer``), else its
    parameter count to two significant figures (``≈1.8M``)."""
    if not isinstance(params, str) and nominal is not None:
        params = nominal
    if isinstance(params, str):
        try:
            return params, float(
                parse_budget(params.split()[0].lstrip("≈~") if params.split() else params)
            )  # "0.9M per layer" sorts as 0.9M
        except CharlmError:
            return params, math.inf
    if parameters is None:
        return "unknown", math.inf
    rounded = float(f"{parameters:.2g}")
    for scale, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if rounded >= scale:
            return f"≈{rounded / scale:g}{suffix}", rounded
    return f"≈{rounded:g}", rounded


def _text(value) -> str | None:
    return value if isinstance(value, str) else None
