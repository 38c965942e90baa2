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
import time

import numpy as np

from charlm.config_inference import DynamicOptions
from charlm.inference.dynamic import DynamicDiverged, collect_gradient_statistics, dynamic_score, make_update
from charlm.logs import get_logger
from charlm.inference.dynamic_options import check_protocol
from charlm.settings import flag_of
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
