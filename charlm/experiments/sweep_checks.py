"""What a sweep checks before it trains anything, and of each run directory it finds in its directory.

``check_on_corpora``: the plan's values that only a prepared corpus can judge (more evaluation
streams than a split has predictions, a parameter budget beyond what charlm sizes for the corpus's
vocabulary), for every point whose corpus is prepared, before the first point trains. A corpus
that is not prepared is the point's own failure when its turn comes; the sweep goes on.

``damage``: why a run directory of the sweep cannot be trusted (its config.json or metrics.jsonl
unreadable or of the wrong types, a finished run's checkpoint cut short), or None. A damaged run is
reported and skipped, never counted as done.
"""

from __future__ import annotations

import os
import zipfile

from charlm.errors import CharlmError, ConfigError
from charlm.experiments.plan_checks import point_error
from charlm.cells import CELLS
from charlm.config_inference import DynamicOptions, EvalConfig
from charlm.corpora import load_corpus
from charlm.inference.scoring import check_splits_fit
from charlm.training.setup import check_streams, model_config_for
from charlm.runtime.devices import resolve_device


def check_on_corpora(sweep, points) -> None:
    """The values of ``points`` that depend on their prepared corpus, checked before anything trains."""
    plan, corpora, sized = sweep.plan, {}, set()
    if plan.task is not None:
        return
    for point in points:
        config = sweep.config(point)
        if config.corpus not in corpora:
            try:
                corpora[config.corpus] = load_corpus(config.corpus, config.data_dir)
            except CharlmError:  # not prepared (or unreadable): this point fails at its turn, with the reason
                corpora[config.corpus] = None
        corpus = corpora[config.corpus]
        if corpus is None:
            continue
        try:
            check_streams(config, corpus)
        except ConfigError as error:
            raise point_error(plan, point, error, error.field) from None
        for index, step in enumerate(plan.evals):
            default = EvalConfig.batch_size if step.dynamic is None else DynamicOptions.batch_size
            try:
                check_splits_fit(corpus, (step.split, step.adapt_on), step.batch_size or default, EvalConfig)
            except ConfigError as error:
                where = plan.origins.get(("eval", ""), "eval")
                given = "" if step.batch_size else f" (its default for a {step.dynamic or 'static'} evaluation)"
                raise CharlmError(f"plan {plan.source}: {where}[{index}].batch_size{given} {error.reason}") from None
        key = (
            corpus.vocab_size,
            config.cell,
            config.params,
            config.layers,
            config.embed_size,
            repr(config.cell_options),
        )
        if config.params is None or ":" in config.cell or key in sized:
            continue
        try:
            model_config_for(config, corpus.vocab_size, CELLS.get(config.cell))
        except CharlmError as error:
            raise point_error(plan, point, error, "params") from None
        sized.add(key)


def check_devices(sweep, points) -> None:
    """Each device the points train on, available on this machine: before a real sweep starts (not a
    dry run, whose plan may be meant for another machine), so that a plan naming `cuda:99` is one line
    rather than every point failing in turn."""
    if sweep.plan.task is not None:  # a task plan names no device: its runs take the machine's
        return
    seen = set()
    for point in points:
        device = getattr(sweep.config(point), "device", None)
        if device is None or device in seen:
            continue
        try:
            resolve_device(device)
        except CharlmError as error:
            raise point_error(sweep.plan, point, error, "device") from None
        seen.add(device)


def damage(run, check_checkpoints: bool = True) -> str | None:
    """Why run directory ``run`` cannot be trusted, or None. A finished run's ``best.pt`` and
    ``last.pt`` must be whole archives (a file cut short has no central directory; the check reads
    only its end, not the weights); an interrupted run's ``last.pt`` is the resume's to judge (it falls
    back to ``previous.pt``)."""
    try:
        run.read_config()
        history = run.history()
        status = run.status(history)
    except CharlmError as error:
        return str(error)
    if status != "finished" or not check_checkpoints:
        return None
    for path in (run.best, run.last):
        if not os.path.lexists(path):
            if path == run.best and history.best is not None:
                return f"{path} is missing though the run finished (its records name a best epoch)"
            continue
        problem = _archive_problem(path)
        if problem:
            return f"{path} {problem}"
    return None


def _archive_problem(path) -> str | None:
    if not zipfile.is_zipfile(path):  # also False for what cannot be read
        return "is cut short or is not a checkpoint (no archive directory at its end)"
    return None
