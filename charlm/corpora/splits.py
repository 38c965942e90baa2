"""The train / valid / test split of a corpus that comes as one text."""

import math
from fractions import Fraction

from charlm.errors import CharlmError

SPLITS = ("train", "valid", "test")
DEFAULT_FRACTIONS = (0.9, 0.05, 0.05)


def parse_fractions(text: str) -> tuple[float, float, float]:
    """``"0.9,0.05,0.05"`` → ``(0.9, 0.05, 0.05)``, checked by ``check_fractions``."""
    try:
        fractions = tuple(float(part) for part in text.split(","))
    except ValueError:
        raise CharlmError(f"--split wants three fractions like 0.9,0.05,0.05, not {text!r}") from None
    return check_fractions(fractions)


def check_fractions(fractions) -> tuple[float, float, float]:
    fractions = tuple(float(f) for f in fractions)
    if len(fractions) != 3 or not all(f > 0 for f in fractions) or not abs(sum(fractions) - 1) <= 1e-9:  # nan: neither
        raise CharlmError(f"--split wants three positive fractions that sum to 1 (train,valid,test), not {fractions}")
    return fractions


def split_sizes(length: int, fractions) -> tuple[int, int, int]:
    """Contiguous split sizes: valid and test get ``ceil(length * fraction)``, train the rest.

    With 90/5/5 this is the Lattice Recurrent Unit paper's rule: War and Peace's 3,196,212 characters
    give 2,876,590 / 159,811 / 159,811, and 100,000,000 give 90M / 5M / 5M.
    """
    _, valid, test = (math.ceil(Fraction(str(f)) * length) for f in fractions)
    sizes = (length - valid - test, valid, test)
    if min(sizes) <= 0:
        raise CharlmError(f"a text of {length:,} symbols is too short to split {fractions}: sizes {sizes}")
    return sizes


def split_contiguous(sequence, fractions) -> dict:
    """``sequence`` (str, bytes or memoryview) cut into contiguous train, valid and test parts."""
    train, valid, _ = split_sizes(len(sequence), fractions)
    bounds = (0, train, train + valid, len(sequence))
    return {name: sequence[bounds[i] : bounds[i + 1]] for i, name in enumerate(SPLITS)}


def describe_fractions(fractions) -> str:
    """``(0.9, 0.05, 0.05)`` → ``"90/5/5"``."""
    return "/".join(f"{100 * f:g}" for f in fractions)
