"""How torch's CPU threads wait between parallel operations, chosen before torch loads; and how
many there are (``--threads``, ``CHARLM_THREADS``: ``set_threads``).

PyTorch's CPU build runs its parallel operations on GNU OpenMP threads, which by default spin for
300,000 rounds waiting for the next operation before they sleep. A recurrent window is thousands
of short operations, so the threads never sleep: on an idle machine that costs nothing, but two
such processes on the same cores (two trainings, a sweep's shards, a training and an evaluation)
spin against each other and slow each other down many times over. Measured on the 2-core CI
machine with two `charlm bench --cells gru` (1M parameters, batch 250 × 50, 2 threads) at once,
each process's gru trained at 5,100-5,700 chars/s (34,000 alone), evaluated at 23,000 and
sampled at 900-1,150; with a spin count of 1,000, 14,000-14,800, 42,000 and 3,300 (with one
thread each, 16,700-17,300, 50,000 and 3,400). Alone, `charlm bench --cells gru,lru,rhn` trained
at the same speed with either count (gru 32.6-34.6k, lru 26.9k, rhn 22.6-23.2k chars/s), where
a count of 0 (OpenMP's passive policy) was 9-11 % slower.

GNU OpenMP reads the setting once, when torch is imported, so charlm sets it when charlm itself
is imported (the command line imports it first), and only where the user has set neither
``GOMP_SPINCOUNT`` nor ``OMP_WAIT_POLICY``.
"""

from __future__ import annotations

import os

from charlm.errors import CharlmError

SPIN_COUNT = "1000"


def wait_briefly_for_work(environment=os.environ) -> None:
    """Shorten OpenMP's busy-waiting to ``SPIN_COUNT`` rounds unless the user chose a policy."""
    if "GOMP_SPINCOUNT" not in environment and "OMP_WAIT_POLICY" not in environment:
        environment["GOMP_SPINCOUNT"] = SPIN_COUNT


MAX_THREADS = 1024  # torch starts every thread it is given: more than any machine's cores is a mistake


def set_threads(count: int, name: str = "--threads") -> None:
    """torch's CPU threads (``--threads``, or ``CHARLM_THREADS`` as ``name``): from 1 to ``MAX_THREADS``,
    checked here, so that a count beyond torch's own integers is one line, not an overflow inside torch."""
    if isinstance(count, bool) or not isinstance(count, int):
        raise CharlmError(f"{name} must be a whole number, not {count!r}")
    if not 1 <= count <= MAX_THREADS:
        raise CharlmError(
            f"{name} must be at least 1, not {count}"
            if count < 1
            else f"{name} must be at most {MAX_THREADS}, not {count}"
        )
    import torch

    torch.set_num_threads(count)
