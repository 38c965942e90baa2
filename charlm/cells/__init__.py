"""The registry of recurrent cells. Each family lives in its own module; registration is explicit:
one line of ``BUILT_IN`` per cell.

The cells' names are declared here (``CELL_NAMES``) and the rest loads on first use (``CELLS``,
``RecurrentCell``, ...): the command line completes ``--cell`` and prints its help without
importing torch. Building ``CELLS`` checks that each name is that of the class registered under it.
"""

from charlm.lazy import lazy_attribute

import importlib
import threading

# The built-in cells, in the order `charlm cells` lists them: name → the module (in charlm.cells) and class.
BUILT_IN = {
    "rnn": "elman:Elman",
    "lstm": "lstm:LSTM",
    "gru": "gru:GRU",
    "mgu": "mgu:MinimalGatedUnit",
    "mi-rnn": "multiplicative:MultiplicativeRNN",
    "scrn": "scrn:SCRN",
    "rhn": "rhn:RecurrentHighwayNetwork",
    "delta-rnn": "delta_rnn:DeltaRNN",
    "ps-lru": "lru:ProjectedStateLRU",
    "rg-lru": "lru:ResetGateLRU",
    "lru": "lru:LatticeRecurrentUnit",
    "grid-lstm": "grid_lstm:GridLSTM",
    "ho-lstm": "high_order:HighOrderLSTM",
    "ho-gru": "high_order:HighOrderGRU",
    "qrnn": "qrnn:QRNN",
    "sru": "sru:SRU",
    "indrnn": "indrnn:IndRNN",
    "linear-ru": "linear_ru:LinearRU",
    "hgrn": "hgrn:HGRN",
    "mingru": "min_rnn:MinGRU",
    "minlstm": "min_rnn:MinLSTM",
    "griffin-rglru": "rglru:GriffinRGLRU",
    "transformer": "transformer:TransformerBlock",
    "mamba": "mamba:Mamba",
    "mlstm": "mlstm:MLSTM",
    "slstm": "slstm:SLSTM",
    "gated-deltanet": "gated_deltanet:GatedDeltaNet",
}
CELL_NAMES = tuple(BUILT_IN)

_EXPORTS = {
    "CellRegistry": "charlm.cells.registry",
    "parse_cell_options": "charlm.cells.registry",
    "parse_key_values": "charlm.cells.registry",
    "NoOptions": "charlm.cells.base",
    "RecurrentCell": "charlm.cells.base",
    "ScanCell": "charlm.cells.scan_cell",
    "State": "charlm.cells.base",
    "glorot_uniform_": "charlm.cells.base",
    "uniform_all_": "charlm.cells.base",
}

__all__ = ["CELLS", "CELL_NAMES", *_EXPORTS]

_BUILDING = threading.Lock()


def _registered_cells():
    from charlm.cells.registry import CellRegistry

    classes = []
    for name, reference in BUILT_IN.items():
        module, _, class_name = reference.partition(":")
        cell = getattr(importlib.import_module(f"{__name__}.{module}"), class_name)
        if cell.name != name:
            raise RuntimeError(f"charlm.cells.BUILT_IN names {reference} {name!r}, but its class says {cell.name!r}")
        classes.append(cell)
    return CellRegistry(classes)


def __getattr__(name):  # torch loads on first use, not on `import charlm.cells`
    if name == "CELLS":
        with _BUILDING:  # one registry, also when two threads ask at once
            if "CELLS" not in globals():
                globals()["CELLS"] = _registered_cells()
        return globals()["CELLS"]
    return lazy_attribute(__name__, _EXPORTS, name)
