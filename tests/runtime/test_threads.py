"""OpenMP's busy-waiting is shortened before torch loads, unless the user chose a policy."""

from __future__ import annotations

import os
import subprocess
import sys

from charlm.runtime.openmp import SPIN_COUNT, wait_briefly_for_work
from helpers import REPO


def test_the_spin_count_is_set_only_where_the_user_chose_no_policy():
    unset = {}
    wait_briefly_for_work(unset)
    assert unset == {"GOMP_SPINCOUNT": SPIN_COUNT}
    for chosen in ({"GOMP_SPINCOUNT": "300000"}, {"OMP_WAIT_POLICY": "ACTIVE"}):
        environment = dict(chosen)
        wait_briefly_for_work(environment)
        assert environment == chosen


def test_importing_charlm_sets_it_before_torch_is_loaded():
    environment = {
        name: value for name, value in os.environ.items() if name not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")
    }
    script = "import os, sys, charlm; print(os.environ['GOMP_SPINCOUNT'], 'torch' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=environment, cwd=REPO, check=True
    )
    assert result.stdout.split() == [SPIN_COUNT, "False"]
