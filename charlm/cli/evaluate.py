"""`charlm eval`: bits per character and perplexity of a checkpoint on a split, static or dynamic."""

from __future__ import annotations

import contextlib
import math
import time
from pathlib import Path
from typing import Optional

import typer
from charlm.cli.output import print_table, stdout
from charlm.errors import CharlmError

STATIC_BATCH_SIZE = 16


def evaluate(
    checkpoint: Path = typer.Argument(..., help="A run directory (uses its best.pt) or a checkpoint file."),
    split: str = typer.Option("test", "--split", help="valid or test."),
    batch_size: Optional[int] = typer.Option(None, "--batch-size", help=f"Parallel streams; every symbol is scored once whatever the value (default: {STATIC_BATCH_SIZE} static, 1 dynamic (exact, in text order))."),
    bptt: Optional[int] = typer.Option(None, "--bptt", help="Static window length (default: the training bptt)."),
    dynamic: Optional[str] = typer.Option(None, "--dynamic", help="Also evaluate dynamically, adapting the weights test-then-train: sgd (Delta-RNN paper) or rms (Krause et al. 2018)."),
    adapt_on: Optional[str] = typer.Option(None, "--adapt-on", help="valid: adapt over the whole validation split first, then evaluate the test split from the adapted weights (#2)."),
    dyn_lr: Optional[float] = typer.Option(None, "--dyn-lr", help="Step size η (default: 0.01 sgd, 0.0001 rms)."),
    dyn_decay: Optional[float] = typer.Option(None, "--dyn-decay", help="rms: λ in [0, 1], the pull back towards the trained weights (default: 0.01)."),
    dyn_eps: Optional[float] = typer.Option(None, "--dyn-eps", help="rms: ε added to the RMS of the training gradients (default: 1e-05)."),
    segment: Optional[int] = typer.Option(None, "--segment", help="Steps per segment, one update after each (default: 20); the static figure uses the same segments."),
    dyn_stat_batches: Optional[int] = typer.Option(None, "--dyn-stat-batches", help="rms: collect gradient statistics on at most this many training batches (default: the whole training split)."),
    dyn_stat_batch_size: Optional[int] = typer.Option(None, "--dyn-stat-batch-size", help="rms: streams per training batch for the statistics (default: 100)."),
    dyn_search: bool = typer.Option(False, "--dyn-search", help="Grid-search η (and λ for rms) on a validation prefix, then evaluate with the best."),
    search_prefix: Optional[int] = typer.Option(None, "--search-prefix", help="Characters of the validation split the search scores (default: 50000)."),
    save_adapted: Optional[Path] = typer.Option(None, "--save-adapted", help="Write the adapted weights to this checkpoint file."),
    data_dir: Optional[Path] = typer.Option(None, "--data-dir", help="Root of prepared corpora (default: the one used in training)."),
    device: str = typer.Option("auto", "--device", help="auto, cpu or cuda."),
):
    """Report bits per character and perplexity over a whole split, state carried across windows;
    with --dynamic, the static and the dynamically evaluated figures side by side."""
    from charlm.dynamic_search import DEFAULT_SEARCH_PREFIX, check_protocol, resolve_options

    if split not in ("valid", "test", "train"):
        raise CharlmError(f"--split must be valid or test, not {split!r}")
    given = {"--batch-size": batch_size, "--bptt": bptt, "--adapt-on": adapt_on, "--dyn-lr": dyn_lr,
             "--dyn-decay": dyn_decay, "--dyn-eps": dyn_eps, "--segment": segment,
             "--dyn-stat-batches": dyn_stat_batches, "--dyn-stat-batch-size": dyn_stat_batch_size,
             "--search-prefix": search_prefix, "--save-adapted": save_adapted}
    options = resolve_options(dynamic, given, search=dyn_search)
    if options is None:
        _evaluate_static(checkpoint, split, batch_size or STATIC_BATCH_SIZE, bptt, data_dir, device)
        return
    prefix = (search_prefix or DEFAULT_SEARCH_PREFIX) if dyn_search else None
    check_protocol(split, adapt_on, prefix)
    _evaluate_dynamic(checkpoint, split, options, adapt_on, prefix, save_adapted, data_dir, device)


def _evaluate_static(checkpoint, split, batch_size, bptt, data_dir, device):
    from tqdm import tqdm

    from charlm.evaluation import corpus_for_checkpoint, score_split
    from charlm.runs import RunDirectory
    from charlm.sampling import load_model

    if batch_size < 1:
        raise CharlmError(f"--batch-size must be at least 1, not {batch_size}")
    model, _, payload = load_model(str(checkpoint), device)
    corpus = corpus_for_checkpoint(payload, data_dir)
    window = bptt or payload["config"]["bptt"]
    device_used = next(model.parameters()).device
    started = time.perf_counter()
    with tqdm(total=corpus.tokens(split), desc=f"eval {split}", unit="tok", unit_scale=True, leave=False, disable=None) as bar:
        score = score_split(model, corpus, split, batch_size=batch_size, bptt=window, device=device_used, progress=bar.update)
    chars_per_second = score.characters / (time.perf_counter() - started)
    unit = "bits per byte" if corpus.unit == "byte" else "bits per character"
    stdout.print(f"checkpoint      {payload['path']}")
    stdout.print(f"split           {corpus.name} {split} ({score.tokens:,} {corpus.unit} tokens scored)")
    stdout.print(f"bpc             {score.bpc:.4f} ({unit})")
    if corpus.unit == "subword":
        stdout.print(f"nll per token   {score.loss:.4f} nats")
    stdout.print(f"perplexity      {score.perplexity:.4f} (per {corpus.unit} token)")
    _record(payload, split=split, mode="static", chars_per_s=chars_per_second, **score.as_dict())


def _evaluate_dynamic(checkpoint, split, options, adapt_on, search_prefix, save_adapted, data_dir, device):
    from charlm.checkpoints import save_checkpoint
    from charlm.dynamic_search import adapted_checkpoint, check_adapted_path, evaluate_dynamic
    from charlm.evaluation import corpus_for_checkpoint
    from charlm.sampling import load_model

    model, _, payload = load_model(str(checkpoint), device)
    if save_adapted is not None:
        check_adapted_path(save_adapted, payload["path"])
    corpus = corpus_for_checkpoint(payload, data_dir)
    device_used = next(model.parameters()).device
    report = evaluate_dynamic(model, corpus, split, options, adapt_on=adapt_on, search_prefix=search_prefix,
                              device=device_used, progress=_ProgressBars("bits/token" if corpus.unit == "subword" else "bpc"))
    _print_dynamic(report, payload, corpus)
    if save_adapted is not None:
        save_checkpoint(save_adapted, adapted_checkpoint(payload, model, report))
        stdout.print(f"adapted weights {save_adapted}")
    _record(payload, **report.record_fields())


def _print_dynamic(report, payload, corpus):
    options = report.options
    settings = f"{options.method}: η={options.lr:g}"
    if options.method == "rms":
        settings += f" λ={options.decay:g} ε={options.eps:g}"
    settings += f", segment {options.segment}, batch {options.batch_size}"
    stdout.print(f"checkpoint      {payload['path']}")
    stdout.print(f"split           {corpus.name} {report.split} ({report.static.tokens:,} {corpus.unit} tokens scored)")
    stdout.print(f"dynamic         {settings}")
    if options.method == "rms":
        stdout.print(f"statistics      {report.statistics_batches:,} training batches of {options.stat_batch_size}×{options.segment} "
                     f"({report.statistics_seconds:.1f} s)")
    if report.adapt_on is not None:
        stdout.print(f"adapted on      {report.adapt_on} first (#2; its dynamic bpc {report.adaptation.bpc:.4f}, {report.adaptation_seconds:.1f} s)")
    if report.search is not None:
        search = report.search
        best = search.best
        columns = ["η", "λ", "bpc"] if options.method == "rms" else ["η", "bpc"]
        rows = []
        for point in search.points:
            cells = [f"{point.lr:g}"] + ([f"{point.decay:g}"] if options.method == "rms" else [])
            mark = " ←" if point is best else ""
            rows.append(cells + [("diverged" if math.isinf(point.bpc) else f"{point.bpc:.4f}") + mark])
        print_table(f"search on the first {search.tokens - 1:,} valid predictions (static bpc {search.static_bpc:.4f})", columns, rows)
    rows = [
        [name, f"{score.bpc:.4f}", f"{score.perplexity:.4f}", f"{chars_per_second:,.0f}"]
        for name, score, chars_per_second in (
            ("static", report.static, report.static_chars_per_second),
            (f"dynamic {options.method}", report.dynamic, report.dynamic_chars_per_second),
        )
    ]
    unit = "bits per byte" if corpus.unit == "byte" else "bpc"
    print_table(None, ["mode", unit, f"perplexity (per {corpus.unit})", "chars/s"], rows)


def _record(payload, **fields):
    from charlm.runs import RunDirectory

    run = RunDirectory(Path(payload["path"]).parent)
    if run.metrics.exists():
        run.record("eval", **{"checkpoint": payload["path"], **fields})


class _ProgressBars:
    """One tqdm bar (stderr) per stage of the protocol, with the running bits per symbol."""

    def __init__(self, unit: str):
        self.unit = unit

    @contextlib.contextmanager
    def stage(self, label: str, total: int):
        from tqdm import tqdm

        with tqdm(total=total, desc=label, unit="tok", unit_scale=True, leave=False, disable=None) as bar:
            seen = {"tokens": 0, "nats": 0.0}

            def callback(tokens: int, nats: float) -> None:
                seen["tokens"] += tokens
                seen["nats"] += nats
                if seen["nats"]:
                    bar.set_postfix_str(f"{self.unit} {seen['nats'] / math.log(2) / seen['tokens']:.3f}", refresh=False)
                bar.update(tokens)

            yield callback


def register(app: typer.Typer) -> None:
    app.command(name="eval")(evaluate)
