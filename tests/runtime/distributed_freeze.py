"""Worker for tests/runtime/test_distributed_timeout.py: `charlm train` under torchrun where the
process of rank 1 freezes (sleeps far past --dist-timeout) at its first training step.

Usage (under torchrun): distributed_freeze.py CHARLM_TRAIN_ARGUMENTS...
"""

import os
import sys
import time

from charlm.cli.app import run
from charlm.training.step import TrainingStep

if os.environ.get("RANK") == "1":

    def frozen(self, *args, **kwargs):
        time.sleep(600)  # a frozen process: alive, holding its connections, answering nothing

    TrainingStep.__call__ = frozen

sys.exit(run(["train", *sys.argv[1:]]))
