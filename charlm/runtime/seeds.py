"""The seed PyTorch is given for a charlm seed.

charlm takes any 64-bit integer as a seed, but PyTorch's CPU generator (a Mersenne Twister) keeps
only the low 32 bits of the seed it is given: seeds 5 and 5 + 2^32, or −1 and 2^63 − 1, would give
the same run. ``torch_seed`` passes seeds from 0 to 2^32 − 1 through unchanged (a run seeded so is
what it always was) and mixes every other seed down to 32 bits with splitmix64's finaliser, so that
two different seeds give the same run only by chance (about one pair in four billion).
"""

from __future__ import annotations

MASK64 = (1 << 64) - 1
SEED_RANGE = 1 << 32  # what the CPU generator keeps


def torch_seed(seed: int) -> int:
    """The 32-bit seed for ``torch.manual_seed``/``Generator.manual_seed`` that stands for ``seed``."""
    seed = int(seed)
    if 0 <= seed < SEED_RANGE:
        return seed
    mixed = (seed + 0x9E3779B97F4A7C15) & MASK64  # splitmix64: one step, then its finaliser
    mixed = ((mixed ^ (mixed >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    mixed = ((mixed ^ (mixed >> 27)) * 0x94D049BB133111EB) & MASK64
    mixed ^= mixed >> 31
    return (mixed ^ (mixed >> 32)) & (SEED_RANGE - 1)
