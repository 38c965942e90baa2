"""Worker for tests/test_distributed.py: one process of a torchrun training in float64.

Usage (under torchrun): distributed_train.py SETTINGS_JSON, where the settings are TrainConfig
fields, or {"resume": RUN_DIR, ...changes} to resume a run.
"""

import json
import sys

import torch

torch.set_default_dtype(torch.float64)

from charlm.config import TrainConfig  # noqa: E402
from charlm.training.trainer import Trainer  # noqa: E402

settings = json.loads(sys.argv[1])
resume = settings.pop("resume", None)
trainer = Trainer.resume(resume, **settings) if resume else Trainer(TrainConfig(**settings))
trainer.fit()
