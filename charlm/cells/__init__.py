"""The registry of recurrent cells. Each family lives in its own module; registration is explicit."""

from charlm.cells.base import NoOptions, RecurrentCell, State, glorot_uniform_, uniform_all_
from charlm.cells.gru import GRU
from charlm.cells.lru import LatticeRecurrentUnit, ProjectedStateLRU, ResetGateLRU
from charlm.cells.lstm import LSTM
from charlm.cells.registry import CellRegistry, cell_options_dict, parse_cell_options, parse_key_values

CELLS = CellRegistry(
    [
        LSTM,
        GRU,
        ProjectedStateLRU,
        ResetGateLRU,
        LatticeRecurrentUnit,
    ]
)

__all__ = [
    "CELLS",
    "CellRegistry",
    "NoOptions",
    "RecurrentCell",
    "State",
    "cell_options_dict",
    "glorot_uniform_",
    "parse_cell_options",
    "parse_key_values",
    "uniform_all_",
]
