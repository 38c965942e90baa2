"""The scoring side of the ``charlm.api.Model`` facade: a text's bits per character (static or
dynamic, test-then-train) and a split's evaluation, as ``Model.score`` and ``Model.evaluate`` run them."""

from __future__ import annotations

import dataclasses
import time

import numpy as np

from charlm.config_inference import DynamicOptions, EvalConfig, ScoreConfig
from charlm.corpora.streams import check_streams_fit
from charlm.errors import CharlmError
from charlm.inference.dynamic import collect_gradient_statistics, dynamic_score, make_update
from charlm.inference.dynamic_protocol import NoProgress, evaluate_dynamic, statistics_tokens
from charlm.inference.scoring import LN2, Score, check_splits_fit, score_split, score_tokens
from charlm.runs.directory import Run
from charlm.settings import validate

_EVAL = EvalConfig()


@dataclasses.dataclass
class TextScore:
    """The score of a text: every token after the first predicted from the ones before it."""

    nats: float  # total negative log-likelihood
    tokens: int  # predictions scored
    characters: int  # characters (bytes for a byte model) those predictions cover
    skipped: int = 0  # characters left out (unknown="skip")
    symbols: list[str] | None = None  # with per_char: the predicted symbols, in order
    log_probs: np.ndarray | None = None  # with per_char: their natural-log probabilities

    @property
    def bpc(self) -> float:
        return self.nats / LN2 / self.characters

    @property
    def perplexity(self) -> float:
        """Per token."""
        return Score(self.nats, self.tokens, self.characters).perplexity


def score_text(model, text, *, per_char, unknown, dynamic, batch_size, data_dir, progress) -> TextScore:
    """``Model.score``: see there."""
    validate(ScoreConfig(unknown=unknown, batch_size=batch_size))
    if progress is not None and not hasattr(progress, "stage"):
        raise CharlmError(f"progress must be an object with stage(label, total), not {progress!r}")
    progress = progress or NoProgress()
    text = model.normalise(text)
    ids, skipped = model.encode(text, unknown)
    if len(ids) < 2:
        raise CharlmError("the text is too short to score: it needs at least two symbols")
    characters = len(text) - skipped - len(model.tokenizer.decode(ids[:1]))
    if model.unit == "byte":
        characters = len(model.tokenizer.decode(ids[1:]).encode("utf-8")) if characters else 0
    tokens = np.asarray(ids, dtype=np.int64)
    check_streams_fit(batch_size, tokens, ScoreConfig, "batch_size", "the text")
    chars_per_token = max(characters, 1) / (len(ids) - 1)
    if dynamic is None:
        bptt = model.checkpoint.train_config.bptt
        with progress.stage("score", len(tokens) - 1) as callback:
            score = score_tokens(
                model.network,
                tokens,
                batch_size=batch_size,
                bptt=bptt,
                device=model.device,
                chars_per_token=chars_per_token,
                per_token=per_char,
                cuda_graph=model.cuda_graphs,
                progress=lambda count: callback(count, 0.0),
            )
        model.last_fast_path = score.fast_path
    else:
        score = score_dynamically(model, tokens, dynamic, batch_size, chars_per_token, per_char, data_dir, progress)
    result = TextScore(score.nats, score.tokens, max(characters, 1), skipped)
    if per_char:
        result.symbols = [model.tokenizer.decode([token]) for token in ids[1:]]
        result.log_probs = -score.token_nats
    return result


def score_dynamically(model, tokens, dynamic, batch_size, chars_per_token, per_token, data_dir, progress) -> Score:
    """``tokens`` scored test-then-train under ``dynamic``; the model's weights are put back afterwards."""
    options = dynamic_options(dynamic)
    options = dataclasses.replace(options, batch_size=batch_size)
    options.validate()
    train = model.corpus(data_dir).split("train") if options.method == "rms" else ()
    trained = {name: tensor.detach().clone() for name, tensor in model.network.state_dict().items()}
    try:
        rms = None
        if options.method == "rms":
            with progress.stage("gradient statistics (train)", statistics_tokens(train, options)) as callback:
                rms, _ = collect_gradient_statistics(
                    model.network,
                    train,
                    segment=options.segment,
                    batch_size=options.stat_batch_size,
                    max_batches=options.stat_batches,
                    device=model.device,
                    progress=callback,
                )
        update = make_update(model.network, options, rms)
        with progress.stage(f"score, dynamic {options.method}", len(tokens) - 1) as callback:
            return dynamic_score(
                model.network,
                tokens,
                update,
                segment=options.segment,
                batch_size=batch_size,
                device=model.device,
                chars_per_token=chars_per_token,
                per_token=per_token,
                progress=callback,
            )
    finally:
        model.network.load_state_dict(trained)


def evaluate_split(model, split, *, dynamic, data_dir, batch_size, bptt, adapt_on, search_prefix, progress, record):
    """``Model.evaluate``: see there."""
    validate(EvalConfig(split=split))  # valid or test, as `charlm eval`: the training split is not a score
    if progress is not None and not (callable(progress) if dynamic is None else hasattr(progress, "stage")):
        wanted = "a callable, progress(tokens)" if dynamic is None else "an object with stage(label, total)"
        raise CharlmError(f"progress must be {wanted}, not {progress!r}")
    corpus = model.corpus(data_dir)
    if dynamic is None:
        config = EvalConfig(split="test", batch_size=_EVAL.batch_size if batch_size is None else batch_size, bptt=bptt)
        validate(config)
        check_splits_fit(corpus, (split,), config.batch_size, EvalConfig)
        bptt = bptt or model.checkpoint.train_config.bptt
        started = time.perf_counter()
        score = score_split(
            model.network,
            corpus,
            split,
            batch_size=config.batch_size,
            bptt=bptt,
            device=model.device,
            progress=progress,
            cuda_graph=model.cuda_graphs,
        )
        model.last_fast_path = score.fast_path
        if record:
            record_eval(
                model,
                split=split,
                mode="static",
                chars_per_s=score.characters / (time.perf_counter() - started),
                fast_path=None if score.fast_path is None else score.fast_path.fields(),
                **score.as_dict(),
            )
        return score
    options = dynamic_options(dynamic)
    if batch_size is not None:
        options = dataclasses.replace(options, batch_size=batch_size)
    report = evaluate_dynamic(
        model.network,
        corpus,
        split,
        options,
        adapt_on=adapt_on,
        search_prefix=search_prefix,
        device=model.device,
        progress=progress,
        cuda_graph=model.cuda_graphs,
    )
    model.last_fast_path = report.static.fast_path
    if record:
        fast_path = None if report.static.fast_path is None else report.static.fast_path.fields()
        record_eval(model, **report.record_fields(), fast_path=fast_path)
    return report


def record_eval(model, **fields) -> None:
    """An ``eval`` record in the run's metrics.jsonl, if the model's checkpoint is in a run."""
    path = model.checkpoint.path
    if path is not None and (path.parent / "metrics.jsonl").exists():
        Run(path.parent).record("eval", checkpoint=str(path), **fields)


def dynamic_options(dynamic) -> DynamicOptions:
    """``dynamic`` as given to ``score`` or ``evaluate``: "sgd" or "rms" (that method's defaults) or DynamicOptions."""
    if isinstance(dynamic, str):
        return DynamicOptions(method=dynamic)
    if not isinstance(dynamic, DynamicOptions):
        raise CharlmError(f"dynamic must be 'sgd', 'rms' or a charlm.DynamicOptions, not {dynamic!r}")
    return dynamic


def first_position(text: str, symbols) -> str:
    """``line L, column C`` of the first of ``symbols`` (characters, or whole words) in ``text``."""
    found = [index for index in (text.find(symbol) for symbol in symbols) if index >= 0]
    if not found:
        return ""
    index = min(found)
    line = text.count("\n", 0, index) + 1
    column = index - (text.rfind("\n", 0, index) + 1) + 1
    return f"line {line}, column {column}"
