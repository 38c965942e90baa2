"""The registry of recurrent cells. Each family lives in its own module; registration is explicit."""

from charlm.cells.base import NoOptions, RecurrentCell, State, glorot_uniform_, uniform_all_
from charlm.cells.delta_rnn import DeltaRNN
from charlm.cells.elman import Elman
from charlm.cells.grid_lstm import GridLSTM
from charlm.cells.gru import GRU
from charlm.cells.high_order import HighOrderGRU, HighOrderLSTM
from charlm.cells.lru import LatticeRecurrentUnit, ProjectedStateLRU, ResetGateLRU
from charlm.cells.lstm import LSTM
from charlm.cells.mgu import MinimalGatedUnit
from charlm.cells.multiplicative import MultiplicativeRNN
from charlm.cells.registry import CellRegistry, parse_cell_options, parse_key_values
from charlm.cells.rhn import RecurrentHighwayNetwork
from charlm.cells.scrn import SCRN

CELLS = CellRegistry(
    [
        Elman,
        LSTM,
        GRU,
        MinimalGatedUnit,
        MultiplicativeRNN,
        SCRN,
        RecurrentHighwayNetwork,
        DeltaRNN,
        ProjectedStateLRU,
        ResetGateLRU,
        LatticeRecurrentUnit,
        GridLSTM,
        HighOrderLSTM,
        HighOrderGRU,
    ]
)

__all__ = [
    "CELLS",
    "CellRegistry",
    "NoOptions",
    "RecurrentCell",
    "State",
    "glorot_uniform_",
    "parse_cell_options",
    "parse_key_values",
    "uniform_all_",
]
