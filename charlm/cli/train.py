"""`charlm train`: settings from the options (built from TrainConfig), a config file, or a run to resume."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from charlm.cli.options import settings_options
from charlm.cli.output import print_summary
from charlm.config import TrainConfig, RESUMABLE_SETTINGS
from charlm.errors import CharlmError
from charlm.settings import flag_of, read_config_file


@settings_options(TrainConfig)
def train(
    cell_opt: Optional[List[str]] = typer.Option(
        None, "--cell-opt", help="Cell option key=value (repeatable), e.g. --cell-opt peephole=diagonal."
    ),
    resume: Optional[str] = typer.Option(
        None, "--resume", help="Continue the run in this directory from its last checkpoint.", metavar="<path>"
    ),
    config: Optional[str] = typer.Option(
        None,
        "--config",
        help='JSON file of settings (keys as the options, e.g. "cell_options"); options given here win.',
        metavar="<path>",
    ),
    trust_code: bool = typer.Option(
        False,
        "--trust-code",
        help="Allow a --config file or a resumed checkpoint to import the module of its module:Class cell.",
    ),
    given: dict = None,
):
    """Train a recurrent language model with truncated BPTT; keeps best.pt and last.pt."""
    from charlm.cells import parse_key_values
    from charlm.training.resume import fixed_settings, run_to_go_on_with
    from charlm.training.setup import settings_from_init
    from charlm.training.run_inputs import new_run_inputs
    from charlm.training.trainer import Trainer

    if resume is not None:
        named_cell = given.pop("cell", None)
        fixed = fixed_settings(given)
        if fixed or cell_opt or config:
            flag = flag_of(TrainConfig, fixed[0]) if fixed else ("--cell-opt" if cell_opt else "--config")
            raise CharlmError(
                f"{flag} cannot change a run being resumed (only "
                f"{', '.join(flag_of(TrainConfig, n) for n in RESUMABLE_SETTINGS)} can)"
            )
        trainer = Trainer.resume(resume, cells=[named_cell] if named_cell else [], trust_code=trust_code, **given)
    else:
        settings = read_config_file(config) if config is not None else {}
        cell_from_file = settings.get("cell")
        if isinstance(cell_from_file, str) and ":" in cell_from_file and "cell" not in given and not trust_code:
            raise CharlmError(
                f"config file {config} asks to import module {cell_from_file.partition(':')[0]!r} for its cell "
                f"{cell_from_file!r}; charlm never runs code named in a file: pass --cell {cell_from_file} "
                "or --trust-code"
            )
        settings.update({key: str(value) if isinstance(value, Path) else value for key, value in given.items()})
        checked = TrainConfig.from_dict(
            settings
        )  # every value of its type before any is used (init_from, run_dir, cell_options)
        settings = {name: getattr(checked, name) for name in settings}
        if cell_opt:
            settings["cell_options"] = {**settings.get("cell_options", {}), **parse_key_values(cell_opt)}
        named = set(settings)  # given here or in the config file
        settings = settings_from_init(settings)
        restarted = run_to_go_on_with(settings)
        if restarted is not None:
            changes = {name: value for name, value in given.items() if name in RESUMABLE_SETTINGS}
            named_cell = settings.get("cell") if ":" in str(settings.get("cell", "")) else None
            trainer = Trainer.resume(restarted, cells=[named_cell] if named_cell else [], **changes)
        else:
            trainer = Trainer(new_run_inputs(TrainConfig.from_dict(settings), named))
    summary = trainer.fit()
    if trainer.world.is_main:  # under torchrun, rank 0 speaks for every process
        print_summary(summary)


def register(app: typer.Typer) -> None:
    app.command()(train)
