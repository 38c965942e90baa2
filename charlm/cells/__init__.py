"""The registry of recurrent cells. Each family lives in its own module; registration is explicit.

The cells' names are declared here (``CELL_NAMES``) and the rest loads on first use (``CELLS``,
``RecurrentCell``, ...): the command line completes ``--cell`` and prints its help without
importing torch. Building ``CELLS`` checks that the names are those of the classes registered.
"""

from charlm.lazy import lazy_attribute

import threading

# The registered cells, in the order `charlm cells` lists them.
CELL_NAMES = (
    "rnn",
    "lstm",
    "gru",
    "mgu",
    "mi-rnn",
    "scrn",
    "rhn",
    "delta-rnn",
    "ps-lru",
    "rg-lru",
    "lru",
    "grid-lstm",
    "ho-lstm",
    "ho-gru",
    "qrnn",
    "sru",
    "indrnn",
    "linear-ru",
    "hgrn",
    "mingru",
    "minlstm",
    "griffin-rglru",
    "transformer",
    "mamba",
    "mlstm",
    "slstm",
    "gated-deltanet",
)

_EXPORTS = {
    "CellRegistry": "charlm.cells.registry",
    "parse_cell_options": "charlm.cells.registry",
    "parse_key_values": "charlm.cells.registry",
    "NoOptions": "charlm.cells.base",
    "RecurrentCell": "charlm.cells.base",
    "State": "charlm.cells.base",
    "glorot_uniform_": "charlm.cells.base",
    "uniform_all_": "charlm.cells.base",
}

__all__ = ["CELLS", "CELL_NAMES", *_EXPORTS]

_BUILDING = threading.Lock()


def _registered_cells():
    from charlm.cells.delta_rnn import DeltaRNN
    from charlm.cells.elman import Elman
    from charlm.cells.grid_lstm import GridLSTM
    from charlm.cells.gru import GRU
    from charlm.cells.high_order import HighOrderGRU, HighOrderLSTM
    from charlm.cells.lru import LatticeRecurrentUnit, ProjectedStateLRU, ResetGateLRU
    from charlm.cells.lstm import LSTM
    from charlm.cells.mgu import MinimalGatedUnit
    from charlm.cells.multiplicative import MultiplicativeRNN
    from charlm.cells.registry import CellRegistry
    from charlm.cells.rhn import RecurrentHighwayNetwork
    from charlm.cells.scrn import SCRN
    from charlm.cells.qrnn import QRNN
    from charlm.cells.sru import SRU
    from charlm.cells.indrnn import IndRNN
    from charlm.cells.linear_ru import LinearRU
    from charlm.cells.hgrn import HGRN
    from charlm.cells.min_rnn import MinGRU, MinLSTM
    from charlm.cells.rglru import GriffinRGLRU
    from charlm.cells.transformer import TransformerBlock
    from charlm.cells.mamba import Mamba
    from charlm.cells.mlstm import MLSTM
    from charlm.cells.slstm import SLSTM
    from charlm.cells.gated_deltanet import GatedDeltaNet

    cells = CellRegistry(
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
            QRNN,
            SRU,
            IndRNN,
            LinearRU,
            HGRN,
            MinGRU,
            MinLSTM,
            GriffinRGLRU,
            TransformerBlock,
            Mamba,
            MLSTM,
            SLSTM,
            GatedDeltaNet,
        ]
    )
    if tuple(cells.names()) != CELL_NAMES:
        raise RuntimeError(
            f"charlm.cells.CELL_NAMES {CELL_NAMES} differs from the cells registered {tuple(cells.names())}"
        )
    return cells


def __getattr__(name):  # torch loads on first use, not on `import charlm.cells`
    if name == "CELLS":
        with _BUILDING:  # one registry, also when two threads ask at once
            if "CELLS" not in globals():
                globals()["CELLS"] = _registered_cells()
        return globals()["CELLS"]
    return lazy_attribute(__name__, _EXPORTS, name)
