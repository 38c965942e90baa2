"""The rendered --help of each command states its defaults (rich markup must not swallow them)."""

import pytest

from charlm.config import TrainConfig
from helpers import run_cli


def rendered_help(command: str) -> str:
    result = run_cli(command, "--help", env={"COLUMNS": "400", "NO_COLOR": "1"}, check_code=0)
    return " ".join(result.stdout.split())


def test_train_help_shows_every_training_default():
    text = rendered_help("train")
    defaults = TrainConfig()
    for name in ("corpus", "cell", "layers", "batch_size", "bptt", "lr", "lr_decay", "epochs", "patience", "clip",
                 "seed", "eval_batch_size", "log_every"):
        assert f"(default: {getattr(defaults, name)})" in text, name
    assert "(default: $CHARLM_DATA or ./data)" in text
    assert "(default: runs/CORPUS-CELL-TIME)" in text


@pytest.mark.parametrize("command, fragment", [
    ("sample", "(default: a line break)"),
    ("demo", "(default: runs/pydoc-lru-demo-TIME)"),
    ("prepare", "(default: error; unk for pydoc)"),
])
def test_other_commands_show_their_defaults(command, fragment):
    assert fragment in rendered_help(command)
