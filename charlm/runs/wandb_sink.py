"""An optional Weights & Biases sink for a run's records (`--wandb`, extra `charlm[wandb]`).

Every record's numbers are logged as ``EVENT/FIELD`` (as the TensorBoard sink names them),
together with ``step``, the optimizer step, which W&B's charts use as their x axis. The W&B run
is named after the run directory, its config is the run's ``config.json`` (``train`` and
``model``), and its id is kept in the run directory's ``wandb.json``, so a resumed run goes on
logging into the same W&B run. W&B's own settings apply: ``WANDB_MODE=offline`` logs to local
files only (``wandb sync`` uploads them later), ``WANDB_DIR`` says where those go.
"""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path

from charlm.errors import CharlmError
from charlm.files import atomic_write_text, read_own_file
from charlm.runs.tensorboard import _scalars as numeric_fields

EXTRA_HINT = "install the extra from charlm's clone: python3 -m pip install -e '.[wandb]' (or: pip install wandb)"
DEFAULT_PROJECT = "charlm"
RUN_ID_FILE = "wandb.json"


def check_available() -> None:
    """Fail before training starts, not after, if the extra is missing."""
    try:
        import wandb  # noqa: F401
    except ImportError:
        raise CharlmError(f"--wandb needs the wandb package: {EXTRA_HINT}") from None


def project_name(project: str | None) -> str:
    """``--wandb-project``, else ``$WANDB_PROJECT``, else ``charlm``."""
    return project or os.environ.get("WANDB_PROJECT") or DEFAULT_PROJECT


def stored_run(run_dir: Path) -> dict:
    """The W&B run (``id``, ``project``) an earlier session of this run logged to; {} if none."""
    try:
        stored = json.loads(read_own_file(run_dir / RUN_ID_FILE, "W&B run file").decode("utf-8"))
    except (CharlmError, ValueError, RecursionError):  # RecursionError: arrays nested thousands deep
        return {}
    return stored if isinstance(stored, dict) else {}


class WandbSink:
    """Logs every record of a run to one W&B run (the same one across resumptions)."""

    def __init__(self, run_dir: str | Path, config: dict, project: str | None = None, step: int = 0):
        """``step``: the optimizer step the run is at (records without a step of their own are
        logged at the last step seen)."""
        try:
            import wandb
        except ImportError:
            raise CharlmError(f"--wandb needs the wandb package: {EXTRA_HINT}") from None
        run_dir = Path(run_dir)
        stored = stored_run(run_dir)
        run_id = stored.get("id") or secrets.token_hex(4)  # W&B's form: 8 lowercase letters and digits
        project = project_name(project or stored.get("project"))  # a resumed run stays in its project
        atomic_write_text(run_dir / RUN_ID_FILE, json.dumps({"id": run_id, "project": project}) + "\n")
        try:
            self.run = wandb.init(
                project=project,
                name=run_dir.name,
                id=run_id,
                resume="allow",
                config=config,
                settings=wandb.Settings(console="off", quiet=True),
            )  # charlm's output stays as it is
        except Exception as error:  # no network, no login, a bad project name: one line, before training
            first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise CharlmError(
                f"--wandb: cannot start the W&B run ({first}); WANDB_MODE=offline logs without an account or a network"
            ) from None
        self.run.define_metric("*", step_metric="step")
        self.step = step

    def write(self, event: str, fields: dict) -> None:
        step = fields.get("step")
        if isinstance(step, int) and not isinstance(step, bool):
            self.step = step
        values = dict(numeric_fields(event, fields))
        if values:
            self.run.log({"step": self.step, **values})

    def close(self) -> None:
        self.run.finish()
