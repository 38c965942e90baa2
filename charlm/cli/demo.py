"""`charlm demo`: the whole pipeline on the embedded corpus in a couple of minutes."""

from __future__ import annotations

import sys
from typing import Optional

import typer

from charlm.cli.options import directory_flag, settings_options
from charlm.cli.output import print_summary
from charlm.config_tools import DemoConfig
from charlm.settings import validate


@settings_options(DemoConfig)
def demo(
    data_dir: Optional[str] = directory_flag(
        "--data-dir", "Root of prepared corpora (default: $CHARLM_DATA or ./data)."
    ),
    run_dir: Optional[str] = directory_flag("--run-dir", "Where to write the run (default: runs/pydoc-lru-demo-TIME)."),
    given: dict = None,
):
    """Prepare the embedded `pydoc` corpus, size a small LRU to this machine and train it for the budget, report bits per character, sample."""  # noqa: E501  the help shows the docstring's line breaks
    from charlm.tools.demo import run_demo

    def write(text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()

    config = DemoConfig(**given)
    validate(config)
    summary = run_demo(config, data_dir=data_dir, run_dir=run_dir, write=write)
    sys.stdout.write("\n\n")
    print_summary(summary)


def register(app: typer.Typer) -> None:
    app.command()(demo)
