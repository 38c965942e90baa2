"""Every cell and option variant the cell tests run over, with its per-layer parameter formula.

``params(d, n)`` is the count cells.md gives for one layer with input size d and hidden size n.
``input_size(n)`` is None when the cell accepts any input size, else the one it needs.
"""

from dataclasses import dataclass, field
from typing import Callable


@dataclass(frozen=True)
class CellCase:
    cell: str
    options: dict = field(default_factory=dict)
    params: Callable[[int, int], int] | None = None
    input_size: Callable[[int], int] | None = None

    @property
    def id(self) -> str:
        suffix = ",".join(f"{k}={v}" for k, v in self.options.items())
        return f"{self.cell}[{suffix}]" if suffix else self.cell


def same(n):
    return n


CASES = [
    CellCase("lstm", {}, lambda d, n: 4 * (d * n + n * n + n)),
    CellCase("lstm", {"peephole": True}, lambda d, n: 4 * (d * n + n * n + n) + 3 * n),
    CellCase("gru", {}, lambda d, n: 3 * (d * n + n * n + n)),
    CellCase("gru", {"reset_after": True}, lambda d, n: 3 * (d * n + n * n + n) + n),
    CellCase("ps-lru", {}, lambda d, n: 8 * n * n + 4 * n, same),
    CellCase("rg-lru", {}, lambda d, n: 10 * n * n + 5 * n, same),
    CellCase("lru", {}, lambda d, n: 12 * n * n + 6 * n, same),
    CellCase("lru", {"init": "uniform"}, lambda d, n: 12 * n * n + 6 * n, same),
]
