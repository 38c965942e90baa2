"""The `charlm` typer application: registers each command module and turns errors into one line."""

import sys

import typer

from charlm import __version__
from charlm.errors import CharlmError

app = typer.Typer(
    name="charlm",
    help="Character-level language modelling with recurrent networks.",
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)


def _show_version(value: bool):
    if value:
        typer.echo(f"charlm {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_show_version, is_eager=True, help="Print the version and exit."
    ),
):
    """Prepare corpora, train recurrent cells, evaluate bits per character, sample text."""


def _register_commands():
    from charlm.cli import bench, cells, demo, evaluate, prepare, sample, train

    for module in (prepare, cells, train, evaluate, sample, demo, bench):
        module.register(app)


_register_commands()


def main():
    try:
        app()
    except CharlmError as error:
        print(f"charlm: error: {error}", file=sys.stderr)
        sys.exit(error.exit_code)
