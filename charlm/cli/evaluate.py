"""`charlm eval`: bits per character and perplexity of a checkpoint on a split, static or dynamic."""

from __future__ import annotations

import math
from typing import Optional

import typer

from charlm.cli.loading import CELL, CHECKPOINT, DATA_DIR, DEVICE, NO_CUDA_GRAPH, TRUST_CODE, load_model
from charlm.cli.options import dynamic_option, settings_options
from charlm.cli.output import print_table, stdout
from charlm.config_inference import DEFAULT_SEARCH_PREFIX, DynamicOptions, EvalConfig
from charlm.logs import ProgressBars, progress_bar
from charlm.settings import flag_of, validate


@settings_options(DynamicOptions, into="dyn")
@settings_options(EvalConfig, into="static", exclude=("batch_size",))
def evaluate(
    checkpoint: str = CHECKPOINT,
    batch_size: Optional[int] = typer.Option(
        None,
        "--batch-size",
        help=(
            "Parallel streams; every symbol is scored once whatever the value. Must be at least 1. (default: "
            f"{EvalConfig.batch_size} static, {DynamicOptions.batch_size} dynamic (exact, in text order))."
        ),
    ),
    dynamic: Optional[str] = typer.Option(
        None,
        "--dynamic",
        callback=dynamic_option,
        help="Also evaluate dynamically, adapting the weights test-then-train: sgd (Delta-RNN paper) or rms (Krause "
        "et al. 2018).",
    ),
    adapt_on: Optional[str] = typer.Option(
        None,
        "--adapt-on",
        help="valid: adapt over the whole validation split first, then evaluate the test split from the adapted "
        "weights (#2).",
    ),
    dyn_search: bool = typer.Option(
        False, "--dyn-search", help="Grid-search η (and λ for rms) on a validation prefix, then evaluate with the best."
    ),
    search_prefix: Optional[int] = typer.Option(
        None,
        "--search-prefix",
        help=f"Characters of the validation split the search scores (default: {DEFAULT_SEARCH_PREFIX}).",
    ),
    save_adapted: Optional[str] = typer.Option(
        None, "--save-adapted", help="Write the adapted weights to this checkpoint file.", metavar="<path>"
    ),
    force: bool = typer.Option(False, "--force", help="Let --save-adapted replace a file that exists."),
    data_dir: Optional[str] = DATA_DIR,
    device: str = DEVICE,
    cell: Optional[str] = CELL,
    trust_code: bool = TRUST_CODE,
    no_cuda_graph: bool = NO_CUDA_GRAPH,
    static: dict = None,
    dyn: dict = None,
):
    """Report bits per character and perplexity over a whole split, state carried across windows;
    with --dynamic, the static and the dynamically evaluated figures side by side."""
    from charlm.inference.dynamic_options import check_protocol, resolve_options

    validate(EvalConfig(**static, **({} if batch_size is None else {"batch_size": batch_size})))  # its declared bounds
    split = static.get("split", EvalConfig.split)
    given = {
        "--batch-size": batch_size,
        "--bptt": static.get("bptt"),
        "--adapt-on": adapt_on,
        "--search-prefix": search_prefix,
        "--save-adapted": save_adapted,
        "--force": force,
        **{flag_of(DynamicOptions, name): value for name, value in dyn.items()},
    }
    options = resolve_options(dynamic, given, search=dyn_search)
    prefix = (
        (DEFAULT_SEARCH_PREFIX if search_prefix is None else search_prefix) if dyn_search else None
    )  # 0 is refused, not the default
    if options is not None:
        check_protocol(split, adapt_on, prefix)
    model = load_model(checkpoint, device, cell, trust_code, no_cuda_graph)
    if options is None:
        _evaluate_static(model, split, batch_size, static.get("bptt"), data_dir)
    else:
        _evaluate_dynamic(model, split, options, adapt_on, prefix, save_adapted, data_dir, force)


def _evaluate_static(model, split, batch_size, bptt, data_dir):
    corpus = model.corpus(data_dir)
    with progress_bar(corpus.tokens(split), f"eval {split}", scale=True) as bar:
        score = model.evaluate(split, data_dir=data_dir, batch_size=batch_size, bptt=bptt, progress=bar.update)
    unit = "bits per byte" if corpus.unit == "byte" else "bits per character"
    stdout.print(f"checkpoint      {model.checkpoint.path}")
    stdout.print(f"split           {corpus.name} {split} ({score.tokens:,} {corpus.unit} tokens scored)")
    stdout.print(f"bpc             {score.bpc:.4f} ({unit})")
    if corpus.unit in ("subword", "word"):
        stdout.print(f"nll per token   {score.loss:.4f} nats (per {corpus.unit})")
    stdout.print(f"perplexity      {score.perplexity:.4f} (per {corpus.unit} token)")
    _print_fast_path(model)


def _print_fast_path(model):
    """On a GPU, what the scoring graph's first-use check found."""
    if model.last_fast_path is not None:
        stdout.print(f"fast path       {model.last_fast_path.summary()}")


def _evaluate_dynamic(model, split, options, adapt_on, search_prefix, save_adapted, data_dir, force=False):
    from charlm.inference.dynamic_options import check_adapted_path
    from charlm.inference.dynamic_protocol import adapted_checkpoint

    if save_adapted is not None:
        check_adapted_path(save_adapted, model.checkpoint.path, force)
    corpus = model.corpus(data_dir)
    report = model.evaluate(
        split,
        dynamic=options,
        data_dir=data_dir,
        adapt_on=adapt_on,
        search_prefix=search_prefix,
        progress=ProgressBars("bits/token" if corpus.unit in ("subword", "word") else "bpc"),
    )
    _print_dynamic(report, model.checkpoint.path, corpus)
    _print_fast_path(model)
    if save_adapted is not None:
        adapted_checkpoint(model, report).save(save_adapted)
        stdout.print(f"adapted weights {save_adapted}")


def _print_dynamic(report, path, corpus):
    options = report.options
    settings = f"{options.method}: η={options.lr:g}"
    if options.method == "rms":
        settings += f" λ={options.decay:g} ε={options.eps:g}"
    settings += f", segment {options.segment}, batch {options.batch_size}"
    stdout.print(f"checkpoint      {path}")
    stdout.print(f"split           {corpus.name} {report.split} ({report.static.tokens:,} {corpus.unit} tokens scored)")
    stdout.print(f"dynamic         {settings}")
    if options.method == "rms":
        stdout.print(
            f"statistics      {report.statistics_batches:,} training batches of "
            f"{options.stat_batch_size}×{options.segment} "
            f"({report.statistics_seconds:.1f} s)"
        )
    if report.adapt_on is not None:
        stdout.print(
            f"adapted on      {report.adapt_on} first (#2; its dynamic bpc {report.adaptation.bpc:.4f}, "
            f"{report.adaptation_seconds:.1f} s)"
        )
    if report.search is not None:
        search = report.search
        best = search.best
        columns = ["η", "λ", "bpc"] if options.method == "rms" else ["η", "bpc"]
        rows = []
        for point in search.points:
            cells = [f"{point.lr:g}"] + ([f"{point.decay:g}"] if options.method == "rms" else [])
            mark = " ←" if point is best else ""
            rows.append(cells + [("diverged" if math.isinf(point.bpc) else f"{point.bpc:.4f}") + mark])
        print_table(
            f"search on the first {search.tokens - 1:,} valid predictions (static bpc {search.static_bpc:.4f})",
            columns,
            rows,
        )
    rows = [
        [name, f"{score.bpc:.4f}", f"{score.perplexity:.4f}", f"{chars_per_second:,.0f}"]
        for name, score, chars_per_second in (
            ("static", report.static, report.static_chars_per_second),
            (f"dynamic {options.method}", report.dynamic, report.dynamic_chars_per_second),
        )
    ]
    unit = "bits per byte" if corpus.unit == "byte" else "bpc"
    print_table(None, ["mode", unit, f"perplexity (per {corpus.unit})", "chars/s"], rows)


def register(app: typer.Typer) -> None:
    app.command(name="eval")(evaluate)
