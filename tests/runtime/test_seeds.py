"""Every 64-bit seed is its own run: PyTorch's CPU generator keeps 32 bits of a seed, charlm mixes
the rest in (``charlm.runtime.seeds``)."""

from __future__ import annotations

import pytest
import torch

from charlm.runtime.seeds import torch_seed

INT64_MAX = 2**63 - 1


def test_torch_itself_keeps_only_32_bits_of_a_seed():
    """Why the mapping exists. Should a later PyTorch keep all 64 bits, this fails: the mapping would
    still be harmless, but no longer needed."""
    low, high = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5 + 2**32)
    assert torch.equal(torch.rand(4, generator=low), torch.rand(4, generator=high))


@pytest.mark.parametrize("seed", [0, 1, 1234, 2**32 - 1])
def test_seeds_torch_keeps_whole_pass_unchanged(seed):
    assert torch_seed(seed) == seed  # runs seeded from 0 to 2^32 - 1 are what they always were


@pytest.mark.parametrize("seeds", [(5, 5 + 2**32), (-1, INT64_MAX), (0, 2**32), (-(2**63), 0), (2**32 - 1, -1)])
def test_seeds_that_differ_only_above_32_bits_or_in_sign_are_different_runs(seeds):
    mapped = [torch_seed(seed) for seed in seeds]
    assert mapped[0] != mapped[1] and all(0 <= value < 2**32 for value in mapped)
    draws = [torch.rand(4, generator=torch.Generator().manual_seed(value)) for value in mapped]
    assert not torch.equal(*draws)


def test_a_thousand_large_seeds_map_to_a_thousand_torch_seeds():
    seeds = [2**32 + k * 2**32 for k in range(500)] + [-(k + 1) for k in range(500)]
    assert len({torch_seed(seed) for seed in seeds}) == 1000


def test_samples_seeded_5_and_5_plus_2_to_the_32_differ(trained_run):
    import charlm

    model = charlm.load(trained_run, device="cpu")
    texts = [model.sample("The ", length=40, seed=seed) for seed in (5, 5 + 2**32, 5)]
    assert texts[0] == texts[2] and texts[0] != texts[1]
