"""The `charlm` typer application: registers each command module and turns errors into one line."""

from __future__ import annotations

import os
import sys
import traceback

import typer
import typer.main
from rich.table import Table
from rich.text import Text
from typer import core

from charlm import __version__
from charlm.cli import (
    bench,
    cells,
    check,
    demo,
    evaluate,
    export,
    prepare,
    report,
    runs,
    sample,
    score,
    serve,
    sweep,
    task,
    train,
)
from charlm.errors import OUT_OF_MEMORY_ADVICE, CharlmError, ConfigError, NoCheckpoint, OutOfMemory, out_of_memory
from charlm.files import access_error
from charlm.logs import use_default_handler
from charlm.runtime.openmp import set_threads
from charlm.settings import flag_of

app = typer.Typer(
    name="charlm",
    help="Character-level language modelling with recurrent networks.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)


def _keep_option_names_whole() -> None:
    """The one change to typer's --help (neither typer nor rich has a setting for it; the tests of
    tests/cli/test_cli_help.py fail when a typer release breaks it). Typer's tables let every column wrap:
    at 80 columns, once the help text is as narrow as the longest flag, rich narrows both and cuts the
    flag (``--no-test-every-epo…``). Here only the last two columns of a row (an option's type and help
    text; a command's help) may wrap, folding a word too long for them rather than cutting it: the option
    names and flags before them stay whole. Each name of an option is on a line of its own (``--hidden``
    above ``--hidden-size``, ``--wavefront`` above ``--no-wavefront``), and a flag shows no type (typer
    0.29 labels it ``<bool>`` as if it took a value), so that the names take one narrow column and leave
    the room to the help. Installed when a help is first shown (typer.rich_utils takes a while to import)."""

    def install():
        from typer import rich_utils

        class HelpTable(Table):
            def add_row(self, *renderables, **options):
                if len(renderables) >= 6:  # an option's row: [required,] names, short names, off-flags, ..., type, help
                    *required, names, short, off, off_short, kind, help = renderables
                    kind = Text("") if isinstance(kind, Text) and kind.plain == "<bool>" else kind  # a flag's
                    renderables = (*required, _one_name_a_line(names, off), short, off_short, kind, help)
                super().add_row(*renderables, **options)
                for column in self.columns[:-2]:
                    column.no_wrap = True
                for column in self.columns[-2:]:
                    column.overflow = "fold"

        if getattr(rich_utils, "Table", None) is Table:
            rich_utils.Table = HelpTable

    for kind in (core.TyperCommand, core.TyperGroup):

        def format_help(self, ctx, formatter, shown=kind.format_help):
            install()
            return shown(self, ctx, formatter)

        kind.format_help = format_help


def _one_name_a_line(*cells: Text) -> Text:
    """The names of an option's cells (typer joins them with commas), one a line, their styles kept."""
    return Text("\n").join(part for cell in cells for part in cell.split(",") if part.plain)


_keep_option_names_whole()


def _show_version(value: bool):
    if value:
        typer.echo(f"charlm {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    context: typer.Context,
    version: bool = typer.Option(
        False, "--version", callback=_show_version, is_eager=True, help="Print the version and exit."
    ),
    threads: int = typer.Option(
        None,
        "--threads",
        envvar="CHARLM_THREADS",
        show_default=False,
        help="CPU threads for torch (default: torch's choice, the number of cores). "
        "On a busy machine, 1 is often faster for small models.",
    ),
):
    """Prepare corpora, train recurrent cells, evaluate bits per character, sample text."""
    if threads is not None:
        source = context.get_parameter_source("threads")
        set_threads(threads, "CHARLM_THREADS" if source is not None and source.name == "ENVIRONMENT" else "--threads")


def _register_commands():
    for module in (
        prepare,
        cells,
        train,
        task,
        evaluate,
        score,
        sample,
        runs,
        report,
        export,
        demo,
        bench,
        check,
        sweep,
        serve,
    ):
        module.register(app)


_register_commands()


def error_line(error: BaseException) -> str:
    """The one line a user sees; library field names become the flags of the command line."""
    if isinstance(error, ConfigError):
        return f"{flag_of(error.owner, error.field)} {error.reason}"
    if isinstance(error, NoCheckpoint):
        from charlm.runs.first_save import explained

        error = explained(error)
    if _is_click_error(error):
        return error.format_message().replace("\n", " ")
    return " ".join(str(error).split("\n"))


def run(argv: list[str] | None = None) -> int:
    """Run the command line in this process; returns the exit code. Errors print one line."""
    use_default_handler()  # follows sys.stderr, also when a caller redirects it around run()
    _replace_what_cannot_be_encoded()
    argv = sys.argv[1:] if argv is None else argv
    if not argv:  # bare `charlm`: the help, and nothing wrong
        argv = ["--help"]
    command = None
    try:
        command = typer.main.get_command(app)
        result = command(args=argv, prog_name="charlm", standalone_mode=False)
    except CharlmError as error:
        if isinstance(error, OutOfMemory):  # told by charlm.load in Python's names: in the command's
            error = error.advised(_memory_advice(command, argv))
        print(f"charlm: error: {error_line(error)}", file=sys.stderr)
        return error.exit_code
    except KeyboardInterrupt:
        print("charlm: error: interrupted", file=sys.stderr)
        return 130
    except OSError as error:  # writes fail as WriteError (a CharlmError): this is a path that cannot be used
        problem = access_error(error)
        print(f"charlm: error: {problem}", file=sys.stderr)
        return problem.exit_code
    except Exception as error:
        if type(error).__name__ == "Abort":
            print("charlm: error: interrupted", file=sys.stderr)
            return 130
        if _is_click_error(error):
            print(f"charlm: error: {error_line(error)}", file=sys.stderr)
            return error.exit_code
        problem = out_of_memory(error, _memory_advice(command, argv))  # one line, as the checks before a run give
        if problem is None:
            return _internal_error(error)
        print(f"charlm: error: {problem}", file=sys.stderr)
        return problem.exit_code
    return result if isinstance(result, int) else 0


# What to make smaller when memory runs out, by command: options it has (others get the default advice).
MEMORY_ADVICE = {
    "train": "use a smaller --batch-size (or --hidden, --bptt)",
    "task": "use a smaller --batch-size (or --hidden, --eval-samples)",
    "bench": "use a smaller --batch-size (or --bptt, --params)",
    "eval": "use a smaller --batch-size (or --bptt, --dyn-stat-batch-size)",
    "score": "use a smaller --batch-size (or --dyn-stat-batch-size)",
    "sample": "the model does not fit: use another --device (or a smaller --beam)",
    "serve": "the models do not fit: use another --device (or a smaller --max-beam, --concurrency)",
    "sweep": "give the plan a smaller batch_size (or hidden_size, bptt)",
}


def _memory_advice(command, argv: list[str]) -> str:
    """What the command that ``argv`` runs (its first word that names one) can make smaller when memory
    runs out; for the others, charlm's default advice."""
    names = getattr(command, "commands", {})
    name = next((word for word in argv if word in names), None)
    return MEMORY_ADVICE.get(name, OUT_OF_MEMORY_ADVICE)


INTERNAL_ERROR = 70  # EX_SOFTWARE (sysexits.h): an exception charlm did not expect, a bug


def _internal_error(error: Exception) -> int:
    """An exception nobody expected: one line saying so (the traceback with ``CHARLM_DEBUG=1``)."""
    if os.environ.get("CHARLM_DEBUG", "") not in ("", "0"):
        traceback.print_exception(type(error), error, error.__traceback__, file=sys.stderr)
    message = " ".join(str(error).split())
    print(
        f"charlm: internal error: {type(error).__name__}: {message} (a bug; CHARLM_DEBUG=1 shows the traceback)",
        file=sys.stderr,
    )
    return INTERNAL_ERROR


def _replace_what_cannot_be_encoded() -> None:
    """Where stdout or stderr cannot encode a character (PYTHONIOENCODING=ascii, a Latin-1 terminal),
    print a replacement (``?``) instead of failing: sampled text and file names hold any character."""
    for stream in (sys.stdout, sys.stderr):
        if getattr(stream, "errors", None) == "strict" and hasattr(stream, "reconfigure"):
            try:
                stream.reconfigure(errors="replace")
            except (ValueError, OSError):  # closed, or a stream that cannot change
                pass


def _is_click_error(error: BaseException) -> bool:
    """A usage error from click, or from the copy of click that newer typer versions carry."""
    return hasattr(error, "format_message") and isinstance(getattr(error, "exit_code", None), int)


def main():
    sys.exit(run())
