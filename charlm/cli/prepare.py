"""`charlm prepare` and `charlm corpora`: thin commands over ``charlm.corpora``.

Results go to stdout; progress bars and diagnostics to stderr.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import typer

from charlm.cli.completion import complete_recipes
from charlm.cli.options import directory_flag, help_text
from charlm.cli.output import print_table
from charlm.config_tools import PrepareConfig
from charlm.settings import validate
from charlm.corpora.root import data_root
from charlm.corpora.splits import SPLITS, parse_fractions

if TYPE_CHECKING:
    from charlm.corpora.store import PreparedCorpus


def prepare(
    corpus: str = typer.Argument(
        ...,
        help="Corpus to prepare: ptb, ptb-contiguous, ptb-word, ptb-subword, wp, shakespeare, "
        "shakespeare-nanogpt, text8, enwik8, imdb-subword, pydoc, or `text` for "
        "your own files (see `charlm corpora`).",
        autocompletion=complete_recipes,
    ),
    paths: Optional[list[str]] = typer.Argument(None, help="For `text`: UTF-8 files or directories, read in order."),
    source: Optional[str] = typer.Option(
        None,
        "--source",
        help="Prepare from a local copy instead of downloading: "
        "the archive itself, or a directory or file holding its members.",
        metavar="<path>",
    ),
    url: Optional[str] = typer.Option(
        None, "--url", help="Download from this address (a mirror) instead of the canonical one."
    ),
    data_dir: Optional[str] = directory_flag(
        "--data-dir", "Data root for prepared corpora and the download cache (default: $CHARLM_DATA, else ./data)."
    ),
    subword: Optional[str] = typer.Option(
        None,
        "--subword",
        help="Train a sentencepiece model on the training "
        "split: bpe or unigram. A character corpus becomes <corpus>-<kind><N>.",
    ),
    vocab_size: int = typer.Option(
        PrepareConfig.vocab_size, "--vocab-size", help=help_text(PrepareConfig, "vocab_size"), show_default=False
    ),
    name: Optional[str] = typer.Option(None, "--name", help="Name of the prepared corpus (required for `text`)."),
    force: bool = typer.Option(
        False,
        "--force",
        help="Let --name be the name of a built-in corpus (see `charlm "
        "corpora`): what is prepared replaces it in the data root.",
    ),
    split: Optional[str] = typer.Option(
        None, "--split", help="For `text`: train,valid,test fractions, contiguous (default 0.9,0.05,0.05)."
    ),
    no_verify: bool = typer.Option(
        False,
        "--no-verify",
        help="Use files whose size or checksum differ from the published ones (with a warning) instead of stopping.",
    ),
    unknown: Optional[str] = typer.Option(
        None,
        "--unknown",
        help="Valid/test symbols absent from the training split (default: error; unk for pydoc): "
        "`error` stops, `unk` maps them to an <unk> entry.",
    ),
    quiet: bool = typer.Option(
        False, "--quiet", "-q", help="No progress bars or progress messages (warnings and errors still go to stderr)."
    ),
):
    """Download (or read from --source), verify, split and encode a corpus into the data root."""
    from charlm.corpora import prepare_corpus

    validate(PrepareConfig(vocab_size=vocab_size))  # its declared bounds
    prepared = prepare_corpus(
        corpus,
        data_dir=data_dir,
        source=source,
        url=url,
        verify=not no_verify,
        subword=subword,
        vocab_size=vocab_size,
        paths=paths or None,
        output_name=name,
        split=parse_fractions(split) if split is not None else None,
        unknown=unknown,
        progress=not quiet,
        force=force,
    )
    typer.echo(summary(prepared))


def summary(corpus: PreparedCorpus) -> str:
    """``ptb: 5,017,482 / 393,042 / 442,423 tokens (train / valid / test), char vocabulary 50, in data/ptb``."""
    tokens = " / ".join(f"{corpus.tokens(s):,}" for s in SPLITS)
    text = f"{corpus.name}: {tokens} tokens (train / valid / test), {corpus.unit} vocabulary {corpus.vocab_size:,}"
    if corpus.unit == "subword":
        characters = " / ".join(f"{corpus.characters(s):,}" for s in SPLITS)
        text += f", {characters} characters"
    return f"{text}, in {corpus.path}"


def corpora(
    data_dir: Optional[str] = directory_flag(
        "--data-dir", "Data root to look in (default: $CHARLM_DATA, else ./data)."
    ),
):
    """List the known corpora, and which are prepared with their split sizes and vocabulary.

    A corpus prepared from inputs whose checksums were not enforced (--no-verify) is marked unverified.
    """
    from charlm.corpora import list_corpora

    rows = []
    for entry in list_corpora(data_dir):
        corpus = entry.corpus
        if corpus is None:
            rows.append([entry.name, "no", entry.unit, "", "", "", "", entry.description])
        else:
            sizes = [f"{corpus.tokens(s):,}" for s in SPLITS]
            prepared = "yes" if corpus.verified else "yes, unverified"
            rows.append([entry.name, prepared, corpus.unit, f"{corpus.vocab_size:,}", *sizes, entry.description])
    print_table(
        f"corpora in {data_root(data_dir)}/",
        ["corpus", "prepared", "unit", "vocab", *SPLITS, "description"],
        rows,
        drop_order=("valid", "test", "vocab", "unit", "train"),
        wrap=("description",),
    )


def register(app):
    app.command("prepare")(prepare)
    app.command("corpora")(corpora)
