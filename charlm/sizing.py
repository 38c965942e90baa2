"""Sizing a model to a parameter budget (``--params``): a budget read as a count (``1M``) or as the size
of a reference model (``lstm@100``), and the hidden size whose model comes closest to it, counted on
models built on the meta device."""

from __future__ import annotations

import dataclasses
import math
import re

import torch

from charlm.cells import CELLS, parse_cell_options
from charlm.errors import CharlmError
from charlm.model import LanguageModel, ModelConfig, count_parameters


def parse_budget(text: str) -> int:
    """``"10M"``, ``"2.5e6"``, ``"800k"`` → a parameter count."""
    scale = {"k": 1e3, "m": 1e6, "g": 1e9}
    cleaned = text.strip().lower().replace("_", "").replace(",", "")
    try:
        if cleaned and cleaned[-1] in scale:
            value = float(cleaned[:-1]) * scale[cleaned[-1]]
        else:
            value = float(cleaned)
    except ValueError:
        raise CharlmError(f"parameter budget {text!r} is not a number like 1M, 2.5e6 or 800k") from None
    if not math.isfinite(value):
        raise CharlmError(f"parameter budget {text!r} is not a finite number")
    if value < 1:  # 1e-3 is positive, but no model has a thousandth of a parameter
        raise CharlmError(f"parameter budget {text!r} must be at least 1 parameter")
    return int(round(value))


REFERENCE_BUDGET = re.compile(r"^(?P<cell>[\w.:-]+?)(\[(?P<options>[^\]]*)\])?@(?P<hidden>-?\d+)$")


def budget_of(text: str, config: ModelConfig) -> int:
    """A parameter budget given as a count (``"1M"``) or as the size of a reference model:
    ``"lstm@100"`` is the parameter count of an LSTM of 100 hidden units with ``config``'s vocabulary,
    layers and embedding (how the Delta-RNN paper's Table 2 sizes its models), and
    ``"lstm[peephole=full]@100"`` the same with cell options."""
    match = REFERENCE_BUDGET.match(text.strip())
    if match is None:
        return parse_budget(text)
    hidden_size = int(match["hidden"])
    if hidden_size < 1:
        raise CharlmError(f"parameter budget {text!r}: the reference model needs at least one hidden unit")
    from charlm.cells import parse_key_values

    cell_class = CELLS.get(match["cell"])
    options = parse_key_values([pair for pair in (match["options"] or "").split(",") if pair.strip()])
    parse_cell_options(cell_class, options)  # refuses an unknown or malformed option now
    reference = dataclasses.replace(config, cell=match["cell"], hidden_size=hidden_size, cell_options=options)
    with torch.device("meta"):
        return count_parameters(LanguageModel(reference, cell_class))


_META_COUNTS: dict[tuple, int] = {}  # a sweep sizes many points of one configuration at the same sizes


def _meta_count(key: str, config: ModelConfig, cell_class) -> int:
    """The parameter count of ``config``'s model, built on the meta device (``key``: the config's
    repr, which stands for it in the cache: a config holds a dict and cannot be hashed)."""
    if (key, cell_class) not in _META_COUNTS:
        if len(_META_COUNTS) > 4096:
            _META_COUNTS.clear()
        with torch.device("meta"):
            _META_COUNTS[key, cell_class] = count_parameters(LanguageModel(config, cell_class))
    return _META_COUNTS[key, cell_class]


def _closest_size(count, budget: int, low: int, high: int) -> int:
    """The size in [low, high] whose ``count`` (rising with the size) is closest to ``budget``, the
    smaller on a tie, by bisection: ``count(low) < budget <= count(high)`` unless at an end."""
    while high - low > 1:
        middle = (low + high) // 2
        if count(middle) < budget:
            low = middle
        else:
            high = middle
    return min((low, high), key=lambda size: abs(count(size) - budget))


def _solve_quadratic_count(total, budget: int, max_hidden_size: int) -> int | None:
    """The hidden size closest to ``budget`` when the parameter count is a quadratic in it (every
    built-in cell's is, at fixed depth and embedding): fitted from three real counts, checked on a
    fourth, and the answer checked by real counts on both sides; None where any check fails (SCRN's
    context width n // 10, a user's cell), and the caller searches instead."""
    points = [64, 128, 256, 512]
    if max_hidden_size < points[-1]:
        return None
    (x0, x1, x2), (y0, y1, y2) = points[:3], [total(x) for x in points[:3]]
    # Newton's divided differences, exact in fractions: count(n) = y0 + d1 (n - x0) + d2 (n - x0)(n - x1)
    from fractions import Fraction

    d1 = Fraction(y1 - y0, x1 - x0)
    d2 = (Fraction(y2 - y1, x2 - x1) - d1) / (x2 - x0)

    def fitted(n: int) -> Fraction:
        return y0 + d1 * (n - x0) + d2 * (n - x0) * (n - x1)

    if fitted(points[3]) != total(points[3]):
        return None
    if fitted(max_hidden_size) < budget or d2 < 0:
        return None
    best = _closest_size(fitted, budget, 1, max_hidden_size)  # the fitted count rises on [1, max]: no models built
    neighbours = [n for n in (best - 1, best, best + 1) if 1 <= n <= max_hidden_size]
    if any(total(n) != fitted(n) for n in neighbours):
        return None
    return best


def size_for_budget(config: ModelConfig, budget: int, max_hidden_size: int = 16384, cell_class=None) -> tuple[int, int]:
    """The hidden size whose total parameter count is closest to ``budget``, and that count.

    Counts are taken from models built on the meta device, so every cell, tied and two-stream
    ones and a user's own included, is sized by what it really allocates.
    """

    resolved = cell_class or CELLS.get(config.cell)
    multiple = max(1, resolved.hidden_size_multiple(parse_cell_options(resolved, config.cell_options)))
    largest = max_hidden_size // multiple  # sizes are counted in units of the multiple the cell is built at

    def total(units: int) -> int:
        sized = dataclasses.replace(config, hidden_size=units * multiple)
        return _meta_count(repr(sized), sized, cell_class)

    if largest < 1:
        raise CharlmError(f"cell {config.cell!r} needs a hidden size that is a multiple of {multiple}")
    solved = _solve_quadratic_count(total, budget, largest)
    if solved is not None:
        return solved * multiple, total(solved)
    if total(largest) < budget:
        raise CharlmError(
            f"a parameter budget of {budget:,} is beyond the largest model charlm sizes "
            f"(hidden {largest * multiple:,}: {total(largest):,} parameters)"
        )
    low, high = 1, 1
    while total(high) < budget and high < largest:
        low, high = high, min(high * 2, largest)
    best = _closest_size(total, budget, low, high)
    return best * multiple, total(best)
