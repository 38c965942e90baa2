"""The Grid LSTM paper's algorithmic tasks: memorization, addition and parity (`charlm task`)."""

from charlm.tasks.data import TASKS, Addition, Memorization, Parity, TaskBatch, make_task
from charlm.tasks.models import DepthLSTM, FeedForward, build_task_model
from charlm.tasks.training import THRESHOLDS, TaskConfig, train_task

__all__ = ["TASKS", "THRESHOLDS", "Addition", "DepthLSTM", "FeedForward", "Memorization", "Parity", "TaskBatch",
           "TaskConfig", "build_task_model", "make_task", "train_task"]
