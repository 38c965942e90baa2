"""The dynamic evaluation protocol: statistics, optional grid search, optional adaptation on
validation, then the evaluated split scored both statically and dynamically, timed.

Protocols, named as in the Delta-RNN paper:

- "#1": adapt on the evaluated split only, starting from the trained weights;
- "#2" (``adapt_on="valid"``): run the same procedure over the whole validation split first, keep
  the adapted weights, and score the test split from there (state restarts; only the test
  figure counts). With rms, the pull keeps pointing at the trained weights θ₀.

The grid search scores every (η, λ) of the grid by dynamic evaluation of a prefix of the
validation split, each point from the trained weights, and keeps the lowest bpc.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import math
import os
import time
from pathlib import Path

import numpy as np

from charlm.config import DynamicOptions
from charlm.inference.dynamic import METHODS, DynamicDiverged, collect_gradient_statistics, dynamic_score, make_update
from charlm.errors import CharlmError
from charlm.logs import get_logger
from charlm.settings import INT64_MAX, flag_of
from charlm.corpora.streams import check_streams_fit
from charlm.inference.scoring import Score, characters_per_token, check_splits_fit, score_tokens

# The grids --dyn-search tries: η for both methods, λ for rms (tuned on War and Peace, 1M parameters).
SEARCH_LRS = {"sgd": (0.001, 0.003, 0.01, 0.03, 0.1), "rms": (1e-5, 3e-5, 1e-4, 3e-4)}
SEARCH_DECAYS = {"sgd": (0.0,), "rms": (0.0, 0.01, 0.1)}


@dataclasses.dataclass
class SearchPoint:
    lr: float
    decay: float
    bpc: float  # inf where the point diverged


@dataclasses.dataclass
class SearchResult:
    points: list[SearchPoint]
    static_bpc: float  # of the same prefix, for reference
    tokens: int  # length of the prefix

    @property
    def best(self) -> SearchPoint:
        return min(self.points, key=lambda point: point.bpc)

    def edge_notes(self) -> list[str]:
        """A note for each setting whose best value is the smallest or the largest of its grid (and
        not the end of its bounds, such as λ = 0): the best may lie beyond, and which way to look."""
        best, notes = self.best, []
        if not math.isfinite(best.bpc):  # every point diverged: no best to speak of
            return notes
        bounds = {field.name: field.metadata for field in dataclasses.fields(DynamicOptions)}
        for name, symbol in (("lr", "η"), ("decay", "λ")):
            tried = sorted({getattr(point, name) for point in self.points})
            value = getattr(best, name)
            if len(tried) < 2 or value not in (tried[0], tried[-1]):
                continue
            smallest = value == tried[0]
            if value == bounds[name].get("min" if smallest else "max"):
                continue  # nothing lies beyond
            edge, way = ("smallest", "smaller") if smallest else ("largest", "larger")
            notes.append(
                f"the best {symbol}, {value:g}, is the {edge} the search tried ({tried[0]:g} to {tried[-1]:g}): "
                f"a {way} one may do better; try {flag_of(DynamicOptions, name)} {way} than {value:g}"
            )
        return notes


@dataclasses.dataclass
class DynamicReport:
    options: DynamicOptions  # as used for the reported figure (after the search)
    split: str
    static: Score
    dynamic: Score
    static_seconds: float
    dynamic_seconds: float
    statistics_seconds: float = 0.0
    statistics_batches: int = 0
    adapt_on: str | None = None
    adaptation: Score | None = None  # the dynamic score of the adaptation split, for information
    adaptation_seconds: float = 0.0
    search: SearchResult | None = None

    @property
    def static_chars_per_second(self) -> float:
        return self.static.characters / self.static_seconds

    @property
    def dynamic_chars_per_second(self) -> float:
        return self.dynamic.characters / self.dynamic_seconds

    def record_fields(self) -> dict:
        """Plain fields for the run's metrics.jsonl ``eval`` event."""
        fields = {
            "split": self.split,
            "mode": "dynamic",
            "adapt_on": self.adapt_on,
            "hyperparameters": self.options.hyperparameters(),
            **self.static.as_dict("static_"),
            **self.dynamic.as_dict("dynamic_"),
            "static_chars_per_s": self.static_chars_per_second,
            "dynamic_chars_per_s": self.dynamic_chars_per_second,
            "statistics_seconds": self.statistics_seconds,
            "statistics_batches": self.statistics_batches,
        }
        if self.adaptation is not None:
            fields.update(adaptation_bpc=self.adaptation.bpc, adaptation_seconds=self.adaptation_seconds)
        if self.search is not None:
            fields["search"] = {
                "prefix_tokens": self.search.tokens,
                "static_bpc": self.search.static_bpc,
                "points": [dataclasses.asdict(point) for point in self.search.points],
            }
        return fields


def statistics_tokens(train, options: DynamicOptions) -> int:
    """About how many training tokens rms's gradient statistics read (a progress bar's total)."""
    if options.stat_batches is None:
        return len(train)
    return min(len(train), options.stat_batches * options.stat_batch_size * options.segment)


class NoProgress:
    """The progress interface: ``stage(label, total)`` is a context giving ``callback(tokens, nats)``."""

    @contextlib.contextmanager
    def stage(self, label: str, total: int):
        yield lambda tokens, nats: None


def grid_search(
    model,
    tokens: np.ndarray,
    options: DynamicOptions,
    rms=None,
    *,
    lrs,
    decays,
    device=None,
    chars_per_token: float = 1.0,
    progress=None,
    cuda_graph: bool = True,
) -> SearchResult:
    """Dynamic bpc of ``tokens`` for every (η, λ) in lrs × decays, each from the current weights,
    which are restored afterwards. A point is abandoned as diverged as soon as its running loss
    exceeds twice the larger of the static loss and the uniform distribution's (log V nats)."""
    progress = progress or NoProgress()
    trained = {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}
    with progress.stage("search: static", len(tokens)) as callback:
        static = score_tokens(
            model,
            tokens,
            batch_size=options.batch_size,
            bptt=options.segment,
            device=device,
            chars_per_token=chars_per_token,
            progress=lambda count: callback(count, 0.0),
            cuda_graph=cuda_graph,
        )
    hopeless_nats = 2 * max(static.loss, math.log(model.config.vocab_size))
    points = []
    for lr, decay in itertools.product(lrs, decays):
        point = dataclasses.replace(options, lr=lr, decay=decay)
        label = f"search: η={lr:g}" + (f" λ={decay:g}" if options.method == "rms" else "")
        try:
            with progress.stage(label, len(tokens)) as callback:
                score = dynamic_score(
                    model,
                    tokens,
                    make_update(model, point, rms),
                    segment=point.segment,
                    batch_size=point.batch_size,
                    device=device,
                    chars_per_token=chars_per_token,
                    progress=_abandoning_beyond(hopeless_nats, callback),
                )
            bpc = score.bpc
        except DynamicDiverged:
            bpc = math.inf
        points.append(SearchPoint(lr, decay, bpc))
        model.load_state_dict(trained)
    return SearchResult(points, static.bpc, len(tokens))


def check_protocol(split: str, adapt_on: str | None, search_prefix: int | None) -> None:
    if adapt_on is not None and adapt_on != "valid":
        raise CharlmError(f"--adapt-on must be valid, not {adapt_on!r}")
    if adapt_on == split:
        raise CharlmError(f"--adapt-on {adapt_on} adapts before scoring another split: use it with --split test")
    if search_prefix is not None and (
        isinstance(search_prefix, bool) or not isinstance(search_prefix, int) or not 2 <= search_prefix <= INT64_MAX
    ):  # Model.evaluate passes it unchecked
        raise CharlmError(
            f"--search-prefix must be a whole number of characters from 2 to {INT64_MAX}, not {search_prefix!r}"
        )


def _abandoning_beyond(nats_per_token: float, callback):
    """``callback``, raising DynamicDiverged once the running loss exceeds ``nats_per_token``."""
    seen_tokens, seen_nats = 0, 0.0

    def check(tokens: int, nats: float) -> None:
        nonlocal seen_tokens, seen_nats
        callback(tokens, nats)
        seen_tokens += tokens
        seen_nats += nats
        if seen_nats > nats_per_token * seen_tokens:
            raise DynamicDiverged(f"running loss above {nats_per_token:.3f} nats per token")

    return check


def evaluate_dynamic(
    model,
    corpus,
    split: str,
    options: DynamicOptions,
    *,
    adapt_on: str | None = None,
    search_prefix: int | None = None,
    device=None,
    progress=None,
    cuda_graph: bool = True,
) -> DynamicReport:
    """Static and dynamic scores of ``split`` (see the module docstring); leaves θ adapted.

    ``search_prefix`` (characters of the validation split) turns the grid search on;
    ``cuda_graph=False`` scores the static figures without a CUDA graph.
    """
    options.validate()
    check_protocol(split, adapt_on, search_prefix)
    check_splits_fit(corpus, (split, adapt_on), options.batch_size, DynamicOptions)
    prefix = None
    if search_prefix is not None:
        valid_chars_per_token = characters_per_token(corpus, "valid")
        prefix = corpus.split("valid")[: max(2, int(search_prefix / valid_chars_per_token) + 1)]
        check_streams_fit(
            options.batch_size,
            prefix,
            DynamicOptions,
            "batch_size",
            f"the search prefix ({search_prefix:,} characters of the valid split)",
        )
    progress = progress or NoProgress()
    tokens = corpus.split(split)
    chars_per_token = characters_per_token(corpus, split)

    started = time.perf_counter()
    with progress.stage(f"static {split}", len(tokens)) as callback:
        static = score_tokens(
            model,
            tokens,
            batch_size=options.batch_size,
            bptt=options.segment,
            device=device,
            chars_per_token=chars_per_token,
            progress=lambda count: callback(count, 0.0),
            cuda_graph=cuda_graph,
        )
    static_seconds = time.perf_counter() - started

    rms, statistics_seconds, statistics_batches = None, 0.0, 0
    if options.method == "rms":
        train = corpus.split("train")
        started = time.perf_counter()
        with progress.stage("gradient statistics (train)", statistics_tokens(train, options)) as callback:
            rms, statistics_batches = collect_gradient_statistics(
                model,
                train,
                segment=options.segment,
                batch_size=options.stat_batch_size,
                max_batches=options.stat_batches,
                device=device,
                progress=callback,
            )
        statistics_seconds = time.perf_counter() - started

    search = None
    if prefix is not None:
        search = grid_search(
            model,
            prefix,
            options,
            rms,
            lrs=SEARCH_LRS[options.method],
            decays=SEARCH_DECAYS[options.method],
            device=device,
            chars_per_token=valid_chars_per_token,
            progress=progress,
            cuda_graph=cuda_graph,
        )
        options = dataclasses.replace(options, lr=search.best.lr, decay=search.best.decay)
        for note in search.edge_notes():
            get_logger().warning(f"warning: --dyn-search: {note}")

    update = make_update(model, options, rms)
    adaptation, adaptation_seconds = None, 0.0
    if adapt_on is not None:
        started = time.perf_counter()
        adaptation_tokens = corpus.split(adapt_on)
        with progress.stage(f"adapt on {adapt_on}", len(adaptation_tokens)) as callback:
            adaptation = dynamic_score(
                model,
                adaptation_tokens,
                update,
                segment=options.segment,
                batch_size=options.batch_size,
                device=device,
                chars_per_token=characters_per_token(corpus, adapt_on),
                progress=callback,
            )
        adaptation_seconds = time.perf_counter() - started

    started = time.perf_counter()
    with progress.stage(f"dynamic {split}", len(tokens)) as callback:
        dynamic = dynamic_score(
            model,
            tokens,
            update,
            segment=options.segment,
            batch_size=options.batch_size,
            device=device,
            chars_per_token=chars_per_token,
            progress=callback,
        )
    dynamic_seconds = time.perf_counter() - started
    return DynamicReport(
        options,
        split,
        static,
        dynamic,
        static_seconds,
        dynamic_seconds,
        statistics_seconds,
        statistics_batches,
        adapt_on,
        adaptation,
        adaptation_seconds,
        search,
    )


# Command-line flags → DynamicOptions fields; the flags that only rms uses.
FIELDS_BY_FLAG = {
    "--dyn-lr": "lr",
    "--dyn-decay": "decay",
    "--dyn-eps": "eps",
    "--segment": "segment",
    "--batch-size": "batch_size",
    "--dyn-stat-batches": "stat_batches",
    "--dyn-stat-batch-size": "stat_batch_size",
}
RMS_ONLY_FLAGS = ("--dyn-decay", "--dyn-eps", "--dyn-stat-batches", "--dyn-stat-batch-size")
STATIC_TOO_FLAGS = ("--batch-size", "--bptt")


def resolve_options(method: str | None, given: dict, *, search: bool = False) -> DynamicOptions | None:
    """DynamicOptions from command-line values (flag → value, None or False where not given);
    None for static evaluation. Every option that makes no sense with the others is an error."""
    named = [flag for flag, value in given.items() if value is not None and value is not False]
    dynamic_only = [flag for flag in named if flag not in STATIC_TOO_FLAGS] + (["--dyn-search"] if search else [])
    check_method(method, dynamic_only)
    if method is None:
        return None
    if given.get("--bptt") is not None:
        raise CharlmError(
            "--bptt sets the windows of static evaluation; dynamic evaluation uses --segment for both figures"
        )
    for flag in named:
        if flag in RMS_ONLY_FLAGS and method != "rms":
            raise CharlmError(f"{flag} applies to --dynamic rms only")
    if search:
        for flag in ("--dyn-lr", "--dyn-decay"):
            if given.get(flag) is not None:
                raise CharlmError(f"--dyn-search chooses {flag}: give one or the other")
    elif given.get("--search-prefix") is not None:
        raise CharlmError("--search-prefix applies to --dyn-search only")
    values = {FIELDS_BY_FLAG[flag]: given[flag] for flag in named if flag in FIELDS_BY_FLAG}
    options = DynamicOptions(method=method, **values)
    options.validate()
    return options


def check_method(method: str | None, dynamic_only: list[str], *, purpose: str = "evaluation") -> None:
    """What every command with ``--dynamic`` checks first: the ``dynamic_only`` flags given need a
    method, and the method must be one of ``METHODS``."""
    if method is None and dynamic_only:
        raise CharlmError(f"{dynamic_only[0]} applies to dynamic {purpose}: add --dynamic sgd or --dynamic rms")
    if method is not None and method not in METHODS:
        taken = (
            f": it takes a method first, as in --dynamic sgd {method}" if method.startswith("-") else ""
        )  # an option
        raise CharlmError(f"--dynamic must be {' or '.join(METHODS)}, not {method!r}{taken}")


def check_adapted_path(path, source, force: bool = False) -> None:
    """Fail before the long evaluation, not after it, if the adapted checkpoint cannot be written, or
    would replace a file without ``force`` (as `charlm export` asks for --force)."""
    path = Path(path)
    if path.is_dir():
        raise CharlmError(f"--save-adapted {path} is a directory: give a file name such as {path / 'adapted.pt'}")
    if not path.parent.is_dir():
        raise CharlmError(f"--save-adapted {path}: the directory {path.parent} does not exist")
    if path.resolve() == Path(source).resolve():
        raise CharlmError(f"--save-adapted {path} would overwrite the evaluated checkpoint")
    if os.path.lexists(path) and not force:
        raise CharlmError(f"--save-adapted {path} exists: pass --force to replace it, or give another file name")


def adapted_checkpoint(model, report: DynamicReport):
    """The evaluated checkpoint with the adapted weights (a ``charlm.api.Model`` after
    ``evaluate(dynamic=...)``), loadable wherever the original is."""
    source = model.checkpoint.path
    dynamic = {
        "source": None if source is None else str(source),
        "split": report.split,
        "adapt_on": report.adapt_on,
        **report.options.hyperparameters(),
    }
    return model.current_checkpoint(kind="adapted", training=None, dynamic=dynamic)
