"""An optional TensorBoard sink for a run's records (`--tensorboard`, extra `charlm[tensorboard]`)."""

from __future__ import annotations

import numbers
from pathlib import Path

from charlm.errors import CharlmError

EXTRA_HINT = (
    "install the extra from charlm's clone: python3 -m pip install -e '.[tensorboard]' (or: pip install tensorboard)"
)


class TensorBoardSink:
    """Writes every numeric field of every record as a scalar ``EVENT/FIELD`` (nested dicts such as
    the per-layer gradient norms become ``EVENT/FIELD/KEY``), at the record's optimizer step."""

    def __init__(self, log_dir: str | Path):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise CharlmError(f"--tensorboard needs the tensorboard package: {EXTRA_HINT}") from None
        self.writer = SummaryWriter(log_dir=str(log_dir))

    def write(self, event: str, fields: dict) -> None:
        step = fields.get("step")
        if not isinstance(step, int):
            step = fields.get("epoch") if isinstance(fields.get("epoch"), int) else 0
        for tag, value in _scalars(event, fields):
            self.writer.add_scalar(tag, value, global_step=step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


def check_available() -> None:
    """Fail before training starts, not after, if the extra is missing."""
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        raise CharlmError(f"--tensorboard needs the tensorboard package: {EXTRA_HINT}") from None


def _scalars(prefix: str, fields: dict):
    for key, value in fields.items():
        if key in ("event", "time", "schema", "step"):
            continue
        if isinstance(value, bool) or value is None:
            continue
        if isinstance(value, numbers.Real):
            yield f"{prefix}/{key}", float(value)
        elif isinstance(value, dict):
            yield from _scalars(f"{prefix}/{key}", value)
