"""The Grid LSTM paper's algorithmic tasks: memorization, addition and parity (`charlm task`).

The names below load on first use: ``TaskConfig`` (``charlm.tasks.config``) and the tasks' sizes
(``charlm.tasks.data``) are read without torch, for ``charlm task --help``."""

from charlm.lazy import lazy_attribute

_EXPORTS = {
    "TASKS": "charlm.tasks.data",
    "Addition": "charlm.tasks.data",
    "Memorization": "charlm.tasks.data",
    "Parity": "charlm.tasks.data",
    "TaskBatch": "charlm.tasks.data",
    "make_task": "charlm.tasks.data",
    "DepthLSTM": "charlm.tasks.models",
    "FeedForward": "charlm.tasks.models",
    "build_task_model": "charlm.tasks.models",
    "TaskConfig": "charlm.tasks.config",
    "THRESHOLDS": "charlm.tasks.training",
    "train_task": "charlm.tasks.training",
}

__all__ = [
    "TASKS",
    "THRESHOLDS",
    "Addition",
    "DepthLSTM",
    "FeedForward",
    "Memorization",
    "Parity",
    "TaskBatch",
    "TaskConfig",
    "build_task_model",
    "make_task",
    "train_task",
]


def __getattr__(name):
    return lazy_attribute(__name__, _EXPORTS, name)
