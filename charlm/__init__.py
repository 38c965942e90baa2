"""charlm: character-level language modelling with recurrent networks.

import charlm
summary = charlm.train(charlm.TrainConfig(corpus="pydoc", cell="lru", hidden_size=128, epochs=1))
model = charlm.load(summary["run_dir"])
model.sample("The ", length=100)
model.score("Some text.").bpc
"""

from charlm.lazy import lazy_attribute

from charlm.runtime.openmp import wait_briefly_for_work

wait_briefly_for_work()  # before anything imports torch: OpenMP reads it once (see charlm.runtime.openmp)

__version__ = "0.3.0"

_EXPORTS = {
    "load": "charlm.api",
    "Model": "charlm.api",
    "TextScore": "charlm.api",
    "train": "charlm.api",
    "Trainer": "charlm.training.trainer",
    "TrainConfig": "charlm.config",
    "SampleConfig": "charlm.config_inference",
    "DynamicOptions": "charlm.config_inference",
    "Checkpoint": "charlm.checkpoint",
    "Run": "charlm.runs.directory",
    "CharlmError": "charlm.errors",
    "TaskConfig": "charlm.tasks.config",
    "train_task": "charlm.tasks.training",
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name):  # the heavy modules (torch) load on first use, not on `import charlm`
    return lazy_attribute(__name__, _EXPORTS, name)
